"""A cluster simulator: workers with time curves, noise and speed changes.

Controllers are tested against it in milliseconds: it plays the part of the
measuring layer (per-step compute times, smoothed since the last change) and
records what a real run records at each boundary.
"""

import random
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from math import nan, sqrt
from statistics import fmean, stdev
from typing import Any

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats
from lightning_hetero.planning.guard import StepTimeGuard
from lightning_hetero.planning.smoothing import TimingSmoother
from lightning_hetero.planning.split import balance_efficiency, plan_checksum

__all__ = ["HETEROGENEITY_LEVELS", "ClusterSimulator", "SimulatedWorker", "SimulationResult"]

#: CPU cores of the four workers at OmniLearn's heterogeneity levels (paper 002, Table I);
#: a worker's speed is proportional to its cores, HLx means fastest/slowest = x.
HETEROGENEITY_LEVELS: dict[str, tuple[int, int, int, int]] = {
    "HL1": (12, 12, 12, 12),
    "HL2": (12, 12, 8, 16),
    "HL4": (9, 9, 6, 24),
    "HL8": (6, 6, 4, 32),
}


@dataclass(frozen=True)
class SimulatedWorker:
    """Compute time of one worker as a function of its batch size.

    ``t(b) = (max(floor_s, sample_s * max(b, saturation_batch)) + overhead_s) / speed
    + load_s * b``: below ``saturation_batch`` the device is not full and time stays flat
    (GPU-like); a device part below ``floor_s`` takes ``floor_s`` whatever the batch (a
    per-step floor); above ``memory_cap`` samples every extra sample costs
    ``over_cap_slowdown`` times more (swapping, allocator thrashing: throughput falls,
    paper 000 Fig. 5); ``load_s`` per sample is data loading on the training thread
    (``num_workers=0``), which a faster device does not speed up. The reported memory use
    is ``b / memory_cap`` (1.0 at the cap).
    """

    sample_s: float
    overhead_s: float = 0.0
    saturation_batch: int = 0
    memory_cap: int | None = None
    over_cap_slowdown: float = 4.0
    floor_s: float = 0.0
    load_s: float = 0.0
    #: Samples the worker holds at once (``micro_batch_size``): a larger batch runs as
    #: ``ceil(b / micro_batch)`` micro-batches of near-equal size, each its own device time
    #: and ``overhead_s``. ``None``: the whole batch at once.
    micro_batch: int | None = None

    def __post_init__(self) -> None:
        if self.sample_s <= 0 or self.overhead_s < 0:
            raise ValueError("`sample_s` must be > 0 and `overhead_s` >= 0.")
        if self.over_cap_slowdown < 1:
            raise ValueError("`over_cap_slowdown` must be >= 1.")
        if self.floor_s < 0 or self.load_s < 0:
            raise ValueError("`floor_s` and `load_s` must be >= 0.")
        if self.micro_batch is not None and self.micro_batch < 1:
            raise ValueError(f"`micro_batch` must be >= 1, got {self.micro_batch}.")

    def step_s(self, batch_size: int, speed: float = 1.0) -> float:
        """Noise-free compute time of one step, for a worker running at ``speed`` x."""
        device_s = sum(self._device_s(size) + self.overhead_s for size in self._parts(batch_size))
        return device_s / speed + self.load_s * batch_size

    def micro_batches_s(self, batch_size: int, speed: float = 1.0) -> list[tuple[int, float]]:
        """Noise-free ``(samples, seconds)`` of each micro-batch of a step (its device time
        and ``overhead_s``); the rest of ``step_s`` is loading."""
        return [
            (size, (self._device_s(size) + self.overhead_s) / speed)
            for size in self._parts(batch_size)
        ]

    def _device_s(self, batch_size: int) -> float:
        effective = max(batch_size, self.saturation_batch)
        if self.memory_cap is not None and batch_size > self.memory_cap:
            effective += (batch_size - self.memory_cap) * (self.over_cap_slowdown - 1.0)
        return max(self.floor_s, self.sample_s * effective)

    def _parts(self, batch_size: int) -> list[int]:
        """The micro-batches of a step (as the strategy cuts them: sizes differ by <= 1)."""
        bound = self.micro_batch
        if bound is None or batch_size <= bound:
            return [batch_size]
        parts = -(-batch_size // bound)
        size, extra = divmod(batch_size, parts)
        return [size + 1] * extra + [size] * (parts - extra)

    def memory_used(self, batch_size: int) -> float:
        """Fraction of the memory budget in use at ``batch_size``; ``nan`` without a cap."""
        return nan if self.memory_cap is None else batch_size / self.memory_cap


@dataclass
class SimulationResult:
    """What happened at each boundary of a simulated run."""

    history: list[dict[str, Any]] = field(default_factory=list)

    @property
    def plans(self) -> list[list[int]]:
        """The plan in force during each interval."""
        return [entry["batch_sizes"] for entry in self.history]

    @property
    def balance(self) -> list[float]:
        """True (noise-free) balance efficiency during each interval."""
        return [entry["balance"] for entry in self.history]

    @property
    def adjustments(self) -> int:
        """Number of boundaries at which the plan changed."""
        return sum(entry["changed"] for entry in self.history)

    def adjustments_to_balance(self, threshold: float = 0.95, start: int = 0) -> int | None:
        """Plan changes made from boundary ``start`` until balance first reaches ``threshold``."""
        changes = 0
        for entry in self.history[start:]:
            if entry["balance"] >= threshold:
                return changes
            changes += entry["changed"]
        return None


class ClusterSimulator:
    """Simulated workers stepping in lock-step (BSP), one interval per boundary.

    Args:
        workers: one [`SimulatedWorker`][lightning_hetero.planning.simulator.SimulatedWorker] per
            rank.
        noise: relative standard deviation of each step's compute time (Gaussian).
        speed_changes: ``{boundary: speeds}``; from that boundary on, worker ``k``
            runs ``speeds[k]`` times as fast as its curve says (the latest entry
            at or before a boundary applies; before the first, speeds are 1).
        availability: ``{boundary: [(cpu_available, memory_available), ...]}``, the
            host resource readings each worker reports from that boundary on (the latest
            entry at or before a boundary applies; before the first, ``nan``). They are
            only reported: pair them with ``speed_changes`` to make speed follow them.
        seed: seed of the noise.
        stalls: ``(probability, seconds)``: each worker, independently at each step, stalls
            for ``seconds`` more with ``probability`` (another job's burst, a page fault, a
            GC pause: heavy-tailed delays no plan can avoid, on top of the speed
            differences).
        micro_noise: draw the noise and stalls of a worker that runs micro-batches per
            micro-batch (a stall lands on the step's first), as a busy host delays each
            forward and backward on its own; ``False``: one draw per step, which every
            micro-batch of the step shares.

    Example:
        >>> from lightning_hetero.planning import BatchLimits, ProportionalController
        >>> sim = ClusterSimulator.from_speeds([9, 9, 6, 24])
        >>> result = sim.run(ProportionalController(), [64] * 4, BatchLimits.build(4, 256), 3)
        >>> result.plans
        [[64, 64, 64, 64], [48, 48, 32, 128], [48, 48, 32, 128]]
    """

    def __init__(
        self,
        workers: Sequence[SimulatedWorker],
        noise: float = 0.0,
        speed_changes: Mapping[int, Sequence[float]] | None = None,
        seed: int = 0,
        availability: Mapping[int, Sequence[tuple[float, float]]] | None = None,
        stalls: tuple[float, float] = (0.0, 0.0),
        micro_noise: bool = False,
    ) -> None:
        if not workers:
            raise ValueError("The simulator needs at least one worker.")
        if noise < 0:
            raise ValueError(f"`noise` must be >= 0, got {noise}.")
        self.workers = list(workers)
        self.noise = noise
        self.speed_changes = {int(k): list(v) for k, v in (speed_changes or {}).items()}
        for boundary, speeds in self.speed_changes.items():
            if len(speeds) != len(self.workers) or any(s <= 0 for s in speeds):
                raise ValueError(f"speed_changes[{boundary}] needs one positive speed per worker.")
        self.availability = {int(k): list(v) for k, v in (availability or {}).items()}
        for boundary, readings in self.availability.items():
            if len(readings) != len(self.workers):
                raise ValueError(f"availability[{boundary}] needs one reading per worker.")
        if not (0.0 <= stalls[0] <= 1.0 and stalls[1] >= 0.0):
            raise ValueError(
                f"`stalls` must be (probability in [0, 1], seconds >= 0), got {stalls}."
            )
        self.stalls = (float(stalls[0]), float(stalls[1]))
        self.micro_noise = micro_noise
        self._rng = random.Random(seed)

    @classmethod
    def from_speeds(
        cls,
        speeds: Sequence[float],
        sample_s: float = 0.01,
        overhead_s: float = 0.0,
        **kwargs: Any,
    ) -> "ClusterSimulator":
        """Linear workers whose per-sample time is ``sample_s * max(speeds) / speed``."""
        fastest = max(speeds)
        workers = [SimulatedWorker(sample_s * fastest / s, overhead_s) for s in speeds]
        return cls(workers, **kwargs)

    def speeds_at(self, boundary: int) -> list[float]:
        """Speed multipliers in force during interval ``boundary``."""
        speeds = [1.0] * len(self.workers)
        for start in sorted(self.speed_changes):
            if start <= boundary:
                speeds = self.speed_changes[start]
        return list(speeds)

    def stats_at(self, batch_sizes: Sequence[int], boundary: int) -> list[RankStats]:
        """What each worker reports besides its timing during interval ``boundary``."""
        readings: Sequence[tuple[float, float]] = [(nan, nan)] * len(self.workers)
        for start in sorted(self.availability):
            if start <= boundary:
                readings = self.availability[start]
        return [
            RankStats(memory_used=w.memory_used(b), cpu_available=cpu, memory_available=mem)
            for w, b, (cpu, mem) in zip(self.workers, batch_sizes, readings)
        ]

    def true_step_s(self, batch_sizes: Sequence[int], boundary: int) -> list[float]:
        """Noise-free compute times of one step."""
        speeds = self.speeds_at(boundary)
        return [w.step_s(b, s) for w, b, s in zip(self.workers, batch_sizes, speeds)]

    def optimal_step_s(self, limits: BatchLimits, boundary: int) -> float:
        """The shortest noise-free step time any plan within ``limits`` can reach.

        Step time curves rise with the batch, so for a candidate time ``T`` each worker
        takes the largest batch it finishes within ``T``; the optimum is the smallest
        ``T`` at which those batches add up to the global batch.
        """
        speeds = self.speeds_at(boundary)

        def largest(k: int, limit: float) -> int:
            lo, hi = limits.min_batch_size[k], limits.max_batch_size[k]
            if self.workers[k].step_s(lo, speeds[k]) > limit:
                # this worker's minimum does not fit: no sum of the others' batches makes up
                return -sum(limits.max_batch_size) - 1
            while lo < hi:
                mid = (lo + hi + 1) // 2
                if self.workers[k].step_s(mid, speeds[k]) <= limit:
                    lo = mid
                else:
                    hi = mid - 1
            return lo

        candidates = sorted(
            {
                w.step_s(b, s)
                for w, s, lo, hi in zip(
                    self.workers, speeds, limits.min_batch_size, limits.max_batch_size
                )
                for b in range(lo, hi + 1)
            }
        )
        low, high = 0, len(candidates) - 1
        while low < high:
            mid = (low + high) // 2
            if sum(largest(k, candidates[mid]) for k in range(len(self.workers))) >= (
                limits.global_batch_size
            ):
                high = mid
            else:
                low = mid + 1
        return candidates[low]

    def step_s(self, batch_sizes: Sequence[int], boundary: int) -> list[float]:
        """Compute times of one step, with noise and stalls."""
        times = [
            t * max(0.05, 1.0 + self._rng.gauss(0.0, self.noise))
            for t in self.true_step_s(batch_sizes, boundary)
        ]
        probability, stall_s = self.stalls
        if probability > 0.0:  # no draws otherwise: other scenarios keep their noise
            times = [t + (stall_s if self._rng.random() < probability else 0.0) for t in times]
        return times

    def step_timings(
        self, batch_sizes: Sequence[int], boundary: int
    ) -> list[tuple[float, list[tuple[int, float]]]]:
        """Per worker, one step's compute time with noise and stalls, and its micro-batches'
        ``(samples, seconds)`` (the step's time less its loading; two or more micro-batches,
        else none)."""
        speeds = self.speeds_at(boundary)
        parts = [w.micro_batches_s(b, s) for w, b, s in zip(self.workers, batch_sizes, speeds)]
        if not self.micro_noise:  # one draw per step, shared by its micro-batches
            true = self.true_step_s(batch_sizes, boundary)
            out = []
            for t, noisy, micro in zip(true, self.step_s(batch_sizes, boundary), parts):
                scale = noisy / t if t > 0 else 1.0
                out.append((noisy, [(n, x * scale) for n, x in micro] if len(micro) > 1 else []))
            return out
        probability, stall_s = self.stalls
        out = []
        for worker, b, micro in zip(self.workers, batch_sizes, parts):
            drawn = [(n, x * max(0.05, 1.0 + self._rng.gauss(0.0, self.noise))) for n, x in micro]
            load_s = worker.load_s * b * max(0.05, 1.0 + self._rng.gauss(0.0, self.noise))
            if probability > 0.0 and self._rng.random() < probability:
                drawn[0] = (drawn[0][0], drawn[0][1] + stall_s)
            total = load_s + sum(x for _, x in drawn)
            out.append((total, drawn if len(drawn) > 1 else []))
        return out

    def run(
        self,
        controller: Controller,
        batch_sizes: Sequence[int],
        limits: BatchLimits,
        boundaries: int,
        steps_per_boundary: int = 20,
        guard: StepTimeGuard | None = None,
        micro_timings: bool = True,
    ) -> SimulationResult:
        """Run ``boundaries`` intervals; after each, the controller picks the next plan.

        ``guard``: check each change against the measured step time (the slowest worker's
        time, every step) and revert one that made steps slower, as the re-planner does.
        ``micro_timings``: the smoothers get each micro-batch's time, as the step timer hands
        them over (``False``: only the step's, as before micro-batches were samples).
        """
        if len(batch_sizes) != len(self.workers):
            raise ValueError("One initial batch size per worker is needed.")
        plan = list(batch_sizes)
        result = SimulationResult()
        smoothers = [TimingSmoother() for _ in self.workers]
        for boundary in range(boundaries):
            steps = []
            key = plan_checksum(plan)
            for _ in range(steps_per_boundary):
                timings = self.step_timings(plan, boundary)
                steps.append(max(t for t, _ in timings))
                for smoother, b, (t, micro) in zip(smoothers, plan, timings):
                    smoother.update(b, t, 0.0, plan=key, micro=micro if micro_timings else ())
            for smoother in smoothers:
                smoother.mark()
            compute_s = [s.compute_s for s in smoothers]
            stats = [
                replace(stat, compute_se=s.compute_se)
                for stat, s in zip(self.stats_at(plan, boundary), smoothers)
            ]
            step_se = stdev(steps) / sqrt(len(steps)) if len(steps) > 1 else nan
            back = (
                None
                if guard is None
                else guard.review(plan, fmean(steps), step_se, len(steps), compute_s)
            )
            new_plan = controller.update(plan, compute_s, limits, stats)
            if back is not None:
                new_plan = back
                controller.plan_imposed(back)
            elif guard is not None:
                new_plan = guard.propose(plan, new_plan)
            result.history.append(
                {
                    "boundary": boundary,
                    "batch_sizes": plan,
                    "compute_times": compute_s,
                    "balance": balance_efficiency(plan, self.true_step_s(plan, boundary)),
                    "measured_balance": balance_efficiency(plan, compute_s),
                    "changed": new_plan != plan,
                    "reverted": back is not None,
                    "stats": stats,
                }
            )
            plan = new_plan
        return result
