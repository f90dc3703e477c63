"""The weighted all-reduce communication hook and the step timers it feeds.

No ``from __future__ import annotations`` here: torch checks the hook's evaluated
annotations when it is registered.
"""

import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

__all__ = ["CudaStepTimer", "HostStepTimer", "WeightedHookState", "weighted_allreduce_hook"]


class HostStepTimer:
    """Times each step on the host clock: compute until local gradients are ready, then wait.

    ``compute_s`` runs from :meth:`start` (the batch is on the device) to
    :meth:`grads_ready` (the last gradient bucket is ready, reported by the comm
    hook); ``wait_s`` from there to :meth:`backward_done` (all-reduce finished, which
    includes waiting for slower ranks). Without a hook call (e.g. ``no_sync`` during
    gradient accumulation) the step counts as all compute.
    """

    def __init__(self) -> None:
        self._pending: list[tuple[int, Any, Any, Any]] = []
        self._batch_size = 0
        self._start: Any = None
        self._ready: Any = None

    def _now(self) -> Any:
        return time.perf_counter()

    def _finished(self, mark: Any, synchronize: bool) -> bool:
        return True

    def _elapsed_s(self, begin: Any, end: Any) -> float:
        return end - begin

    def start(self, batch_size: int) -> None:
        self._batch_size = batch_size
        self._start, self._ready = self._now(), None

    def grads_ready(self) -> None:
        self._ready = self._now()

    def backward_done(self) -> None:
        if self._start is None:
            return
        done = self._now()
        ready = done if self._ready is None else self._ready
        self._pending.append((self._batch_size, self._start, ready, done))
        self._start = None

    def collect(self, synchronize: bool = False) -> list[tuple[int, float, float]]:
        """Finished steps since the last call as ``(batch_size, compute_s, wait_s)``."""
        records = []
        while self._pending and self._finished(self._pending[0][3], synchronize):
            batch_size, start, ready, done = self._pending.pop(0)
            records.append(
                (batch_size, self._elapsed_s(start, ready), self._elapsed_s(ready, done))
            )
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

    def _finished(self, mark: torch.cuda.Event, synchronize: bool) -> bool:
        if synchronize:
            mark.synchronize()
            return True
        return mark.query()

    def _elapsed_s(self, begin: torch.cuda.Event, end: torch.cuda.Event) -> float:
        return begin.elapsed_time(end) / 1e3


@dataclass
class WeightedHookState:
    """What the hook needs: the group, this step's weight ``b_k / B``, and the timer."""

    process_group: dist.ProcessGroup | None
    world_size: int
    timer: HostStepTimer
    weighted: bool = True
    weight: float = 1.0


def weighted_allreduce_hook(
    state: WeightedHookState, bucket: dist.GradBucket
) -> torch.futures.Future[torch.Tensor]:
    """Scale the bucket by ``b_k / B`` and sum it over ranks (DESIGN formula 4).

    Each rank's gradient is the mean over its own ``b_k`` samples, so the weighted
    sum equals the gradient of the mean loss over all ``B`` samples. With
    ``weighted=False`` it divides by the world size instead, as plain DDP does.
    """
    if bucket.is_last():
        state.timer.grads_ready()
    tensor = bucket.buffer()
    tensor.mul_(state.weight if state.weighted else 1.0 / state.world_size)
    future = dist.all_reduce(tensor, group=state.process_group, async_op=True).get_future()
    return future.then(lambda fut: fut.value()[0])
