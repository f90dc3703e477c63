"""Time that an FSDP2 rank spends blocked in collectives, FSDP's and others' (pure torch).

Under FSDP2 (``torch.distributed.fsdp.fully_shard``) every rank meets the others inside
the step: the all-gathers before each group's forward and backward, and the
reduce-scatters after each group's backward. A fast rank therefore waits for the slowest
*inside* its step, so the step's wall time is the same on every rank. To know what a rank
itself costs, subtract the time it sat in those collectives:

    compute_s = step wall time - CollectiveWaitMeter.take()

Anything outside FSDP's collectives (forward and backward kernels, the loss, a sleep
between forward and backward, the optimizer step) stays compute.

How it is measured
------------------
FSDP2 keeps one ``FSDPParamGroup`` per ``fully_shard`` call and does all its
communication in four of that object's methods; ``CollectiveWaitMeter.install``
shadows them **on the instances** (an attribute on each group object, never the class),
so only the module it was given is measured and ``remove``
restores the originals exactly:

``FSDPParamGroup.unshard(async_op=False)``
    issues the parameter all-gather (``foreach_all_gather``). With the default
    ``async_op=False`` the collective runs synchronously, so on CPU/gloo this call
    blocks until every rank has joined the all-gather. Also reached through forward and
    backward prefetching (``FSDPParamGroup._prefetch_unshard``) and ``FSDPModule.unshard``.
``FSDPParamGroup.wait_for_unshard()``
    copies the all-gather output into the parameters (``foreach_all_gather_copy_out``);
    after an ``async_op=True`` unshard it calls ``Work.wait()`` here, and on an
    accelerator the compute stream waits on the all-gather's event here.
``FSDPParamGroup.post_backward()``
    runs once a group's gradients are computed: reduce-scatter copy-in, the
    reduce-scatter (``foreach_reduce``; synchronous, so it blocks on CPU/gloo until every
    rank has produced this group's gradients), and the sharded-gradient copy-out.
``FSDPParamGroup.finalize_backward()``
    called from ``FSDPState._root_post_backward_final_callback`` at the end of the last
    backward; on an accelerator the compute stream waits here for the outstanding
    reduce-scatters. On CPU it does not block.

``FSDPState._root_post_backward_final_callback`` (site ``root_post_backward``)
    FSDP's end-of-backward callback: runs the ``post_backward`` of groups whose inputs
    needed no gradient (token ids) and ``finalize_backward``; on an accelerator the compute
    stream waits here for the last reduce-scatters. Wrapped on every state (FSDP queues
    the callback of whichever state's pre-backward hook fires first).

Waits at their source (``collectives=True``, the default): every ``torch.distributed``
collective is waited on through ``Work.wait`` (a synchronous call waits on its own work in
Python, on gloo as on NCCL) or, for functional collectives (DTensor: the gradient norm of
``clip_grad_norm_``), ``_functional_collectives.wait_tensor``. While a meter is installed
both are replaced by timing versions that measure the waits of the thread that installed it
(and any wait inside a wrapped method), and restored after the last meter is removed. So a
collective that is not FSDP's (an all-reduce of your own, Lightning's per-step SIGTERM
broadcast) counts as wait too. Each call goes to one *site*: a wrapped method, or
``wait:<function that waited>``; a site holds its own time, the calls measured inside it
going to theirs, so the sites add up to the time blocked (``WaitStats.by_site``).

These four names exist with these meanings in every FSDP2 release. Checked by reading
the source of: an early FSDP2 snapshot (``torch/distributed/_composable/fsdp``, the
2.3/2.4 era, CUDA-only events), a later snapshot of the same path (device handles,
``state._fsdp_param_group``), and the installed torch 2.13
(``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``, ``state._fsdp_param_groups``);
FSDP2 itself calls them only through the instance (``self.unshard(...)``,
``target_group.unshard(...)``, ``group.post_backward()``, ``group.finalize_backward()``), so
an instance attribute intercepts every call. The groups are found by duck typing, no FSDP
class is imported: ``module._get_fsdp_state()`` (an ``FSDPModule`` method in every
release) and then ``state._fsdp_param_groups`` (a list, newer releases incl. 2.13) or
``state._fsdp_param_group`` (one group or ``None``, the older snapshots). Running on
CPU/gloo needs a torch whose FSDP2 uses device handles rather than ``torch.cuda`` events
(not the earliest snapshot; tested on 2.13).

What the time includes: besides waiting for the slowest rank, the collective's own
transfer time and FSDP's small local copies around it (all-gather copy-in/copy-out,
reduce-scatter copy-in, gradient division and copy-out). Those scale with the number of
parameters, not with the batch, and are the same on every rank, so they belong to
"communication", not to this rank's compute.

Clocks
------
``clock="host"`` (the default on CPU) times each call with ``time.perf_counter``: on
CPU + gloo every collective blocks the calling thread, so this is exact. ``clock="device"``
(the default when the groups live on CUDA/XPU/... with timing events) records a timing
event on the current (compute) stream before and after each call and sums
``start.elapsed_time(end)``: there FSDP's collectives run on their own streams and the
*host* never blocks on them, but the compute stream stalls inside ``wait_for_unshard``
(waiting for the all-gather event), ``post_backward`` (waiting for an older
reduce-scatter) and ``finalize_backward`` (waiting for the last reduce-scatters); the
event pair brackets exactly that stall plus the copies. ``take`` then has to read
the events: it waits for them to complete (``synchronize=True``, the default) or leaves
incomplete ones for the next call. The device path was written against torch's event API
but has not been run on a multi-GPU FSDP job here.

Failure
-------
The meter never breaks training. If a module has no FSDP2 state, or a group lacks one of
the methods (a torch release that renamed them), ``install`` warns
(``FSDPWaitMeterWarning``) and measures what it can (possibly nothing: ``take`` then
returns ``0.0``, i.e. "no wait measured", and ``compute = wall``). Errors in the meter's own
bookkeeping are swallowed after one warning; errors raised by FSDP itself propagate
unchanged. It measures eager FSDP2; with ``torch.compile`` tracing FSDP's hooks
(compiled autograd, traceable FSDP2) these methods may be inlined into a graph, and what
is measured then has not been checked.

Gradient reduction (measured with torch 2.13, gloo, 3 ranks): by default FSDP2
reduce-scatters with ``ReduceOp.AVG``, i.e. the gradients are divided by the world size,
on gloo too. ``FSDPModule.set_gradient_divide_factor(factor: float) -> None`` exists
(``set_reduce_scatter_divide_factor`` is its deprecated alias) but, for fp32/bf16, turns
into ``ReduceOp.PREMUL_SUM(1/factor)`` (unless ``factor`` equals the world size), which gloo
rejects in backward ("Cannot use ReduceOp.PREMUL_SUM with Gloo"); combine it with
``set_force_sum_reduction_for_comms(True)`` to get ``SUM`` then a division by ``factor``
(``factor=1.0``: a plain sum, e.g. of losses pre-scaled by ``b_k / B``).

Thread safety: backward hooks can run on an autograd worker thread (accelerators), so
the totals are guarded by a lock; nested calls (one measured call inside another, on the
same thread) count once: on the host clock each site keeps its own part, on the device
clock the outermost call keeps all of it.
"""

