"""Which rank sets the pace of synchronous steps, and what re-planning would gain: the pure
decisions of [`StragglerReport`][lightning_hetero.StragglerReport] (numbers only, no torch)."""

import math
import statistics
from collections.abc import Sequence
from typing import NamedTuple

from lightning_hetero.planning.base import BatchLimits
from lightning_hetero.planning.model import StepTimeCurve, allowed_speedup, solve_plan

__all__ = [
    "RankTiming",
    "Verdict",
    "pace_setter",
    "summarize_steps",
    "verdict",
    "with_earlier_point",
    "with_latest_other_size",
]

#: Relative gap below which no rank is named, however small the noise: ranks of equal speed
#: on a shared machine differ by a few percent from one run to the next, and re-planning
#: gains little below it (equal ranks stay within 10% of uniform, DESIGN section 6).
MIN_GAP = 0.1
#: Standard errors of the gap that count as noise.
Z = 3.0
#: Steps a second batch size needs before its time counts as a point of the curve.
MIN_OTHER_STEPS = 2


class RankTiming(NamedTuple):
    """One rank's timed steps since the last report, as one row of numbers."""

    #: Steps timed.
    steps: int
    #: Median seconds of compute (the rank's own work, waits excluded) per step.
    compute_s: float
    #: Standard error of ``compute_s`` (from the steps' spread); 0 with one step.
    compute_se: float
    #: Mean seconds per step spent waiting for other ranks.
    wait_s: float
    #: The batch size most steps ran at (0: unknown).
    batch_size: int
    #: Another batch size at least ``MIN_OTHER_STEPS`` steps ran at (0: none) ...
    other_batch_size: int = 0
    #: ... and their median compute seconds (a second point of the step-time curve).
    other_compute_s: float = math.nan


def summarize_steps(steps: Sequence[tuple[int, float, float]]) -> RankTiming:
    """Fold ``(batch_size, compute_s, wait_s)`` of one rank's steps into a ``RankTiming``.

    Example:
        >>> summarize_steps([(8, 0.1, 0.0), (8, 0.3, 0.0), (8, 0.2, 0.1), (3, 0.05, 0.0)])[:2]
        (4, 0.15000000000000002)
    """
    if not steps:
        return RankTiming(0, math.nan, math.nan, math.nan, 0)
    computes = [t for _, t, _ in steps]
    by_size: dict[int, list[float]] = {}
    for b, t, _ in steps:
        by_size.setdefault(int(b), []).append(t)
    # most steps first, then the larger size
    sizes = sorted(by_size, key=lambda b: (len(by_size[b]), b), reverse=True)
    spread = statistics.stdev(computes) if len(computes) > 1 else 0.0
    # a second size timed in one step only (an epoch's short last batch) is too noisy to fit
    # a fixed cost through
    other = sizes[1] if len(sizes) > 1 and len(by_size[sizes[1]]) >= MIN_OTHER_STEPS else 0
    return RankTiming(
        steps=len(steps),
        compute_s=statistics.median(computes),
        # the standard error of a median: sqrt(pi / 2) that of a mean
        compute_se=1.2533 * spread / math.sqrt(len(computes)),
        wait_s=statistics.fmean(w for _, _, w in steps),
        batch_size=sizes[0],
        other_batch_size=other,
        other_compute_s=statistics.median(by_size[other]) if other else math.nan,
    )


def with_earlier_point(timing: RankTiming, earlier: RankTiming | None) -> RankTiming:
    """``timing`` with ``earlier``'s main point as its second point of the step-time curve,
    where it has none of its own and the rank's batch size changed since (under a hetero
    strategy the plan moves between reports): a rank at one sample with a fixed per-step
    cost, fitted through the origin, would read as many times slower than it is.

    Example:
        >>> now, before = RankTiming(9, 0.26, 0.0, 0.0, 1), RankTiming(9, 0.5, 0.0, 0.0, 16)
        >>> with_earlier_point(now, before)[-2:]
        (16, 0.5)
    """
    usable = earlier is not None and earlier.batch_size > 0 and math.isfinite(earlier.compute_s)
    if timing.other_batch_size or not usable or earlier.batch_size == timing.batch_size:
        return timing
    return timing._replace(other_batch_size=earlier.batch_size, other_compute_s=earlier.compute_s)


