"""Simulated shared machines whose speed follows their free resources (paper 001, section 5.3).

Paper 001 evaluates its predictors on CPU workers that share hosts with other jobs
(Cluster-B, replaying a Google cluster trace): a co-located job takes CPU and memory
while it runs, and the training worker slows down. This module generates such traces
for the [`ClusterSimulator`][lightning_hetero.planning.ClusterSimulator] and scores the speed
predictors of ``predictors`` on them, in the manner of the
paper's Table 3.

How a trace is made, per worker, on a grid of training steps (20 per interval between
two boundaries by default):

* **co-located jobs** arrive at random (Poisson, ``jobs_per_boundary`` per interval).
  Each takes 10-40% of the host's CPU and, as bigger jobs tend to, a proportional
  25-75% of that as memory. Half are *short* (2 steps to half an interval: spikes),
  the others *long* (4-15 intervals: phases). The host's own background takes up to
  10% of the CPU and 30-45% of the memory.
* the training worker runs on what is left: with ``c`` the free CPU share and ``m``
  the free memory share, its speed relative to an idle host is ``c ** 0.8`` (parallel
  efficiency below 1), divided by up to 3 when ``m`` falls under 15% (swapping).
* **hiccups**: now and then (``hiccup_probability`` of the intervals) a whole interval
  runs 20-50% slower while CPU and memory look normal: disk or network contention,
  garbage collection, throttling, the resources no reading covers.

What a controller sees at boundary ``i``, and when (the assumption that decides how
useful the readings are):

* the measured speed of interval ``i``: the harmonic mean of its step speeds (the
  simulator holds one speed per interval, the mean step time of the real one; the real
  [`TimingSmoother`][lightning_hetero.planning.TimingSmoother] restarts at a speed change, which
  would make the last speed a somewhat better predictor than here);
* ``cpu_available``: the free CPU share *averaged over* interval ``i``, as
  ``ResourceMeter`` reads it (``psutil.cpu_percent``
  since the previous reading). It covers the same time as the speed;
* ``memory_available``: the free memory share *at* the boundary, an instantaneous
  reading (``psutil.virtual_memory``). A job that started or ended late in the
  interval shows in full here, but only in part in the speed and the CPU average.

Neither reading sees the future: a job that starts during interval ``i + 1`` is a
surprise to every predictor. Readings carry a small Gaussian error (``reading_noise``).
"Free" means not taken by *other* jobs, the share the training worker can use, as in
paper 001's leftover-resource setting.
"""

import math
import random
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from statistics import fmean, median
from typing import Any

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats
from lightning_hetero.planning.lbbsp import LBBSPController
from lightning_hetero.planning.predictors import relative_rmse
from lightning_hetero.planning.simulator import HETEROGENEITY_LEVELS, ClusterSimulator
from lightning_hetero.planning.split import proportional_split

__all__ = ["ResourceTrace", "predictor_report", "resource_simulator", "resource_trace"]


@dataclass(frozen=True)
class ResourceTrace:
    """Per-interval speed multipliers and readings of simulated shared workers.

    Attributes:
        speeds: ``speeds[i][k]``, worker ``k``'s speed during interval ``i`` relative to
            running alone (1.0).
        availability: ``availability[i][k] = (cpu_available, memory_available)``, what
            worker ``k`` reports at the end of interval ``i``.
    """

    speeds: list[list[float]]
    availability: list[list[tuple[float, float]]]