from __future__ import annotations

import logging
import sys
import threading
import time
import warnings
from collections.abc import Callable, Iterable, Iterator
from contextlib import AbstractContextManager, contextmanager
from dataclasses import dataclass, field
from typing import Any, Literal

import torch
from lightning_utilities.core.rank_zero import rank_zero_only
from torch import nn

__all__ = [
    "STATE_METHODS",
    "WAIT_METHODS",
    "CollectiveWaitMeter",
    "FSDPWaitMeterWarning",
    "WaitStats",
    "fsdp_param_groups",
]

#: The ``FSDPParamGroup`` methods that contain FSDP2's collective waits.
WAIT_METHODS: tuple[str, ...] = (
    "unshard",
    "wait_for_unshard",
    "post_backward",
    "finalize_backward",
)

#: The root ``FSDPState`` methods timed as a site of their own (name -> site).
STATE_METHODS: dict[str, str] = {"_root_post_backward_final_callback": "root_post_backward"}


class FSDPWaitMeterWarning(UserWarning):
    """FSDP2's internals are not where ``CollectiveWaitMeter`` expects them."""


@dataclass
class WaitStats:
    """What ``CollectiveWaitMeter.take_stats`` returns for one interval (a step).

    Attributes:
        wait_s: seconds blocked in collectives (FSDP's and, with ``collectives=True``, any
            other waited on by this thread).
        by_site: the same split by site, each site's own time (what a site calls that is
            itself measured goes to that site): the wrapped methods (``"unshard"``,
            ``"wait_for_unshard"``, ``"post_backward"``, ``"finalize_backward"``,
            ``"root_post_backward"``: FSDP's copies around the collectives, stream waits)
            and ``"wait:<caller>"`` for each ``torch.distributed`` work waited on, named by
            the function that waited (``"wait:all_gather_into_tensor"``,
            ``"wait:reduce_scatter_tensor"``, ``"wait:broadcast"``, ``"wait:all_reduce"``,
            ``"wait:foreach_all_gather_copy_out"``, ...) or ``"wait:functional"`` (a
            functional collective's ``wait_tensor``, e.g. DTensor's gradient norm).
            ``wait_s`` is their sum. On the device clock only outermost calls are timed,
            so a site holds what it called.
        calls: measured outermost calls.
        grads_ready_at: ``time.perf_counter()`` when the *last* ``post_backward`` of the
            interval started: this rank's last local gradients exist and it enters the
            final reduce-scatter (``None`` if no backward ran). Unlike DDP this is *not*
            a compute mark: the earlier groups' collectives already made every rank wait
            for the slowest, so the mark falls at about the same moment on all ranks
            (measured: within 1 ms on 3 ranks whose compute differed by 150 ms). Use
            ``wall - wait_s`` for compute. Do not also open a "ready until backward end"
            wait segment from it: the final reduce-scatter is already in ``wait_s``.
    """

    wait_s: float = 0.0
    by_site: dict[str, float] = field(default_factory=dict)
    calls: int = 0
    grads_ready_at: float | None = None