def with_latest_other_size(timing: RankTiming, by_size: dict[int, RankTiming]) -> RankTiming:
    """``with_earlier_point`` from the latest of this rank's reports at another batch size
    (``by_size``: its latest report at each size, the most recent last, which ``timing``
    joins): a plan that settled keeps the point from before it moved.

    Example:
        >>> seen = {}
        >>> for b, t in ((16, 0.5), (1, 0.26), (1, 0.27)):
        ...     now = with_latest_other_size(RankTiming(9, t, 0.0, 0.0, b), seen)
        >>> now.other_batch_size, now.other_compute_s
        (16, 0.5)
    """
    earlier = next((t for b, t in reversed(by_size.items()) if b != timing.batch_size), None)
    if timing.batch_size > 0 and math.isfinite(timing.compute_s):
        by_size.pop(timing.batch_size, None)
        by_size[timing.batch_size] = timing
    return with_earlier_point(timing, earlier)


def pace_setter(
    compute_s: Sequence[float],
    compute_se: Sequence[float] | None = None,
    min_gap: float = MIN_GAP,
    z: float = Z,
) -> int | None:
    """The rank whose compute sets the pace, or ``None`` when none is slower beyond the noise.

    The slowest rank (the lowest such rank on a tie) is named when its compute exceeds the
    median of the other ranks' by more than ``z`` standard errors of that difference (the
    steps' spread) and by more than ``min_gap`` of it. Ranks without a finite time are left out.

    Example:
        >>> pace_setter([0.05, 0.25, 0.05, 0.05], [0.002] * 4)
        1
        >>> pace_setter([0.050, 0.052], [0.002, 0.002]) is None  # within the noise
        True
    """
    ses = list(compute_se) if compute_se is not None else [0.0] * len(compute_s)
    ranks = [k for k, t in enumerate(compute_s) if math.isfinite(t) and t > 0]
    if len(ranks) < 2:
        return None
    slowest = max(ranks, key=lambda k: (compute_s[k], -k))
    others = sorted((k for k in ranks if k != slowest), key=lambda k: compute_s[k])
    middle = others[(len(others) - 1) // 2 : len(others) // 2 + 1]  # the median's rank(s)
    reference = statistics.fmean(compute_s[k] for k in middle)
    reference_se = statistics.fmean(_finite(ses[k]) for k in middle)
    gap = compute_s[slowest] - reference
    noise = z * math.hypot(_finite(ses[slowest]), reference_se)
    return slowest if gap > noise and gap > min_gap * reference else None


def _finite(value: float) -> float:
    return value if math.isfinite(value) else 0.0


class Verdict(NamedTuple):
    """A report's decision: who sets the pace, by how much, and what re-planning allows."""

    #: The pace-setting global rank, or ``None``.
    pace_setter: int | None
    #: Its compute over the median of the others' (1.0 without a pace-setter or timings).
    slower_by: float
    #: The step-time speedup over the uniform plan the measured costs allow
    #: ([`allowed_speedup`][lightning_hetero.planning.model.allowed_speedup]); NaN without
    #: timings on every rank.
    allowed_speedup: float
    #: The plan the curves' optimum takes (``solve_plan``); empty without timings.
    plan: list[int]


def verdict(rows: Sequence[RankTiming], min_gap: float = MIN_GAP, z: float = Z) -> Verdict:
    """Decide a report from every rank's ``RankTiming``: ``pace_setter`` of their compute,
    and the planner's allowed speedup and optimal plan for the global batch
    ``sum(batch_size)`` on each rank's curve (two sizes: a fixed per-step cost is fitted).

    Example:
        >>> rows = [RankTiming(9, 0.1, 0.001, 0.2, 16), RankTiming(9, 0.3, 0.001, 0.0, 16)]
        >>> v = verdict(rows)
        >>> v.pace_setter, round(v.slower_by, 2), round(v.allowed_speedup, 2), v.plan
        (1, 3.0, 2.0, [24, 8])
    """
    compute = [row.compute_s for row in rows]
    setter = pace_setter(compute, [row.compute_se for row in rows], min_gap, z)
    slower_by = 1.0
    if setter is not None:
        others = [t for k, t in enumerate(compute) if k != setter and math.isfinite(t)]
        slower_by = compute[setter] / statistics.median(others)
    usable = all(
        row.steps > 0 and row.batch_size > 0 and math.isfinite(row.compute_s) and row.compute_s > 0
        for row in rows
    )
    if not usable or not rows:
        return Verdict(setter, slower_by, math.nan, [])
    observations = []
    for row in rows:
        points = [(row.batch_size, row.compute_s)]
        if row.other_batch_size and math.isfinite(row.other_compute_s):
            points.append((row.other_batch_size, row.other_compute_s))
        observations.append(sorted(points))
    limits = BatchLimits.build(len(rows), sum(row.batch_size for row in rows))
    allowed = allowed_speedup(observations, limits)
    plan = solve_plan([StepTimeCurve.fit(points) for points in observations], limits)
    return Verdict(setter, slower_by, allowed, plan)
