"""The few collectives the plugin runs itself, each naming its operation when it fails.

Pure ``torch.distributed``: no Lightning here. With one process (or no process group) every
collective returns this rank's own value, so the planning code runs unchanged in a single
process.
"""

import atexit
import gc
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist

__all__ = [
    "Collectives",
    "add_note",
    "destroy_at_exit",
    "is_mean",
    "is_timeout",
    "weighted_mean_",
]

_destroy_registered = False


def _destroy_process_group() -> None:
    # objects in reference cycles (a trainer, its strategy, an FSDP2 module's state) may hold
    # a collective's work and its tensors: freed now, while the interpreter can still run
    # their destructors, not in its finalization, where gloo's may abort the process
    gc.collect()
    if dist.is_available() and dist.is_initialized():
        dist.destroy_process_group()


def destroy_at_exit() -> None:
    """Destroy the default process group when the interpreter exits, once per process.

    Lightning does this for NCCL only. A gloo group left to the interpreter's finalization can
    abort the process ("terminate called without an active exception", SIGABRT) after a
    successful run, because gloo's threads still hold tensors then; destroying the group while
    the interpreter is alive avoids it. A no-op when the program destroyed the group itself.
    """
    global _destroy_registered
    if not _destroy_registered:
        atexit.register(_destroy_process_group)
        _destroy_registered = True


def add_note(error: BaseException, note: str) -> None:
    """Attach ``note`` to ``error``'s message (``add_note`` where Python has it), once: an
    error passing through nested calls (a recursion, say) gets it one time."""
    if note in getattr(error, "__notes__", ()) or (error.args and note in str(error.args[0])):
        return
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10
        error.args = (f"{error.args[0] if error.args else ''}\n{note}", *error.args[1:])


def is_timeout(error: BaseException) -> bool:
    """Whether ``error`` reports a timeout (gloo, NCCL and RPC only say so in their text)."""
    text = str(error).lower()
    return "timed out" in text or "timeout" in text


def is_mean(reduce_op: Any) -> bool:
    """Whether ``reduce_op`` (a name or a ``ReduceOp``) asks for a mean."""
    if isinstance(reduce_op, str):
        return reduce_op.lower() in ("mean", "avg")
    return reduce_op == dist.ReduceOp.AVG


def weighted_mean_(tensor: torch.Tensor, weight: float, group: Any = None) -> torch.Tensor:
    """Replace ``tensor`` in place by ``sum_k w_k v_k / sum_k w_k`` over the ranks of
    ``group``, with ``weight`` this rank's ``w_k``; one all-reduce."""
    values = tensor.detach().reshape(-1) * weight
    packed = torch.cat([values, tensor.new_full((1,), weight)])
    dist.all_reduce(packed, group=group)  # [sum w_k v_k, sum w_k]
    return tensor.copy_((packed[:-1] / packed[-1]).view_as(tensor))


def _is_peer_gone(error: BaseException) -> bool:
    text = str(error).lower()
    return "connection closed" in text or "connection reset" in text


# torch 2.13 renamed all_gather_into_tensor (kept, deprecated) to all_gather_single; the
# package declares torch>=2.3, which has only the old name
_ALL_GATHER_SINGLE = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor


@dataclass(frozen=True)
class Collectives:
    """One rank's view of the default process group.

    Args:
        rank: this process's global rank.
        world_size: number of ranks.
        device: where tensors for the collectives live (the rank's root device: gloo takes
            CPU tensors, NCCL CUDA ones).
        timeout: the process group's timeout, named in a timed-out collective's error.
    """

    rank: int
    world_size: int
    device: torch.device
    timeout: timedelta | None = None

    @property
    def distributed(self) -> bool:
        """Whether there are other ranks to talk to."""
        return dist.is_available() and dist.is_initialized() and self.world_size > 1

    def gather_rows(self, values: Sequence[float]) -> list[list[float]]:
        """All-gather one row of floats per rank; returns the rows in rank order."""
        if not self.distributed:
            return [[float(v) for v in values]]
        if not values:
            return [[] for _ in range(self.world_size)]
        return self.start_gather_rows(values)()

    def start_gather_rows(self, values: Sequence[float]) -> Callable[[], list[list[float]]]:
        """Start ``gather_rows`` without waiting for the other ranks: the returned function
        waits for it and returns the rows. Every rank must start its collectives in the same
        order; it may run others before it waits (the process group runs them in the order
        they were started)."""
        if not self.distributed or not values:
            rows = self.gather_rows(values)
            return lambda: rows
        tensor = torch.tensor([float(v) for v in values], dtype=torch.float64, device=self.device)
        # into one packed tensor, copied to the host once: not a tensor and a copy per rank
        packed = torch.empty(self.world_size * len(tensor), dtype=tensor.dtype, device=self.device)
        work = _ALL_GATHER_SINGLE(packed, tensor, async_op=True)

        def rows() -> list[list[float]]:
            work.wait()
            return packed.view(self.world_size, -1).cpu().tolist()

        return rows

    def gather_objects(self, value: Any) -> list[Any]:
        """All-gather one picklable object per rank; returns them in rank order."""
        if not self.distributed:
            return [value]
        values: list[Any] = [None] * self.world_size
        dist.all_gather_object(values, value)
        return values

    def broadcast_ints(self, values: Sequence[int]) -> list[int]:
        """Rank 0's integers, on every rank."""
        tensor = torch.tensor([int(v) for v in values], dtype=torch.int64)
        if self.device.type == "cuda":
            tensor = tensor.to(self.device)
        if self.distributed:
            dist.broadcast(tensor, src=0)
        return [int(v) for v in tensor.tolist()]

    def any(self, flag: bool) -> bool:
        """Whether ``flag`` is true on any rank."""
        tensor = torch.tensor([float(flag)], device=self.device)
        if self.distributed:
            dist.all_reduce(tensor, op=dist.ReduceOp.MAX)
        return bool(tensor.item())

    def broadcast_objects(self, values: list[Any]) -> list[Any]:
        """Rank 0's picklable objects, on every rank (``values`` is filled in place)."""
        if self.distributed:
            dist.broadcast_object_list(values, src=0)
        return values

    def broadcast_tensor(self, tensor: torch.Tensor) -> None:
        """Overwrite ``tensor`` with rank 0's, in place."""
        if self.distributed:
            dist.broadcast(tensor, src=0)

    @contextmanager
    def guarded(self, operation: str) -> Iterator[None]:
        """Run a collective; if it fails, the error says which operation on which rank.

        A timed-out collective's note also names the ``timeout`` option, a closed connection's
        says that a peer stopped first (once, where guards are nested; each guard names its
        operation).
        """
        try:
            yield
        except Exception as err:
            note = f"hetero: {operation} failed on rank {self.rank}."
            seen = getattr(err, "_hetero_noted", False)
            if not seen and is_timeout(err):
                note += (
                    f" Some rank did not join it within the collective timeout ({self.timeout},"
                    " the strategy's `timeout` option): a rank that hangs or dies stops the"
                    " others after that long. Resume from the last checkpoint with"
                    " `trainer.fit(..., ckpt_path=...)`."
                )
            elif not seen and _is_peer_gone(err):
                note += (
                    " A peer rank stopped first (it failed, was killed or timed out): see its log."
                )
            add_note(err, note)
            err._hetero_noted = True  # type: ignore[attr-defined]
            raise