def fsdp_param_groups(module: nn.Module) -> list[Any]:
    """Every FSDP2 parameter group under ``module`` (itself included), each once.

    Finds ``FSDPModule`` instances by their ``_get_fsdp_state`` method, then reads
    ``state._fsdp_param_groups`` (a list, newer torch) or ``state._fsdp_param_group`` (older).
    """
    groups: list[Any] = []
    seen: set[int] = set()
    for sub in module.modules():
        get_state = getattr(sub, "_get_fsdp_state", None)
        if not callable(get_state):
            continue
        try:
            state = get_state()
        except Exception:  # not an FSDP module after all
            continue
        if hasattr(state, "_fsdp_param_groups"):
            found = list(state._fsdp_param_groups or [])
        else:
            single = getattr(state, "_fsdp_param_group", None)
            found = [single] if single is not None else []
        for group in found:
            if id(group) not in seen:
                seen.add(id(group))
                groups.append(group)
    return groups


def _fsdp_states(module: nn.Module) -> list[Any]:
    """The FSDP2 states (``FSDPState``) of the modules under ``module``, each once."""
    states: list[Any] = []
    for sub in module.modules():
        get_state = getattr(sub, "_get_fsdp_state", None)
        try:
            state = get_state() if callable(get_state) else None
        except Exception:
            state = None
        if state is not None and all(state is not seen for seen in states):
            states.append(state)
    return states


# ---------------------------------------------------------------- waits at their source
# Every torch.distributed collective is waited on through ``Work.wait`` (a synchronous call
# waits on its work in Python, on gloo and NCCL alike) or, for functional collectives
# (DTensor), ``wait_tensor``. While a meter with ``collectives=True`` is installed both are
# replaced by the timing versions below; the originals are restored after the last meter.
_SOURCES_LOCK = threading.Lock()
_SOURCE_METERS: list[CollectiveWaitMeter] = []
_SOURCE_ORIGINALS: dict[str, Callable[..., Any]] = {}


def _source_targets() -> list[tuple[Any, str, str, Callable[..., Any]]]:
    """(owner, attribute, key, timing replacement) of each source patched."""
    import torch.distributed as dist

    targets: list[tuple[Any, str, str, Callable[..., Any]]] = []
    work = getattr(getattr(dist, "distributed_c10d", None), "Work", None)
    if work is not None and callable(getattr(work, "wait", None)):
        targets.append((work, "wait", "Work.wait", _timed_work_wait))
    try:
        import torch.distributed._functional_collectives as functional
    except Exception:  # pragma: no cover - every supported torch has it
        functional = None
    if functional is not None and callable(getattr(functional, "wait_tensor", None)):
        targets.append((functional, "wait_tensor", "wait_tensor", _timed_wait_tensor))
    return targets


def _attach_sources(meter: CollectiveWaitMeter) -> None:
    with _SOURCES_LOCK:
        _SOURCE_METERS.append(meter)
        if len(_SOURCE_METERS) > 1:
            return
        try:
            if not torch.distributed.is_available():
                return
            for owner, name, key, replacement in _source_targets():
                _SOURCE_ORIGINALS[key] = getattr(owner, name)
                setattr(owner, name, replacement)
        except Exception as err:  # never break training
            meter._warn(f"cannot time collective waits at their source ({err!r}).")


