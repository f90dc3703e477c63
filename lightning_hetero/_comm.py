"""Step timers: what each training step costs a rank, apart from its waiting for other ranks."""

import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from functools import partial
from typing import Any, NamedTuple

import torch

__all__ = ["CudaStepTimer", "HostStepTimer", "StepRecord", "shadow", "time_calls"]


class StepRecord(NamedTuple):
    """One timed training step of one rank."""

    batch_size: int
    #: Seconds of the rank's own work in the step (its cost), waiting excluded.
    compute_s: float
    #: Seconds blocked in collectives (waiting for other ranks) during the step.
    wait_s: float
    #: The step was timed from the end of the previous one, so its data loading and the
    #: loop's work between steps are in ``compute_s``; ``False`` for the first step after
    #: a break (an epoch's first step, the first after validation), timed from its batch's
    #: arrival only.
    full: bool
    #: Tells the plans the steps ran under apart (e.g. a checksum of the plan; 0: unknown).
    plan: int = 0
    #: ``(samples, compute seconds)`` of each micro-batch, where the step ran its batch as two
    #: or more (each backward's share of ``compute_s``, waits excluded); else empty.
    micro: tuple[tuple[int, float], ...] = ()


def shadow(owner: object, name: str, value: Any) -> Callable[[], None]:
    """Set ``owner.name`` to ``value`` as an instance attribute, shadowing the class's;
    returns the undo, which puts back what the instance held (its own attribute, or none)
    and leaves alone a value set over this one since (so running it twice is harmless)."""
    own = vars(owner)
    had, saved = name in own, own.get(name)
    own[name] = value

    def undo() -> None:
        if own.get(name) is not value:
            return
        if had:
            own[name] = saved
        else:
            del own[name]

    return undo


def time_calls(
    owner: Any, names: tuple[str, ...], waiting: Callable[[], Any]
) -> Callable[[], None]:
    """Run ``owner``'s methods ``names`` (collectives) inside ``waiting()``, a step timer's
    context for time spent waiting for other ranks; returns what puts them back as they were
    (``shadow``'s undo, for each)."""

    def timed(function: Callable[..., Any]) -> Callable[..., Any]:
        def collective(*args: Any, **kwargs: Any) -> Any:
            with waiting():
                return function(*args, **kwargs)

        return collective

    undos = [shadow(owner, name, timed(getattr(owner, name))) for name in names]

    def undo() -> None:
        for each in reversed(undos):
            each()

    return undo


