"""The parameter server of ``mode="async"`` (paper 002, Algorithm 2) and its RPC plumbing.

The server lives in rank 0's process. It owns a CPU copy of the trained parameters and a
copy of each of the user's optimizers, and applies every pushed gradient as soon as it
arrives, one push at a time, with the learning rate scaled by the pushing rank's batch
share ``b_k / B`` (paper 002 Eq. 5b) for SGD; for adaptive optimizers by a factor between
``b_k / B`` and ``sqrt(b_k / B)`` set by the measured gradient noise (``NoiseScale``).
With SGD and momentum a push returns the parameters moved ahead by the momentum of the
updates expected before the rank's next push (``lookahead``), so each gradient is taken
about where it will be applied.
Workers reach it through ``torch.distributed.rpc`` (TensorPipe); rank 0's own worker calls
it directly. RPC requests run on the RPC agent's threads, so the server keeps serving while
rank 0's training loop is busy.
"""

import copy
import ipaddress
import math
import os
import socket
import threading
import time
import warnings
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc
from torch.optim import Optimizer

from lightning_hetero._optim import (
    NoiseScale,
    check_epoch_average,
    check_lookahead,
    has_momentum,
    lookahead_factor,
    lr_factor,
    lr_rule,
    optimizer_params,
    scaled_lr,
    second_moment_decay,
)
from lightning_hetero.collectives import add_note, is_timeout

__all__ = [
    "RPC_PORT_ENV",
    "ParameterServer",
    "PushResult",
    "ServerClient",
    "free_port",
    "rpc_port",
    "worker_name",
]

#: The degree of ``epoch_average``'s polynomial-decay average: the ``n``-th push's parameters
#: enter with weight ``min(1, 3 / n)``, so push ``i`` of ``n`` weighs about ``(i / n) ** 2``
#: (measured in the digits simulation with SGD and momentum: degrees 2, 3 and 5 keep every
#: seed within 1.4 points of DDP; 1, the epoch's plain mean, lags and ends up to 2.2 below).
AVERAGE_DEGREE = 3.0

#: Weight of the newest staleness in a rank's moving average (the lookahead's prediction).
_RECENT = 0.3

#: The environment variable that sets the TCP port of the parameter server's RPC rendezvous
#: (on rank 0, at the job's main address); default: the job's main port + 1.
RPC_PORT_ENV = "HETERO_RPC_PORT"


@dataclass
class PushResult:
    """What a push returns: the server's parameters after the update, and their version."""

    params: list[torch.Tensor]
    version: int


@dataclass
class _RankCounters:
    updates: int = 0
    staleness_sum: int = 0
    staleness_max: int = 0
    #: Seconds the server spent applying the rank's pushes (lock held, waiting excluded).
    apply_s: float = 0.0


@dataclass
class _RankRecent:
    """What the lookahead predicts from: one rank's recent pushes to one optimizer."""

    #: Moving average of the other ranks' pushes between two of this rank's, from
    #: ``world_size - 1`` (every other rank pushes once, as with equal speeds).
    between: float
    #: The slot's push count right after this rank's last push (``None``: none yet).
    after: int | None = None
    #: The learning-rate factor (batch share under the rule, times any update factor) of the
    #: rank's last push.
    factor: float | None = None


@dataclass
class _Slot:
    """One of the user's optimizers on the server, with the parameters it steps."""

    optimizer: Optimizer
    params: list[torch.Tensor] = field(default_factory=list)
    #: How a push's batch share scales its learning rate: "linear", "sqrt", "noise" or "none".
    rule: str = "linear"
    #: The "noise" rule's measurement of the pushed gradients (``None`` under other rules).
    noise: NoiseScale | None = None
    #: Whether pushes get their parameters back moved ahead by the expected momentum.
    lookahead: bool = False
    #: Pushes applied to this optimizer, and each rank's recent ones (for the lookahead).
    pushes: int = 0
    recent: list[_RankRecent] = field(default_factory=list)
    #: Whether the epoch's end replaces the parameters with their average (``settle``).
    averaging: bool = False
    #: The polynomial-decay average of the parameters since the last ``settle``, and the
    #: number of pushes it holds.
    average: list[torch.Tensor] | None = None
    averaged: int = 0


