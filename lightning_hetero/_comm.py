"""Step timers: each training step's compute time, apart from its waiting for other ranks."""

import time
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["CudaStepTimer", "HostStepTimer"]


class HostStepTimer:
    """Times each training step on the host clock: compute, and waiting for other ranks.

    A step runs from :meth:`start` (the batch is on the device) to its last *end mark*:
    the end of a backward pass (:meth:`backward_done`) or of an optimizer step
    (:meth:`step_done`), whichever came last. Inside it, the time spent waiting for other
    ranks is the sum of its *wait segments*: each backward's, from the moment its local
    gradients were ready (the last :meth:`grads_ready` call; one per accumulated gradient)
    until the backward ended (all-reduce finished, including waiting for slower ranks), and any
    other collective timed with :meth:`waiting` (e.g. a ``sync_dist`` metric reduction).
    ``wait_s`` is that sum, ``compute_s`` the step's time minus it: forward, every
    backward (manual optimization may run several), gradient clipping and the optimizer
    step all count as compute. A backward without a hook call (``no_sync`` during
    gradient accumulation, or no DDP at all) is all compute; a wait segment that begins
    after the step's last end mark (e.g. a metric synced in ``on_train_batch_end``) lies
    outside the step and is not counted.

    :meth:`finish` (also called by :meth:`start` and :meth:`collect`) closes the step; a
    step without an end mark (nothing was backpropagated) records nothing, and marks made
    while no step is open are ignored.
    """

    def __init__(self) -> None:
        # (batch_size, start, end, ((wait_begin, wait_end), ...), other waits in seconds)
        self._pending: list[tuple[int, Any, Any, tuple[tuple[Any, Any], ...], float]] = []
        self._batch_size = 0
        self._start: Any = None
        self._ready: Any = None
        self._end: Any = None
        self._waits: list[tuple[Any, Any]] = []
        self._waits_in_step = 0  # wait segments that began before the last end mark
        self._extra_wait_s = 0.0  # waits measured elsewhere, in seconds

    def _now(self) -> Any:
        return time.perf_counter()

    def _finished(self, mark: Any, synchronize: bool) -> bool:
        return True

    def _elapsed_s(self, begin: Any, end: Any) -> float:
        return end - begin

    def start(self, batch_size: int) -> None:
        """A step on ``batch_size`` samples starts now (closing any open step)."""
        self.finish()
        self._batch_size = batch_size
        self._start = self._now()

    def grads_ready(self) -> None:
        """This rank's gradients of the current backward are all computed."""
        if self._start is not None:
            self._ready = self._now()

    def backward_done(self) -> None:
        """A backward ended (with its all-reduce, if any): an end mark."""
        if self._start is None:
            return
        done = self._now()
        if self._ready is not None:
            self._waits.append((self._ready, done))
            self._ready = None
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
        """Time the block (a collective) as waiting, if it lies inside the step."""
        if self._start is None:
            yield
            return
        begin = self._now()
        try:
            yield
        finally:
            if self._start is not None:
                self._waits.append((begin, self._now()))

    def _mark_end(self, mark: Any) -> None:
        self._end = mark
        self._waits_in_step = len(self._waits)

    def finish(self) -> None:
        """Close the open step: it ends at its last end mark."""
        if self._start is not None and self._end is not None:
            waits = tuple(self._waits[: self._waits_in_step])
            record = (self._batch_size, self._start, self._end, waits, self._extra_wait_s)
            self._pending.append(record)
        self._start = self._ready = self._end = None
        self._waits = []
        self._waits_in_step = 0
        self._extra_wait_s = 0.0

    def collect(self, synchronize: bool = False) -> list[tuple[int, float, float]]:
        """Finished steps since the last call as ``(batch_size, compute_s, wait_s)``.

        Closes the open step first: call it once the step is over (after the batch).
        """
        self.finish()
        records = []
        while self._pending and self._finished(self._pending[0][2], synchronize):
            batch_size, start, end, waits, extra_wait_s = self._pending.pop(0)
            wait_s = extra_wait_s + sum(self._elapsed_s(begin, stop) for begin, stop in waits)
            records.append((batch_size, self._elapsed_s(start, end) - wait_s, wait_s))
        return records


class CudaStepTimer(HostStepTimer):
    """The same measurements with CUDA events, on the device's own clock.

    Events are recorded on the current stream and read once they have completed, so
    timing never blocks the host except when :meth:`collect` is asked to
    ``synchronize`` at a boundary.
    """

    def _now(self) -> torch.cuda.Event:
        event = torch.cuda.Event(enable_timing=True)
        event.record()
        return event

    def grads_ready(self) -> None:
        # called once per parameter: re-record one event per backward, not a new one per call
        if self._start is not None:
            if self._ready is None:
                self._ready = torch.cuda.Event(enable_timing=True)
            self._ready.record()

    def _finished(self, mark: torch.cuda.Event, synchronize: bool) -> bool:
        if synchronize:
            mark.synchronize()
            return True
        return mark.query()

    def _elapsed_s(self, begin: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return begin.elapsed_time(end) / 1e3