class HostStepTimer:
    """Times each training step's cost on the host clock: everything on the training thread
    except waiting for other ranks.

    A step *cycle* runs from the end of the previous step to the end of this one: the loop's
    and the callbacks' work after the previous step (progress bar, logging), fetching and
    collating this step's batch (with ``DataLoader(num_workers=0)`` on this thread), moving
    it to the device, forward, every backward, gradient clipping and the optimizer step. A
    step ends at its last *end mark*: the end of a backward (``backward_done``) or of
    an optimizer step (``step_done``). The first step after ``break_cycle`` (an
    epoch's first, the first after validation) has no previous end: it is timed from
    ``start`` (its batch is on the device) and recorded with ``full=False``.

    Inside the cycle, the time spent waiting for other ranks is the sum of its *wait
    segments*: each backward's, from the moment its local gradients were ready (the last
    ``grads_ready`` call; one per accumulated gradient) until the backward ended
    (all-reduce finished, waiting for slower ranks included), and any other collective timed
    with ``waiting`` (a ``sync_dist`` reduction, the re-planner's boundary). ``wait_s``
    is that sum, ``compute_s`` the cycle's time minus it, and ``compute_s + wait_s`` the
    wall time of the cycle: the synchronous step time. A backward without a hook call
    (``no_sync`` during gradient accumulation, or no DDP at all) is all compute; a wait that
    begins after a step's last end mark belongs to the next step's cycle.

    A step whose batch ran as micro-batches (two or more backwards, each told its samples,
    which sum to the step's batch) also records each micro-batch's compute: from the batch's
    arrival (``start``) to the first backward's end, then from each backward's end to the
    next, less the waits inside; the data loading before the arrival and the optimizer
    step after the last backward are the step's rest.

    ``finish`` (also called by ``start`` and ``collect``) closes the step; a
    step without an end mark (nothing was backpropagated) records nothing and breaks the
    cycle, and marks made while no step is open are ignored.
    """

    def __init__(self) -> None:
        # (batch_size, begin, end, ((wait_begin, wait_end), ...), other waits in s, full, plan,
        # the batch's arrival and each backward's (end, samples) where micro-batched, else None)
        self._pending: list[tuple[Any, ...]] = []
        self._batch_size = 0
        self._plan = 0
        self._cycle_begin: Any = None  # the previous step's end, until a break
        self._start: Any = None
        self._full = False
        self._ready: Any = None
        self._end: Any = None
        self._waits: list[tuple[Any, Any]] = []
        self._waits_in_step = 0  # wait segments that began before the last end mark
        self._extra_wait_s = 0.0  # waits measured elsewhere, in seconds
        self._waiting_depth = 0  # open ``waiting`` blocks: nested ones count once
        self._arrival: Any = None  # the step's batch on the device
        self._ends: list[tuple[Any, int | None]] = []  # each backward's end and samples

    def _now(self) -> Any:
        return time.perf_counter()

    def _finished(self, mark: Any, synchronize: bool) -> bool:
        return True

    def _elapsed_s(self, begin: Any, end: Any) -> float:
        return end - begin

    def start(self, batch_size: int, plan: int = 0) -> None:
        """A step on ``batch_size`` samples of the plan ``plan`` (a key) has its batch on the
        device (closing any open step); its cycle began at the previous step's end, if no
        break came since."""
        self.finish()
        self._batch_size, self._plan = batch_size, plan
        self._full = self._cycle_begin is not None
        self._start = self._cycle_begin if self._full else self._now()
        self._arrival = self._now() if self._full else self._start

    def break_cycle(self) -> None:
        """What runs until the next ``start`` is no step's cost (a new epoch, validation):
        the next step is timed from its start."""
        self.finish()
        self._cycle_begin = None
        self._waits = []

    def grads_ready(self) -> None:
        """This rank's gradients of the current backward are all computed."""
        if self._start is not None:
            self._ready = self._now()

    def backward_done(self, samples: int | None = None) -> None:
        """A backward ended (with its all-reduce, if any): an end mark. ``samples``: the
        samples it backpropagated (a micro-batch's, where the step runs several)."""
        if self._start is None:
            return
        done = self._now()
        if self._ready is not None:
            self._waits.append((self._ready, done))
            self._ready = None
        self._ends.append((done, samples))
        self._mark_end(done)

    def step_done(self) -> None:
        """An optimizer step ended: an end mark (its work counts as compute)."""
        if self._start is not None:
            self._mark_end(self._now())

    def add_wait(self, seconds: float) -> None:
        """Count ``seconds`` of waiting measured elsewhere (e.g. in FSDP's collectives)."""
        if self._start is not None and seconds > 0:
            self._extra_wait_s += seconds

    @contextmanager
    def waiting(self) -> Iterator[None]:
        """Time the block (a collective) as waiting, if it lies inside a step's cycle (a
        block inside another is the outer one's)."""
        if self._waiting_depth or (self._start is None and self._cycle_begin is None):
            yield
            return
        begin = self._now()
        self._waiting_depth += 1
        try:
            yield
        finally:
            self._waiting_depth -= 1
            if self._start is not None or self._cycle_begin is not None:
                self._waits.append((begin, self._now()))

    def _mark_end(self, mark: Any) -> None:
        self._end = mark
        self._waits_in_step = len(self._waits)

    def finish(self) -> None:
        """Close the open step: it ends at its last end mark, where the next cycle begins."""
        if self._start is None:
            return
        if self._end is not None:
            waits = tuple(self._waits[: self._waits_in_step])
            record = (self._batch_size, self._start, self._end, waits, self._extra_wait_s)
            sizes = [n for _, n in self._ends]
            micro = (
                (self._arrival, tuple(self._ends))
                if len(sizes) > 1
                and None not in sizes
                and sum(sizes) == self._batch_size  # type: ignore[arg-type]
                and not self._extra_wait_s  # waits counted elsewhere: not placed in time
                else None
            )
            self._pending.append((*record, self._full, self._plan, micro))
            self._waits = self._waits[self._waits_in_step :]  # they belong to the next cycle
        else:
            self._waits = []
        self._cycle_begin = self._end
        self._start = self._ready = self._end = self._arrival = None
        self._ends = []
        self._waits_in_step = 0
        self._extra_wait_s = 0.0

    def collect(self, synchronize: bool = False) -> list[StepRecord]:
        """Finished steps since the last call, oldest first.

        Closes the open step first: call it once the step is over (after the batch).
        """
        self.finish()
        records = []
        while self._pending and self._finished(self._pending[0][2], synchronize):
            batch_size, start, end, waits, extra_wait_s, full, plan, *micro_of = self._pending.pop(
                0
            )
            micro = micro_of[0] if micro_of else None  # (a 7-field entry: none)
            wait_s = extra_wait_s + sum(self._elapsed_s(begin, stop) for begin, stop in waits)
            cost_s = self._elapsed_s(start, end) - wait_s
            parts = () if micro is None else self._micro_batches(*micro, waits)
            records.append(StepRecord(batch_size, cost_s, wait_s, full, plan, parts))
        return records

    def _micro_batches(
        self, arrival: Any, ends: tuple[tuple[Any, int], ...], waits: tuple[tuple[Any, Any], ...]
    ) -> tuple[tuple[int, float], ...]:
        """``(samples, compute seconds)`` of each micro-batch: from the arrival or the
        previous backward's end to its own, less the waits within."""
        spans = [(self._elapsed_s(arrival, b), self._elapsed_s(arrival, e)) for b, e in waits]
        parts, begin = [], 0.0
        for mark, samples in ends:
            end = self._elapsed_s(arrival, mark)
            waited = sum(min(e, end) - max(b, begin) for b, e in spans if b < end and e > begin)
            parts.append((samples, end - begin - waited))
            begin = end
        return tuple(parts)