def _detach_sources(meter: CollectiveWaitMeter) -> None:
    with _SOURCES_LOCK:
        if meter in _SOURCE_METERS:
            _SOURCE_METERS.remove(meter)
        if _SOURCE_METERS or not _SOURCE_ORIGINALS:
            return
        try:
            for owner, name, key, replacement in _source_targets():
                original = _SOURCE_ORIGINALS.get(key)  # kept: a call under way still needs it
                if original is not None and getattr(owner, name, None) is replacement:
                    setattr(owner, name, original)
        except Exception:
            pass


def _through_meters(site: str, key: str, args: tuple, kwargs: dict) -> Any:
    call: Callable[..., Any] = _SOURCE_ORIGINALS[key]
    for meter in [m for m in list(_SOURCE_METERS) if m._waits_here()]:
        call = _bound_timed(meter, site, call)
    return call(*args, **kwargs)


def _bound_timed(meter: CollectiveWaitMeter, site: str, call: Callable[..., Any]) -> Callable:
    return lambda *args, **kwargs: meter._timed(site, call, args, kwargs)


def _timed_work_wait(work: Any, *args: Any, **kwargs: Any) -> Any:
    """``Work.wait``, timed as the site ``wait:<the function that waited>``."""
    site = "wait:" + sys._getframe(1).f_code.co_name
    return _through_meters(site, "Work.wait", (work, *args), kwargs)


def _timed_wait_tensor(tensor: Any, *args: Any, **kwargs: Any) -> Any:
    """``_functional_collectives.wait_tensor``, timed as the site ``wait:functional``."""
    return _through_meters("wait:functional", "wait_tensor", (tensor, *args), kwargs)


_MISSING = object()


class _Wrapper:
    """The per-instance replacement of one FSDPParamGroup method."""

    __slots__ = ("meter", "name", "site", "original", "group", "previous", "active", "__wrapped__")

    def __init__(
        self, meter: CollectiveWaitMeter, name: str, original: Callable, group: Any, site: str
    ):
        self.meter = meter
        self.name = name
        self.site = site
        self.original = original
        self.group = group
        # what the instance held before us (another meter's wrapper), restored by remove()
        self.previous = group.__dict__.get(name, _MISSING)
        self.active = True
        self.__wrapped__ = original

    def __reduce__(self) -> tuple[Any, ...]:
        # a copied/pickled group gets FSDP's own (unmeasured) method, not the meter
        return (getattr, (self.group, self.name))

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        if not self.active:
            return self.original(*args, **kwargs)
        return self.meter._timed(self.site, self.original, args, kwargs)