def _to_cpu(optimizer: Optimizer) -> None:
    for group in optimizer.param_groups:
        for param in group["params"]:
            param.data = param.data.cpu()
            if param.grad is not None:
                param.grad = None
    for state in optimizer.state.values():
        for key, value in state.items():
            if isinstance(value, torch.Tensor):
                state[key] = value.cpu()


class ParameterServer:
    """A parameter server for asynchronous SGD with batch-share learning-rate scaling.

    Args:
        optimizers: the user's optimizers on rank 0 (after any checkpoint was restored);
            each is deep-copied with its parameters and state, onto the CPU.
        world_size: number of workers.
        lr_scaling: how each update's learning rate follows the pushing rank's batch share
            ``b_k / B``: ``"auto"`` (``"noise"`` for adaptive optimizers, else ``"linear"``),
            ``"linear"`` (``True``), ``"sqrt"``, ``"noise"`` (between the two by the measured
            gradient noise, ``NoiseScale``), or ``"none"`` (``False``: every push with the
            full learning rate, for ablations); see ``lr_rule``.
        lookahead: whether a push returns the parameters moved ahead by the momentum the
            server will apply before the rank's next push arrives (``lookahead_factor``),
            so its next gradient is taken about where it will be applied: ``"auto"`` (where
            the optimizer has heavy-ball momentum, ``has_momentum``), ``True`` (refused for
            an optimizer without it) or ``False``. ``pull`` always returns the parameters
            themselves.

    Pushes are serialized by a lock: an update is applied whole or not at all, and a
    push that arrives while another is applied waits for it.
    """

    def __init__(
        self,
        optimizers: Sequence[Optimizer],
        world_size: int,
        lr_scaling: bool | str = "auto",
        lookahead: bool | str = "auto",
        epoch_average: bool | str = "auto",
    ) -> None:
        self.lr_scaling = lr_scaling
        self.world_size = world_size
        self.version = 0
        self._lock = threading.Lock()
        self._slots: list[_Slot] = []
        check_lookahead(lookahead, optimizers)
        check_epoch_average(epoch_average)
        for optimizer in optimizers:
            clone = copy.deepcopy(optimizer)
            _to_cpu(clone)
            rule = lr_rule(lr_scaling, optimizer, measured=True)
            noise = None
            if rule == "noise":
                noise = NoiseScale(moment_decay=second_moment_decay(clone))
            momentum = has_momentum(clone)
            ahead = lookahead is not False and momentum
            recent = [_RankRecent(between=world_size - 1.0) for _ in range(world_size)]
            averaging = epoch_average is True or (epoch_average == "auto" and momentum)
            self._slots.append(
                _Slot(
                    clone,
                    optimizer_params(clone),
                    rule,
                    noise,
                    ahead,
                    recent=recent,
                    averaging=averaging,
                )
            )
        self._counters = [_RankCounters() for _ in range(world_size)]
        #: Seconds spent applying the pushes of ranks other than 0. They run on the RPC agent's
        #: threads in rank 0's process, beside rank 0's own training: rank 0 leaves them out
        #: of its step times, which would otherwise make it look slower than it is.
        self.serving_s = 0.0
        self._epoch_counters = [_RankCounters() for _ in range(world_size)]

    # ---------------------------------------------------------------- requests
    def push(
        self,
        rank: int,
        index: int,
        grads: Sequence[torch.Tensor | None],
        batch_size: int,
        global_batch_size: int,
        lrs: Sequence[float],
        seen_version: int,
        update_factor: float = 1.0,
    ) -> PushResult:
        """Apply rank ``rank``'s gradient to optimizer ``index``'s parameters.

        ``grads`` are the mean gradients over the rank's ``batch_size`` samples (``None``
        for parameters without one), ``lrs`` the learning rate of each of the rank's
        parameter groups (its LR schedulers keep setting them), and ``seen_version`` the
        version of the parameters the gradient was computed on; the difference to the
        server's version is the update's staleness. ``update_factor`` further scales the
        update's learning rate (dual batch size learning's model-update factor).
        The learning rate is ``lr * update_factor * lr_factor(rule, batch_size /
        global_batch_size)`` with the optimizer's rule (``lr_factor``; under ``"noise"``, the
        factor ``NoiseScale`` measures from the pushes so far, this one included).
        """
        slot = self._slot(index)
        if len(grads) != len(slot.params):
            raise ValueError(
                f"rank {rank} pushed {len(grads)} gradients for optimizer {index}, which steps"
                f" {len(slot.params)} parameters."
            )
        groups = slot.optimizer.param_groups
        if len(lrs) != len(groups):
            raise ValueError(
                f"rank {rank} sent {len(lrs)} learning rates for {len(groups)} parameter groups."
            )
        if not 0 < batch_size <= global_batch_size:
            raise ValueError(
                f"rank {rank} pushed a batch of {batch_size} out of a global batch of"
                f" {global_batch_size}."
            )
        if not (math.isfinite(update_factor) and update_factor > 0):
            raise ValueError(f"rank {rank} pushed an update factor of {update_factor}.")
        with self._lock:
            began = time.perf_counter()
            share = self._share(slot, grads, batch_size, global_batch_size) * update_factor
            for param, grad in zip(slot.params, grads):
                param.grad = None if grad is None else grad.to(param.device, param.dtype)
            for group, lr in zip(groups, lrs):
                group["lr"] = lr  # the schedule's value, kept in the saved state
            try:
                with scaled_lr(slot.optimizer, share):
                    slot.optimizer.step()
            finally:
                for param in slot.params:
                    param.grad = None
            staleness = max(self.version - seen_version, 0)
            self.version += 1
            for counters in (self._counters[rank], self._epoch_counters[rank]):
                counters.updates += 1
                counters.staleness_sum += staleness
                counters.staleness_max = max(counters.staleness_max, staleness)
            recent = slot.recent[rank]
            if recent.after is not None:  # the other ranks' pushes since this rank's last
                recent.between += _RECENT * (slot.pushes - recent.after - recent.between)
            slot.pushes += 1
            recent.after, recent.factor = slot.pushes, share
            if slot.averaging:
                self._accumulate(slot)
            params = [p.detach().clone() for p in slot.params]
            if slot.lookahead:
                self._look_ahead(slot, rank, params)
            result = PushResult(params, self.version)
            spent = time.perf_counter() - began
            self._epoch_counters[rank].apply_s += spent
            if rank != 0:
                self.serving_s += spent
            return result

    @staticmethod
    def _accumulate(slot: _Slot) -> None:
        """Fold the parameters after a push into the slot's average (under the lock): the
        ``n``-th push since the last ``settle`` enters with weight ``min(1, AVERAGE_DEGREE / n)``,
        so the pushes' weights grow as ``(i / n) ** (AVERAGE_DEGREE - 1)`` and the average sits
        in the epoch's last part without knowing how many pushes the epoch has."""
        slot.averaged += 1
        params = [p.detach() for p in slot.params]
        if slot.average is None:
            slot.average = [p.clone() for p in params]
        else:
            weight = min(1.0, AVERAGE_DEGREE / slot.averaged)
            for average, param in zip(slot.average, params):
                average.lerp_(param, weight)

    def settle(self) -> bool:
        """Replace the parameters of every averaging optimizer by their average over the pushes
        since the last call (``epoch_average``), and start a new one. Returns whether any
        parameters changed (then the version moves on, so a rank's next gradient counts as
        taken on older parameters). The optimizers' states (momentum) are kept."""
        changed = False
        with self._lock:
            for slot in self._slots:
                if slot.average is None:
                    continue
                with torch.no_grad():
                    for param, average in zip(slot.params, slot.average):
                        param.copy_(average)
                slot.average, slot.averaged, changed = None, 0, True
            if changed:
                self.version += 1
        return changed

    def _look_ahead(self, slot: _Slot, rank: int, params: list[torch.Tensor]) -> None:
        """Move ``params`` (rank ``rank``'s copy, in place) by the momentum part of the
        updates expected before its next push: as many as the other ranks' pushes between
        its recent ones, each at their last learning-rate factors' mean (under the lock)."""
        between = slot.recent[rank].between
        others = [r.factor for k, r in enumerate(slot.recent) if k != rank and r.factor]
        if not others or not between:
            return  # nothing will be applied in between, or nothing is known yet
        factor = sum(others) / len(others)
        state = slot.optimizer.state
        copies = iter(params)  # slot.params' order: the groups' parameters, group by group
        for group in slot.optimizer.param_groups:
            scale = lookahead_factor(group, between) * float(group["lr"]) * factor
            for param, copied in zip(group["params"], copies):
                buffer = state.get(param, {}).get("momentum_buffer")
                if scale and buffer is not None:
                    copied.sub_(buffer, alpha=scale)

    @staticmethod
    def _share(
        slot: _Slot,
        grads: Sequence[torch.Tensor | None],
        batch_size: int,
        global_batch_size: int,
    ) -> float:
        """The learning-rate factor of a push under the slot's rule (under the lock: the
        ``"noise"`` rule counts the push's gradients first)."""
        if slot.noise is None:
            return lr_factor(slot.rule, batch_size / global_batch_size)
        slot.noise.observe(grads, batch_size, global_batch_size)
        return slot.noise.factor(batch_size / global_batch_size)

    def pull(self, index: int) -> PushResult:
        """The current parameters of optimizer ``index`` and their version."""
        slot = self._slot(index)
        with self._lock:
            return PushResult([p.detach().clone() for p in slot.params], self.version)

    def _slot(self, index: int) -> _Slot:
        if not 0 <= index < len(self._slots):
            raise IndexError(f"the server holds {len(self._slots)} optimizers, not {index + 1}.")
        return self._slots[index]

    # ---------------------------------------------------------------- state
    def optimizer_state(self, index: int) -> dict[str, Any]:
        """The state dict of the server's copy of optimizer ``index``."""
        with self._lock:
            return copy.deepcopy(self._slot(index).optimizer.state_dict())

    @property
    def rules(self) -> list[str]:
        """The learning-rate scaling rule of each optimizer (``"linear"``, ``"sqrt"``,
        ``"noise"``, ``"none"``)."""
        return [slot.rule for slot in self._slots]

    @property
    def updates(self) -> list[int]:
        """Updates applied per rank since the server started."""
        return [c.updates for c in self._counters]

    def take_epoch_stats(self) -> dict[str, list[float]]:
        """Per-rank update counts, mean/max staleness and the seconds the server spent
        applying the rank's pushes (``apply_s``: rank 0's own on its training thread, the
        others' on the RPC agent's threads of rank 0's process) since the last call; resets
        them."""
        with self._lock:
            counters, self._epoch_counters = (
                self._epoch_counters,
                [_RankCounters() for _ in range(self.world_size)],
            )
        return {
            "updates": [float(c.updates) for c in counters],
            "staleness": [c.staleness_sum / c.updates if c.updates else 0.0 for c in counters],
            "staleness_max": [float(c.staleness_max) for c in counters],
            "apply_s": [c.apply_s for c in counters],
        }