class CudaStepTimer(HostStepTimer):
    """The same measurements with CUDA events, on the device's own clock.

    Every mark is an event recorded on the current stream, and a cycle is the device-clock
    time between the previous step's end event and this step's. That one interval holds
    both parts of a step's cost: the device's work, and the host's work on the training
    thread (loading the next batch with ``num_workers=0``, Python in the loop), which shows
    up as the device idling between two steps' kernels because the host had not yet queued
    them. Work the host does while the device is still busy costs nothing and counts
    nothing. Waits are the device time between a backward's gradients-ready event and its
    end (the all-reduce, and any idling for a slower rank), and blocks timed with
    ``waiting``.

    What it costs a step (fast GPU steps pay for every host call): a few event records (the
    batch's arrival, each backward's gradients-ready and end, the optimizer step's end) and
    no synchronisation. Events come from a pool: created once, re-recorded once ``collect``
    has read every step that used them, never destroyed while the timer lives. The
    gradients-ready hook runs once per parameter, but records only from the call at which
    the fewest backwards so far had their last gradient (learned from the first backward,
    which records at every call), so a model with a fixed graph records one event per
    backward; a backward with fewer hook calls than any before it (parameters unused this
    step) is recorded as all compute, once, and the count is learned anew. Events are read
    once they have completed (``query``), so timing never blocks the host except when
    ``collect`` is asked to ``synchronize`` at a boundary.

    Args:
        event_factory: makes one timing event (``torch.cuda.Event(enable_timing=True)`` by
            default; tests pass a fake).
    """

    def __init__(self, event_factory: Callable[[], Any] | None = None) -> None:
        super().__init__()
        self._factory = event_factory or partial(torch.cuda.Event, enable_timing=True)
        self._free: list[Any] = []  # recorded and read: ready to be recorded again
        self._lent: list[Any] = []  # handed out since the last sweep or still in use
        #: Events created so far (the pool's size).
        self.events_created = 0
        self._hook_calls = 0  # gradients-ready calls in the current backward
        self._calls_expected: int | None = None  # from this call on, record the event

    def _take(self) -> Any:
        if self._free:
            event = self._free.pop()
        else:
            event = self._factory()
            self.events_created += 1
        self._lent.append(event)
        return event

    def _now(self) -> Any:
        event = self._take()
        event.record()
        return event

    def start(self, batch_size: int, plan: int = 0) -> None:
        self._hook_calls = 0  # a backward that raised left its count
        super().start(batch_size, plan)

    def grads_ready(self) -> None:
        # once per parameter: record only from the learned last call on (every call until
        # one backward taught it), re-recording one event per backward
        if self._start is None:
            return
        self._hook_calls += 1
        expected = self._calls_expected
        if expected is None or self._hook_calls >= expected:
            if self._ready is None:
                self._ready = self._take()
            self._ready.record()

    def backward_done(self, samples: int | None = None) -> None:
        calls, self._hook_calls = self._hook_calls, 0
        if calls and (self._calls_expected is None or calls < self._calls_expected):
            self._calls_expected = calls  # fewer calls than expected: none recorded this time
        super().backward_done(samples)

    def collect(self, synchronize: bool = False) -> list[StepRecord]:
        records = super().collect(synchronize)
        self._recycle()
        return records

    def _recycle(self) -> None:
        """Return to the pool every lent event that no open or pending step holds (none
        inside a ``waiting`` block: its begin event is held by the block alone)."""
        if self._waiting_depth:
            return
        lent = {id(event) for event in self._lent}
        live: set[int] = set()
        # every attribute but the pool's own lists, nested tuples and lists included (the
        # pending entries, the open step's marks, whatever their layout)
        held = [value for name, value in vars(self).items() if name not in ("_free", "_lent")]
        while held:
            item = held.pop()
            if isinstance(item, (list, tuple)):
                held.extend(item)
            elif id(item) in lent:
                live.add(id(item))
        self._free.extend(event for event in self._lent if id(event) not in live)
        self._lent = [event for event in self._lent if id(event) in live]

    def _finished(self, mark: Any, synchronize: bool) -> bool:
        if synchronize:
            mark.synchronize()
            return True
        return bool(mark.query())

    def _elapsed_s(self, begin: Any, end: Any) -> float:
        return float(begin.elapsed_time(end)) / 1e3