def _worker_trace(
    rng: random.Random,
    boundaries: int,
    steps_per_boundary: int,
    jobs_per_boundary: float,
    short_fraction: float,
    hiccup_probability: float,
    reading_noise: float,
) -> tuple[list[float], list[tuple[float, float]]]:
    steps = boundaries * steps_per_boundary
    cpu_taken = [rng.uniform(0.0, 0.1)] * steps
    memory_taken = [rng.uniform(0.3, 0.45)] * steps  # the OS, the training job itself
    step = 0
    rate = jobs_per_boundary / steps_per_boundary
    while True:
        step += max(1, round(rng.expovariate(rate)))
        if step >= steps:
            break
        if rng.random() < short_fraction:
            duration = rng.randint(2, steps_per_boundary // 2)
        else:
            duration = rng.randint(4 * steps_per_boundary, 15 * steps_per_boundary)
        cpu = rng.uniform(0.1, 0.4)
        memory = cpu * rng.uniform(0.25, 0.75)
        for s in range(step, min(steps, step + duration)):
            cpu_taken[s] += cpu
            memory_taken[s] += memory

    speeds, readings = [], []
    for i in range(boundaries):
        span = range(i * steps_per_boundary, (i + 1) * steps_per_boundary)
        free_cpu = [max(0.1, 1.0 - cpu_taken[s]) for s in span]
        free_memory = [max(0.02, 1.0 - memory_taken[s]) for s in span]
        step_s = [
            1.0 / (c**0.8 / (1.0 + 2.0 * max(0.0, 0.15 - m) / 0.15))
            for c, m in zip(free_cpu, free_memory)
        ]
        speed = len(step_s) / math.fsum(step_s)
        # Both draws every time, so that the probability changes nothing else in the trace.
        hiccup, slowdown = rng.random(), rng.uniform(0.5, 0.8)
        if hiccup < hiccup_probability:
            speed *= slowdown
        cpu_reading = math.fsum(free_cpu) / len(free_cpu) + rng.gauss(0.0, reading_noise)
        memory_reading = free_memory[-1] + rng.gauss(0.0, reading_noise)
        speeds.append(speed)
        readings.append((min(1.0, max(0.0, cpu_reading)), min(1.0, max(0.0, memory_reading))))
    return speeds, readings


def resource_trace(
    workers: int = 4,
    boundaries: int = 60,
    steps_per_boundary: int = 20,
    seed: int = 0,
    jobs_per_boundary: float = 0.15,
    short_fraction: float = 0.5,
    hiccup_probability: float = 0.1,
    reading_noise: float = 0.01,
) -> ResourceTrace:
    """Generate speeds and readings of ``workers`` shared hosts (see the module docstring).

    Args:
        workers: number of workers.
        boundaries: number of intervals.
        steps_per_boundary: steps per interval (the resolution of job start and end).
        seed: seed of the trace; each worker draws its own jobs.
        jobs_per_boundary: mean number of co-located jobs arriving per interval and worker.
        short_fraction: share of the jobs that last less than half an interval.
        hiccup_probability: chance that an interval runs slow with no trace in the readings.
        reading_noise: standard deviation of the error of each reading.

    Example:
        >>> trace = resource_trace(workers=2, boundaries=3, seed=1)
        >>> len(trace.speeds), len(trace.availability[0])
        (3, 2)
    """
    if workers < 1 or boundaries < 1 or steps_per_boundary < 4:
        raise ValueError(
            "`workers` and `boundaries` must be >= 1 and `steps_per_boundary` >= 4, got"
            f" {workers}, {boundaries}, {steps_per_boundary}."
        )
    if jobs_per_boundary <= 0:
        raise ValueError(f"`jobs_per_boundary` must be > 0, got {jobs_per_boundary}.")
    for option, value in [
        ("short_fraction", short_fraction),
        ("hiccup_probability", hiccup_probability),
    ]:
        if not 0.0 <= value <= 1.0:
            raise ValueError(f"`{option}` must be in [0, 1], got {value}.")
    if reading_noise < 0:
        raise ValueError(f"`reading_noise` must be >= 0, got {reading_noise}.")
    rng = random.Random(seed)
    per_worker = [
        _worker_trace(
            random.Random(rng.getrandbits(64)),
            boundaries,
            steps_per_boundary,
            jobs_per_boundary,
            short_fraction,
            hiccup_probability,
            reading_noise,
        )
        for _ in range(workers)
    ]
    return ResourceTrace(
        speeds=[[w[0][i] for w in per_worker] for i in range(boundaries)],
        availability=[[w[1][i] for w in per_worker] for i in range(boundaries)],
    )


def resource_simulator(
    seed: int = 0,
    base_speeds: Sequence[float] = HETEROGENEITY_LEVELS["HL2"],
    boundaries: int = 60,
    noise: float = 0.02,
    **trace_options: float,
) -> ClusterSimulator:
    """A [`ClusterSimulator`][lightning_hetero.planning.traces.ClusterSimulator] of heterogeneous
    hosts shared with other jobs.

    Worker ``k`` runs at ``base_speeds[k]`` (relative) times the trace's speed during each
    interval, and reports the trace's readings through
    [`RankStats`][lightning_hetero.planning.RankStats].

    Args:
        seed: seed of the trace and of the timing noise.
        base_speeds: speeds of the hosts when running alone.
        boundaries: intervals in the trace (later boundaries keep the last interval).
        noise: relative timing noise of each step.
        trace_options: further ``resource_trace`` options.

    Example:
        >>> sim = resource_simulator(seed=0, boundaries=10)
        >>> stats = sim.stats_at([64] * 4, 3)
        >>> 0.0 <= stats[0].cpu_available <= 1.0
        True
    """
    trace = resource_trace(len(base_speeds), boundaries, seed=seed, **trace_options)
    return ClusterSimulator.from_speeds(
        base_speeds,
        noise=noise,
        speed_changes=dict(enumerate(trace.speeds)),
        availability=dict(enumerate(trace.availability)),
        seed=seed,
    )


class _Recorder(Controller):
    """Runs another controller and keeps the speeds it predicted at every boundary."""

    def __init__(self, inner: LBBSPController) -> None:
        self.inner = inner
        self.name = inner.name
        self.predictions: list[list[float]] = []

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        plan = self.inner.update(batch_sizes, compute_s, limits, stats)
        self.predictions.append(list(self.inner.predicted_speeds))
        return plan


class _Oracle(Controller):
    """Plans each interval from its true, noise-free speeds: perfect prediction."""

    name = "oracle"

    def __init__(self, sim: ClusterSimulator) -> None:
        self.sim = sim
        self.boundary = 0
        self.predictions: list[list[float]] = []

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        self.boundary += 1
        step_s = self.sim.true_step_s(batch_sizes, self.boundary)
        speeds = [b / t for b, t in zip(batch_sizes, step_s)]
        self.predictions.append(speeds)
        return proportional_split(
            speeds, limits.global_batch_size, limits.min_batch_size, limits.max_batch_size
        )


def _spread(name: str, values: list[float]) -> dict[str, float]:
    return {
        name: fmean(values),
        f"{name}_min": min(values),
        f"{name}_median": median(values),
        f"{name}_max": max(values),
    }


def predictor_report(
    seeds: Iterable[int] = range(5),
    predictors: Sequence[str] = ("last", "ema", "narx"),
    boundaries: int = 200,
    score_from: int = 40,
    deadband: float = 0.0,
    global_batch_size: int = 256,
    steps_per_boundary: int = 20,
    **options: Any,
) -> list[dict[str, Any]]:
    """Score speed predictors inside LB-BSP on resource traces (paper 001, Table 3).

    For every seed, ``resource_simulator`` makes a four-worker cluster; LB-BSP runs
    on it with each predictor from a uniform start, and an *oracle* that knows every
    interval's true speed in advance gives the reference. Two numbers per run, over the
    boundaries from ``score_from`` on (the earlier ones are the NARX warm-up):

    * ``rmse``: the normalised RMSE of the one-step-ahead prediction, per rank
      ``sqrt(mean((v_hat_i - v_i)^2)) / mean(v_i)`` with ``v_i`` the speed measured in
      interval ``i`` and ``v_hat_i`` the prediction made for it a boundary earlier,
      averaged over the ranks. The oracle's value is the floor set by timing noise.
    * ``step_s``: the mean true step time ``max_k t_k``; ``vs_uniform`` divides it by the
      step time of the uniform plan on the same trace (the paper's "normalised by BSP").

    Args:
        seeds: trace seeds; each row averages over them and gives min, median and max.
        predictors: predictor names, in row order; the oracle row comes last.
        boundaries: intervals per run.
        score_from: first boundary scored.
        deadband: LB-BSP dead-band; 0 re-plans every boundary, as paper 001 does.
        global_batch_size: ``B``, split over the four workers.
        steps_per_boundary: steps between boundaries.
        options: further [`LBBSPController`][lightning_hetero.planning.traces.LBBSPController]
            options (NARX settings).

    Returns:
        One dict per predictor with ``predictor``, ``rmse``, ``step_s``, ``vs_uniform`` and
        ``plan_changes`` (means over the seeds), plus ``_min``, ``_median`` and ``_max`` of
        ``rmse`` and ``step_s``.

    Example:
        >>> rows = predictor_report(seeds=[0], predictors=["last"], boundaries=12, score_from=2)
        >>> [row["predictor"] for row in rows], rows[-1]["rmse"] < rows[0]["rmse"]
        (['last', 'oracle'], True)
    """
    seeds = list(seeds)
    if not seeds:
        raise ValueError("`seeds` must not be empty.")
    if not 0 <= score_from < boundaries - 1:
        raise ValueError(
            f"`score_from` must be in [0, boundaries - 1), got {score_from} with"
            f" {boundaries} boundaries."
        )
    workers = len(HETEROGENEITY_LEVELS["HL2"])
    limits = BatchLimits.build(workers, global_batch_size)
    uniform = proportional_split([1.0] * workers, global_batch_size)
    scores: dict[str, dict[str, list[float]]] = {
        name: {"rmse": [], "step_s": [], "vs_uniform": [], "plan_changes": []}
        for name in [*predictors, "oracle"]
    }
    for seed in seeds:
        for name in [*predictors, "oracle"]:
            sim = resource_simulator(
                seed, boundaries=boundaries, steps_per_boundary=steps_per_boundary
            )
            controller: _Recorder | _Oracle
            if name == "oracle":
                controller = _Oracle(sim)
            else:
                lbbsp = LBBSPController(predictor=name, deadband=deadband, **options)
                controller = _Recorder(lbbsp)
            result = sim.run(controller, uniform, limits, boundaries, steps_per_boundary)
            history = result.history
            errors = []
            for rank in range(workers):
                measured = [
                    entry["batch_sizes"][rank] / entry["compute_times"][rank]
                    for entry in history[score_from + 1 :]
                ]
                guesses = [p[rank] for p in controller.predictions[score_from:-1]]
                errors.append(relative_rmse(guesses, measured))
            scored = range(score_from, boundaries)
            step_s = fmean(max(sim.true_step_s(result.plans[i], i)) for i in scored)
            uniform_s = fmean(max(sim.true_step_s(uniform, i)) for i in scored)
            scores[name]["rmse"].append(fmean(errors))
            scores[name]["step_s"].append(step_s)
            scores[name]["vs_uniform"].append(step_s / uniform_s)
            scores[name]["plan_changes"].append(
                sum(entry["changed"] for entry in history[score_from:])
            )
    return [
        {
            "predictor": name,
            **_spread("rmse", values["rmse"]),
            **_spread("step_s", values["step_s"]),
            "vs_uniform": fmean(values["vs_uniform"]),
            "plan_changes": fmean(values["plan_changes"]),
        }
        for name, values in scores.items()
    ]