class CollectiveWaitMeter:
    """Accumulate the seconds this process spends blocked in FSDP2's (and other) collectives.

    Usage:

        meter = CollectiveWaitMeter().install(model)  # after fully_shard(...)
        for batch in loader:
            t0 = time.perf_counter()
            loss = model(batch).sum(); loss.backward(); opt.step(); opt.zero_grad()
            wall = time.perf_counter() - t0
            wait = meter.take()           # and reset
            compute = wall - wait
        meter.remove()

    or ``with CollectiveWaitMeter().installed(model) as meter: ...``.

    Args:
        clock: ``"host"`` (``time.perf_counter`` around each call; exact on CPU/gloo),
            ``"device"`` (timing events on the current stream; for CUDA and similar), or
            ``"auto"`` (``"device"`` when the groups' device is not CPU and has timing
            events, else ``"host"``).
        segment: optional factory of a context manager entered around every measured
            (outermost) call, e.g. ``timer.waiting`` of a step timer that records wait
            segments itself; the meter's own totals are kept as well.
        collectives: also time every ``torch.distributed`` work and functional collective
            waited on by the thread that called ``install`` (outside FSDP's methods too: a
            gradient-norm all-reduce, Lightning's per-step broadcast, your own
            collectives), at the source: ``Work.wait`` and ``wait_tensor``, patched on
            their class/module while a meter is installed and restored after the last.

    See the module docstring for the torch internals it relies on and how it degrades.
    """

    def __init__(
        self,
        clock: Literal["auto", "host", "device"] = "auto",
        segment: Callable[[], AbstractContextManager[Any]] | None = None,
        collectives: bool = True,
    ) -> None:
        if clock not in ("auto", "host", "device"):
            raise ValueError(f"`clock` must be 'auto', 'host' or 'device', got {clock!r}.")
        self.clock = clock
        self.segment = segment
        self.collectives = collectives
        self._thread: int | None = None  # the thread whose collective waits are timed
        self._lock = threading.Lock()
        self._local = threading.local()
        self._wrappers: list[_Wrapper] = []
        self._device_mode = False
        self._device_handle: Any = None
        self._bookkeeping_warned = False
        self._reset()
        # device events of finished calls not yet read: (method, start, end)
        self._events: list[tuple[str, Any, Any]] = []

    # ----------------------------------------------------------------- install
    def install(self, module: nn.Module) -> CollectiveWaitMeter:
        """Measure the FSDP2 groups under ``module`` (call after ``fully_shard``).

        Can be called for several modules. Warns, and measures nothing for it, when
        ``module`` carries no FSDP2 state or the groups lack the expected methods.
        """
        try:
            groups = fsdp_param_groups(module)
        except Exception as err:  # internals moved: degrade, never crash
            self._warn(f"could not find FSDP2 parameter groups ({err!r}); no wait is measured.")
            return self
        if not groups:
            self._warn(
                f"{type(module).__name__} has no FSDP2 parameter groups (not fully_shard-ed,"
                " or this torch keeps them elsewhere); no wait is measured for it."
            )
            return self
        self._choose_clock(groups)
        missing: set[str] = set()
        for group in groups:
            for name in WAIT_METHODS:
                if not self._wrap(group, name, name):
                    missing.add(name)
        for state in _fsdp_states(module):  # only the root's callback is ever queued
            for name, site in STATE_METHODS.items():
                self._wrap(state, name, site)
        if self.collectives and self._thread is None:
            self._thread = threading.get_ident()
            _attach_sources(self)
        if missing:
            self._warn(
                f"FSDPParamGroup lacks {sorted(missing)} in torch {torch.__version__}; the"
                " waits in those methods are not measured."
            )
        return self

    def _wrap(self, target: Any, name: str, site: str) -> bool:
        original = getattr(target, name, None)
        if not callable(original):
            return False
        wrapper = _Wrapper(self, name, original, target, site)
        try:
            setattr(target, name, wrapper)
        except Exception:
            return False
        self._wrappers.append(wrapper)
        return True

    def remove(self) -> None:
        """Restore every wrapped method (later installs by others are left intact)."""
        if self._thread is not None:
            _detach_sources(self)
            self._thread = None
        for wrapper in reversed(self._wrappers):
            wrapper.active = False  # pass-through if someone wrapped on top of us
            try:
                if wrapper.group.__dict__.get(wrapper.name) is wrapper:
                    previous = wrapper.previous
                    while isinstance(previous, _Wrapper) and not previous.active:
                        previous = previous.previous  # skip meters already removed
                    if previous is _MISSING:
                        del wrapper.group.__dict__[wrapper.name]
                    else:
                        wrapper.group.__dict__[wrapper.name] = previous
            except Exception:
                pass
        self._wrappers.clear()

    @contextmanager
    def installed(self, module: nn.Module) -> Iterator[CollectiveWaitMeter]:
        """``install(module)`` for the duration of a ``with`` block."""
        self.install(module)
        try:
            yield self
        finally:
            self.remove()

    @property
    def active(self) -> bool:
        """Whether any FSDP method (or collective wait) is being measured."""
        return bool(self._wrappers) or self._thread is not None

    # -------------------------------------------------------------------- read
    def take(self, synchronize: bool = True) -> float:
        """Seconds blocked since the last ``take``/``reset``; resets the count."""
        return self.take_stats(synchronize).wait_s

    def take_stats(self, synchronize: bool = True) -> WaitStats:
        """Like ``take``, with the split by site, call count and gradient-ready mark.

        With ``clock="device"``, ``synchronize=True`` waits for the recorded events to
        complete; ``False`` reads only completed ones and keeps the rest for later.
        """
        self._drain_events(synchronize)
        with self._lock:
            stats = WaitStats(
                wait_s=sum(self._by_site.values(), 0.0),
                by_site=dict(self._by_site),
                calls=self._calls,
                grads_ready_at=self._grads_ready_at,
            )
            self._reset()
        return stats

    def peek(self) -> float:
        """Seconds measured so far (host clock, or device events already completed)."""
        self._drain_events(False)
        with self._lock:
            return sum(self._by_site.values(), 0.0)

    def reset(self) -> None:
        """Forget what was measured (pending device events included)."""
        with self._lock:
            self._reset()
            self._events = []

    # -------------------------------------------------------------- internals
    def _reset(self) -> None:
        self._by_site: dict[str, float] = {}
        self._calls = 0
        self._grads_ready_at: float | None = None

    def _warn(self, message: str) -> None:
        # one message per job: every rank meets the same FSDP2 internals, so rank 0 warns
        # and the others log it (at INFO, under this module's logger)
        text = f"CollectiveWaitMeter: {message}"
        if getattr(rank_zero_only, "rank", 0) == 0:
            warnings.warn(text, FSDPWaitMeterWarning, stacklevel=3)
        else:
            logging.getLogger(__name__).info("rank %d: %s", rank_zero_only.rank, text)

    def _choose_clock(self, groups: Iterable[Any]) -> None:
        if self.clock == "host":
            return
        device = None
        for group in groups:
            device = getattr(group, "device", None)
            if device is not None:
                break
        dtype = getattr(device, "type", "cpu")
        handle = getattr(torch, dtype, None) if dtype != "cpu" else None
        event_cls = getattr(handle, "Event", None) if handle is not None else None
        if event_cls is None:
            if self.clock == "device":
                self._warn(f"no timing events for device {device}; using the host clock.")
            return
        self._device_mode = True
        self._device_handle = handle

    def _timed(self, site: str, original: Callable, args: tuple, kwargs: dict) -> Any:
        stack = getattr(self._local, "stack", None)
        if stack is None:
            stack = self._local.stack = []
        if stack and self._device_mode:  # device clock: the outermost call holds it
            return original(*args, **kwargs)
        if site == "post_backward":
            self._grads_ready_at = time.perf_counter()
        frame = [0.0]  # seconds of measured calls nested in this one
        stack.append(frame)
        outermost = len(stack) == 1
        start = self._mark()
        segment = self._enter_segment() if outermost else None
        try:
            return original(*args, **kwargs)
        finally:
            stack.pop()
            if outermost:
                self._exit_segment(segment)
            self._record(site, start, frame[0], stack[-1] if stack else None)

    def _waits_here(self) -> bool:
        """Whether a collective waited on by the current thread is this meter's to time."""
        return threading.get_ident() == self._thread or bool(getattr(self._local, "stack", None))

    def _mark(self) -> Any:
        try:
            if self._device_mode:
                event = self._device_handle.Event(enable_timing=True)
                event.record()
                return event
        except Exception as err:
            self._bookkeeping_error(err)
            return None
        return time.perf_counter()

    def _record(self, name: str, start: Any, nested_s: float, parent: list[float] | None) -> None:
        try:
            if start is None:
                return
            if self._device_mode:
                end = self._mark()
                if end is None:
                    return
                with self._lock:
                    self._events.append((name, start, end))
                    self._calls += 1
                return
            elapsed = time.perf_counter() - start
            if parent is not None:  # the caller's site does not hold this call's time
                parent[0] += elapsed
            with self._lock:
                self._by_site[name] = self._by_site.get(name, 0.0) + elapsed - nested_s
                self._calls += parent is None
        except Exception as err:
            self._bookkeeping_error(err)

    def _drain_events(self, synchronize: bool) -> None:
        if not self._device_mode:
            return
        with self._lock:
            events, self._events = self._events, []
        pending = []
        try:
            for i, (name, start, end) in enumerate(events):
                if not synchronize and not end.query():
                    pending = events[i:]
                    break
                end.synchronize()
                elapsed = start.elapsed_time(end) / 1e3
                with self._lock:
                    self._by_site[name] = self._by_site.get(name, 0.0) + elapsed
        except Exception as err:
            self._bookkeeping_error(err)
        if pending:
            with self._lock:
                self._events = pending + self._events

    def _enter_segment(self) -> AbstractContextManager[Any] | None:
        if self.segment is None:
            return None
        try:
            context = self.segment()
            context.__enter__()
            return context
        except Exception as err:
            self._bookkeeping_error(err)
            return None

    def _exit_segment(self, context: AbstractContextManager[Any] | None) -> None:
        if context is None:
            return
        try:
            context.__exit__(None, None, None)
        except Exception as err:
            self._bookkeeping_error(err)

    def _bookkeeping_error(self, err: BaseException) -> None:
        if not self._bookkeeping_warned:
            self._bookkeeping_warned = True
            self._warn(f"a measurement failed ({err!r}); some waits may be missing.")