# -------------------------------------------------------------------- RPC plumbing
#: The server of this process (rank 0 only), reached by the module-level RPC targets.
_SERVER: ParameterServer | None = None
_RPC_UP = False  # whether this process has joined the RPC group


def _server() -> ParameterServer:
    if _SERVER is None:
        raise RuntimeError("hetero: this process hosts no parameter server.")
    return _SERVER


def _remote_push(*args: Any) -> PushResult:
    return _server().push(*args)


def _remote_pull(index: int) -> PushResult:
    return _server().pull(index)


def _remote_ping() -> bool:
    return True


def _remote_echo(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return tensors


def worker_name(rank: int) -> str:
    """The RPC name of rank ``rank``."""
    return f"hetero{rank}"


def free_port(host: str) -> int:
    """A TCP port on ``host`` that nothing listens on right now."""
    with socket.socket() as sock:
        sock.bind((host, 0))
        return int(sock.getsockname()[1])


def _usable_rpc_port(host: str, main_port: int) -> int:
    """Rank 0's RPC rendezvous port: ``rpc_port``'s, if this process can listen on it now;
    else, where every rank runs on this host (a loopback ``host``) and ``HETERO_RPC_PORT``
    is not set, a free one; else minus the busy port. A rank that waited for a rendezvous
    rank 0 cannot serve would wait out torch's 30-minute default; rank 0 itself would
    fail, or reach a store of an earlier run still listening there."""
    port = rpc_port(main_port)
    if _can_listen(port):
        return port
    if not _named_rpc_port() and _is_loopback(host):
        return free_port(host)
    return -port


def _can_listen(port: int) -> bool:
    """Whether a server socket can bind ``port`` on every interface now (as a TCPStore
    does, with ``SO_REUSEADDR``)."""
    with socket.socket() as sock:
        sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        try:
            sock.bind(("", port))
        except OSError:
            return False
        return True


def _is_loopback(host: str) -> bool:
    try:
        return ipaddress.ip_address(socket.gethostbyname(host)).is_loopback
    except (OSError, ValueError):
        return False


def _named_rpc_port(environ: Mapping[str, str] | None = None) -> str:
    """``HETERO_RPC_PORT`` as set in ``environ`` (default: the process's), ``""`` if unset."""
    return (os.environ if environ is None else environ).get(RPC_PORT_ENV, "").strip()


def rpc_port(main_port: int, environ: Mapping[str, str] | None = None) -> int:
    """The port of the parameter server's RPC rendezvous: ``HETERO_RPC_PORT`` if set, else
    ``main_port + 1`` (the job's ``MASTER_PORT`` + 1), never a random one across hosts, so
    that a firewall can let exactly the job's ports through (``_usable_rpc_port`` replaces a
    busy one only where every rank runs on one host).

    Examples:
        >>> rpc_port(29500, environ={})
        29501
        >>> rpc_port(29500, environ={"HETERO_RPC_PORT": "40123"})
        40123
    """
    value = _named_rpc_port(environ)
    if not value:
        port = main_port + 1
        if not 0 < port < 65536:
            raise ValueError(
                f"The job's main port is {main_port}, so the parameter server's default RPC port"
                f" {port} is no TCP port; set {RPC_PORT_ENV} to a free port on the main node."
            )
        return port
    try:
        port = int(value)
    except ValueError:
        port = -1
    if not 0 < port < 65536:
        raise ValueError(
            f"{RPC_PORT_ENV}={value!r} is no TCP port: set it to a free port from 1 to 65535 on"
            " the main node (MASTER_ADDR), or unset it to use MASTER_PORT + 1."
        )
    return port


class ServerClient:
    """How a worker talks to the server: directly on rank 0, over RPC elsewhere.

    Args:
        rank: this worker's global rank.
        timeout: seconds an RPC may take before it fails with an error naming the rank
            and the request.
    """

    def __init__(self, rank: int, timeout: float) -> None:
        self.rank = rank
        self.timeout = timeout

    @staticmethod
    def init_rpc(rank: int, world_size: int, host: str, timeout: float, main_port: int) -> None:
        """Join the RPC group, whose rendezvous rank 0 serves at ``host`` (the job's main
        address) on ``rpc_port`` of ``main_port``, as rank 0 reads it (broadcast over the
        process group, so only rank 0's ``HETERO_RPC_PORT`` counts)."""
        port = [_usable_rpc_port(host, main_port) if rank == 0 else None]
        dist.broadcast_object_list(port, src=0)
        if port[0] < 0:  # rank 0 cannot listen there: every rank says so now, none waits
            raise RuntimeError(
                f"hetero: rank {rank}: port {-port[0]} on {host}, where the parameter server's"
                " RPC rendezvous listens (MASTER_PORT + 1, or"
                f" {RPC_PORT_ENV}), is in use on the main node. Set {RPC_PORT_ENV} to a free"
                " port there that the job's nodes can reach."
            )
        options = rpc.TensorPipeRpcBackendOptions(
            init_method=f"tcp://{host}:{port[0]}", rpc_timeout=timeout
        )
        global _RPC_UP
        try:
            with warnings.catch_warnings():
                # torch's TensorPipe agent gathers the workers' device maps over a gloo
                # backend of its own, which its `all_gather_object` then calls deprecated
                # ("You are using a Backend ... as a ProcessGroup"): torch's internals, not
                # something a caller can change; once per rank on every async run
                warnings.filterwarnings("ignore", "You are using a Backend", UserWarning)
                rpc.init_rpc(
                    worker_name(rank), rank=rank, world_size=world_size, rpc_backend_options=options
                )
        except RuntimeError as err:
            add_note(
                err,
                f"hetero: rank {rank}: the parameter server's RPC rendezvous at {host}:{port[0]}"
                f" failed. Rank 0 listens there (MASTER_ADDR, port {RPC_PORT_ENV} or"
                " MASTER_PORT + 1): make sure that port is free on the main node and open"
                f" between the job's nodes, or set {RPC_PORT_ENV} to one that is.",
            )
            raise
        _RPC_UP = True

    @staticmethod
    def start_server(server: ParameterServer) -> None:
        global _SERVER
        _SERVER = server

    @staticmethod
    def stop_server() -> None:
        global _SERVER
        _SERVER = None

    def _call(self, what: str, function: Any, *args: Any) -> Any:
        if self.rank == 0:
            return function(*args)
        try:
            return rpc.rpc_sync(worker_name(0), function, args=args, timeout=self.timeout)
        except RuntimeError as err:
            if is_timeout(err):
                raise RuntimeError(
                    f"hetero: rank {self.rank}: the parameter server (rank 0) did not answer a"
                    f" {what} within rpc_timeout={self.timeout:g} s. Raise `rpc_timeout` if the"
                    " server is just slow; otherwise rank 0 has stopped."
                ) from err
            raise RuntimeError(
                f"hetero: rank {self.rank}: a {what} to the parameter server (rank 0) failed: {err}"
            ) from err

    def push(self, *args: Any) -> PushResult:
        """``ParameterServer.push`` on the server."""
        return self._call("push", _remote_push, self.rank, *args)

    def pull(self, index: int) -> PushResult:
        """``ParameterServer.pull`` on the server."""
        return self._call("pull", _remote_pull, index)

    def echo(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """Send ``tensors`` to rank 0 and back: a push's round trip, before the server runs."""
        return self._call("echo", _remote_echo, tensors)

    def unreachable(self, ranks: Sequence[int], timeout: float = 5.0) -> list[int]:
        """Which of ``ranks`` do not answer a ping within ``timeout`` seconds."""
        missing, futures = [], {}
        for rank in ranks:
            if rank == self.rank:
                continue
            try:
                futures[rank] = rpc.rpc_async(worker_name(rank), _remote_ping, timeout=timeout)
            except Exception:  # e.g. the agent already lost the connection
                missing.append(rank)
        for rank, future in futures.items():
            try:
                future.wait()
            except Exception:
                missing.append(rank)
        return sorted(missing)

    @staticmethod
    def shutdown(graceful: bool, timeout: timedelta = timedelta(seconds=60)) -> None:
        """Leave the RPC group; ``graceful`` waits for every rank's outstanding requests."""
        global _RPC_UP
        if _RPC_UP:
            _RPC_UP = False
            rpc.shutdown(graceful=graceful, timeout=timeout.total_seconds())
