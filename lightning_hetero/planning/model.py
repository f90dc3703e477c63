"""Plan on fitted step-time curves: a step has a fixed cost besides its per-sample cost.

The proportional controller takes all of a step's time to be per-sample work,
``t_k = b_k / X_k``. Real steps also pay a cost that does not shrink with the batch
(kernel launches, the optimizer, the framework's loop) and devices that run small
batches no faster than larger ones (a GPU that is not full). Here each rank's step time
is a curve ``t_k(b)`` fitted to the ``(b_k, t_k)`` pairs seen at boundaries, and the plan
is the integer split that minimises the slowest rank's predicted time.
"""

import heapq
from bisect import bisect_left, bisect_right
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from functools import partial
from itertools import accumulate
from math import floor, inf, isfinite, nan
from operator import mul, truediv
from typing import Any

from lightning_hetero.planning.base import (
    BatchLimits,
    Controller,
    Deadband,
    RankStats,
    check_deadband,
    check_inputs,
    noise_deadband,
)
from lightning_hetero.planning.proportional import LearnedMaximum
from lightning_hetero.planning.split import proportional_split

__all__ = [
    "ModelController",
    "StepTimeCurve",
    "allowed_speedup",
    "optimal_step_time",
    "solve_plan",
]

#: Smallest slope a fitted line gets, as a fraction of the rank's mean time per sample at
#: its points (a fixed cost of at most about 90% of a step). The min-max plan loads the ranks
#: whose fits look cheapest; among a thousand noisy fits a few look flat, and a flat rank
#: looks free: with K = 1,024 simulated ranks and 2% noise, a floor of 0.001 let such
#: ranks take whole multiples of their share (balance down to 0.1); 0.05 and above did not.
_MIN_SLOPE_FRACTION = 0.1


@dataclass(frozen=True)
class StepTimeCurve:
    """Seconds of one step as a non-decreasing piecewise-linear function of the batch size.

    The curve runs through the knots ``(sizes[i], times[i])`` (``sizes[0] == 0``, sizes
    increasing, times non-decreasing) and goes on beyond the last knot with ``slope``
    seconds per sample. An affine curve ``t(b) = c + s*b`` is one knot ``(0, c)`` and slope
    ``s``: ``c`` is the fixed cost of a step, ``s`` the cost of each sample.

    Example:
        >>> curve = StepTimeCurve.fit([(32, 0.5), (64, 0.9)])
        >>> round(curve.intercept, 6), round(curve.slope, 6), round(curve(48), 6)
        (0.1, 0.0125, 0.7)
        >>> flat_then_linear = StepTimeCurve((0.0, 24.0), (0.3, 0.3), 0.0125)
        >>> flat_then_linear(8), flat_then_linear(40)
        (0.3, 0.5)
    """

    sizes: tuple[float, ...]
    times: tuple[float, ...]
    slope: float

    def __post_init__(self) -> None:
        sizes, times = self.sizes, self.times
        if not sizes or len(sizes) != len(times) or sizes[0] != 0:
            raise ValueError(
                f"A curve needs knots starting at size 0, one time each; got sizes {sizes},"
                f" times {times}."
            )
        if any(not isfinite(v) for v in (*sizes, *times, self.slope)):
            raise ValueError(f"Curve knots and slope must be finite, got {self}.")
        if any(b >= a for a, b in zip(sizes[1:], sizes)) or any(
            t > u for t, u in zip(times, times[1:])
        ):
            raise ValueError(
                f"Knot sizes must increase and times must not decrease; got {sizes}, {times}."
            )
        if times[0] < 0 or self.slope <= 0:
            raise ValueError(
                f"A curve needs times >= 0 and a slope > 0 past its last knot, got {self}."
            )

    @classmethod
    def affine(cls, intercept: float, slope: float) -> "StepTimeCurve":
        """The line ``intercept + slope * b`` (seconds, seconds per sample)."""
        return cls((0.0,), (float(intercept),), float(slope))

    @classmethod
    def fit(cls, points: Sequence[tuple[float, float]], tolerance: float = 0.05) -> "StepTimeCurve":
        """The curve through measured ``(batch_size, seconds)`` points.

        * One size: the line through the point and the origin (all of the time per
          sample, as the proportional controller assumes).
        * Otherwise the line ``c + s*b`` with ``c >= 0`` that minimises the relative
          residuals ``sum(((c + s*b) / t - 1)**2)``, as
          [`TimeModel.fit`][lightning_hetero.planning.TimeModel.fit] does for the dual
          batch planner, with a slope of at least a tenth of the mean time per sample
          (never a flat line: a rank that looks free gets flooded). If that line leaves a
          root mean square relative residual above ``tolerance`` (a flat start, a memory
          cliff, a curve steeper than one through the origin), the curve is instead the
          non-decreasing piecewise-linear interpolation of the points, extended towards 0
          by its first segment (through the origin if that segment would cross it) and past
          the largest point by its last segment, or by the line's slope if that is steeper.

        A size given twice counts once, with the later time.

        Raises:
            ValueError: no point, a size below 1, or a time that is not finite and positive.
        """
        latest: dict[float, float] = {}
        for size, seconds in points:
            if not (size >= 1 and isfinite(seconds) and seconds > 0):
                raise ValueError(
                    f"Points need batch sizes >= 1 and finite positive times, got {points}."
                )
            latest.pop(float(size), None)
            latest[float(size)] = float(seconds)
        if not latest:
            raise ValueError("Fitting a step-time curve needs at least one point.")
        points = list(latest.items())
        intercepts, slopes, bent = _fit_lines(
            [_sums(points[:-1])], [len(points)], [points[-1][0]], [points[-1][1]], tolerance
        )
        if not bent:
            return cls.affine(intercepts[0], slopes[0])
        return _piecewise(sorted(points), slopes[0])

    @property
    def intercept(self) -> float:
        """Predicted seconds of a step of zero samples: the fixed cost."""
        return self.times[0]

    @property
    def is_affine(self) -> bool:
        return len(self.sizes) == 1

    def __call__(self, batch_size: float) -> float:
        """Predicted seconds of one step at ``batch_size``."""
        i = bisect_right(self.sizes, batch_size) - 1
        if i == len(self.sizes) - 1:
            return self.times[i] + self.slope * (batch_size - self.sizes[i])
        b0, b1, t0, t1 = self.sizes[i], self.sizes[i + 1], self.times[i], self.times[i + 1]
        return t0 + (t1 - t0) * (batch_size - b0) / (b1 - b0)

    def largest_within(self, step_s: float) -> float:
        """The largest real batch size whose predicted time is at most ``step_s``.

        ``-inf`` when even an empty batch takes longer.
        """
        times = self.times
        if step_s < times[0]:
            return -inf
        i = bisect_right(times, step_s) - 1
        if i == len(times) - 1:
            return self.sizes[i] + (step_s - times[i]) / self.slope
        b0, b1, t0, t1 = self.sizes[i], self.sizes[i + 1], times[i], times[i + 1]
        return b0 + (b1 - b0) * (step_s - t0) / (t1 - t0)


def _sums(points: Any) -> tuple[float, float, float, float, float]:
    """The sums over ``(b, t)`` points that the relative least-squares line needs.

    With ``i = 1/t`` and ``u = b/t``: ``sum(i*i), sum(u*i), sum(u*u), sum(i), sum(u)``.
    Summed in the order given, so that the controller, which keeps the sums of all but a
    rank's latest point, gets the same numbers as a fit of all of them.
    """
    s0 = s1 = s2 = y0 = y1 = 0.0
    for b, t in points:
        inv = 1.0 / t
        u = b * inv
        s0 += inv * inv
        s1 += u * inv
        s2 += u * u
        y0 += inv
        y1 += u
    return s0, s1, s2, y0, y1


_NO_SUMS = (0.0, 0.0, 0.0, 0.0, 0.0)


def _fit_lines(
    older_sums: Sequence[tuple[float, float, float, float, float]],
    counts: Sequence[int],
    sizes: Sequence[float],
    times: Sequence[float],
    tolerance: float,
) -> tuple[list[float], list[float], list[int]]:
    """Relative least-squares lines of many ranks at once.

    Rank ``k`` has ``counts[k]`` points: its latest, ``(sizes[k], times[k])``, and older ones
    whose ``_sums`` are ``older_sums[k]``. Returns the intercepts, the slopes, and the
    ranks no line fits within ``tolerance`` (root mean square relative residual). One loop
    of plain arithmetic, since the controller runs it on every rank at every boundary.
    """
    intercepts: list[float] = []
    slopes: list[float] = []
    bent: list[int] = []
    limit, floor_share = tolerance * tolerance, _MIN_SLOPE_FRACTION
    for k, ((r0, r1, r2, q0, q1), n, b, t) in enumerate(zip(older_sums, counts, sizes, times)):
        if n == 1:  # no slope to go on: the line through 0
            intercepts.append(0.0)
            slopes.append(t / b)
            continue
        inv = 1.0 / t
        u = b * inv
        s0 = r0 + inv * inv
        s1 = r1 + u * inv
        s2 = r2 + u * u
        y0 = q0 + inv
        y1 = q1 + u
        # Normal equations of min sum((c/t + s*b/t - 1)^2).
        det = s0 * s2 - s1 * s1
        slope = (s0 * y1 - s1 * y0) / det
        intercept = (s2 * y0 - s1 * y1) / det
        if intercept >= 0 and slope * y1 >= floor_share * n:
            # The least-squares residual of the unclipped line is n - c*y0 - s*y1 (zero for
            # two points).
            if n > 2 and n - intercept * y0 - slope * y1 > limit * n:
                bent.append(k)
        else:
            if intercept < 0:  # steeper than a line through 0: no negative fixed cost
                intercept, slope = 0.0, y1 / s2
            if slope * y1 < floor_share * n:
                slope = floor_share * n / y1
                intercept = max((y0 - slope * s1) / s0, 0.0)
            residual = (
                intercept * (intercept * s0 + 2.0 * slope * s1 - 2.0 * y0)
                + slope * (slope * s2 - 2.0 * y1)
                + n
            )
            if residual > limit * n:
                bent.append(k)
        intercepts.append(intercept)
        slopes.append(slope)
    return intercepts, slopes, bent


def _piecewise(points: Sequence[tuple[float, float]], line_slope: float) -> StepTimeCurve:
    """The non-decreasing interpolation of points sorted by size (see
    [`StepTimeCurve.fit`][lightning_hetero.planning.model.StepTimeCurve.fit]).

    Past the last point it rises at least as steeply as the best line, ``line_slope``.
    """
    sizes = [b for b, _ in points]
    times = _non_decreasing([t for _, t in points])
    first = (times[1] - times[0]) / (sizes[1] - sizes[0])
    intercept = max(times[0] - first * sizes[0], 0.0)
    last = max((times[-1] - times[-2]) / (sizes[-1] - sizes[-2]), line_slope)
    return StepTimeCurve((0.0, *sizes), (intercept, *times), last)


def _non_decreasing(times: list[float]) -> list[float]:
    """The closest non-decreasing sequence in least squares (pool adjacent violators)."""
    blocks: list[list[float]] = []  # [mean, count]
    for t in times:
        blocks.append([t, 1.0])
        while len(blocks) > 1 and blocks[-2][0] > blocks[-1][0]:
            mean, count = blocks.pop()
            prev = blocks[-1]
            prev[0] = (prev[0] * prev[1] + mean * count) / (prev[1] + count)
            prev[1] += count
    return [mean for mean, count in blocks for _ in range(int(count))]


# --- the exact integer solve --------------------------------------------------------------------


def _sweep(
    intercepts: Sequence[float],
    slopes: Sequence[float],
    knotted: dict[int, StepTimeCurve],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
) -> float:
    """The water level ``L``: the least time at which the real-valued sizes reach ``total``.

    Each rank takes the largest real batch within ``[lower, upper]`` that it finishes
    within ``L`` (its lower bound when even that takes longer). The sum grows with ``L``
    piecewise linearly, bending where a rank reaches a bound or a knot (and jumping along
    a flat segment): sorting the ``N`` bends, summing up the pieces in between and
    bisecting those sums finds ``L`` in ``O(N log N)``.
    """
    columns = (intercepts, slopes, lower, upper)
    if knotted:  # the affine ranks' columns
        columns = tuple([v for k, v in enumerate(col) if k not in knotted] for col in columns)
    cs, ss, los, his = columns
    at = [c + s * lo for c, s, lo in zip(cs, ss, los)]  # when the sum bends
    at += [c + s * hi for c, s, hi in zip(cs, ss, his)]
    rate = [1.0 / s for s in ss]  # how its slope changes there
    rate += [-r for r in rate]
    jump = [0.0] * len(at)  # how much it jumps there
    for k, curve in knotted.items():
        lo, hi = lower[k], upper[k]
        sizes = [float(lo), *(b for b in curve.sizes if lo < b < hi), float(hi)]
        times = [curve(b) for b in sizes]
        for b0, b1, t0, t1 in zip(sizes, sizes[1:], times, times[1:]):
            if t1 > t0:
                at += (t0, t1)
                rate += ((b1 - b0) / (t1 - t0), -(b1 - b0) / (t1 - t0))
                jump += (0.0, 0.0)
            else:
                at.append(t0)
                rate.append(0.0)
                jump.append(b1 - b0)
    order = sorted(range(len(at)), key=at.__getitem__)
    at = [at[i] for i in order]
    speeds = list(accumulate([rate[i] for i in order]))  # d(sum)/dL just after each bend
    # The sum just after each bend: cumulative sums, so that no Python loop walks the bends.
    steps = [
        speed * (when - before) for speed, when, before in zip([0.0, *speeds], at, [at[0], *at])
    ]
    if knotted:
        steps = [step + jump[i] for step, i in zip(steps, order)]
    filled = list(accumulate(steps, initial=float(sum(lower))))
    if filled[0] >= total:  # the lower bounds alone make the total
        return -inf
    i = bisect_left(filled, total, lo=1) - 1  # the first bend after which the sum is enough
    if i >= len(at):
        return at[-1]
    speed = speeds[i - 1] if i > 0 else 0.0
    if i > 0 and speed > 0 and filled[i] + speed * (at[i] - at[i - 1]) >= total:
        return min(at[i - 1] + (total - filled[i]) / speed, at[i])  # between two bends
    return at[i]  # at a bend (a jump, or rounding)


def _solve(
    intercepts: Sequence[float],
    slopes: Sequence[float],
    knotted: dict[int, StepTimeCurve],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
) -> tuple[list[int], float]:
    """The integer plan that minimises the largest predicted step time, and that time.

    Rank ``k``'s curve is ``knotted[k]`` if present, else ``intercepts[k] + slopes[k] * b``.
    Every curve must be non-decreasing and the bounds must admit a plan.
    """
    plan: list[int] | None = None
    if not knotted:
        plan = _pegged(intercepts, slopes, total, lower, upper)
    if plan is None:
        level = _sweep(intercepts, slopes, knotted, total, lower, upper)
        # Raised by half a sample per rank that no bound holds, as above (a piecewise rank
        # counts by the line of its last segment: only the amount raised depends on it).
        free = [
            1.0 / s
            for c, s, lo, hi in zip(intercepts, slopes, lower, upper)
            if c + s * lo < level < c + s * hi
        ]
        if free:
            level += 0.5 * len(free) / sum(free)
        plan = [
            lo if x < lo else hi if x > hi else int(x)
            for x, lo, hi in zip(
                [(level - c) / s for c, s in zip(intercepts, slopes)], lower, upper
            )
        ]
        for k, curve in knotted.items():
            largest = curve.largest_within(level)
            plan[k] = lower[k] if largest < lower[k] else min(floor(largest), upper[k])
    # Now every sample within the level is in the plan and every one beyond it out (up to
    # rounding); what is missing goes to the ranks whose next samples finish soonest, a
    # surplus comes off those whose last ones finish latest. That keeps the property, so
    # the result is optimal among integer plans.
    missing = total - sum(plan)
    if missing > 0:
        _add(plan, missing, intercepts, slopes, knotted, upper)
    elif missing < 0:
        _remove(plan, -missing, intercepts, slopes, knotted, lower)
    step_times = [c + s * b for c, s, b in zip(intercepts, slopes, plan)]
    for k, curve in knotted.items():
        step_times[k] = curve(plan[k])
    return plan, max(step_times)


def _pegged(
    intercepts: Sequence[float],
    slopes: Sequence[float],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
    rounds: int = 8,
) -> list[int] | None:
    """Lines only: each rank's sample count up to a level, without sorting; ``None`` if unsure.

    Most often no bound binds, and the level solves ``sum((L - c) / s) = total``. Where
    some do, the ranks that overshoot their bounds the most on one side are pegged at them
    and the level is solved again for the rest (Bitran and Hax's pegging), a few rounds at
    most. Rounding down drops half a sample per rank on average, so the counts are taken at
    a level raised by that much, which leaves fewer samples to hand out afterwards. The
    result is returned only if it holds every sample within the level and none beyond it.
    """
    inverse = [1.0 / s for s in slopes]
    level = (total + 0.5 * len(slopes) + sum(map(mul, intercepts, inverse))) / sum(inverse)
    shares = [(level - c) * i for c, i in zip(intercepts, inverse)]
    if _within(shares, lower, upper):
        return list(map(int, shares))  # shares >= lower >= 1: int() rounds down
    free: list[int] | range = range(len(slopes))
    free_lower, free_upper = lower, upper
    rest = total
    pegged: dict[int, int] = {}
    for _ in range(rounds):
        below = [(k, lo - x) for k, x, lo in zip(free, shares, free_lower) if x < lo]
        above = [(k, x - hi) for k, x, hi in zip(free, shares, free_upper) if x > hi]
        if not below and not above:
            break
        if sum([d for _, d in below]) >= sum([d for _, d in above]):
            pegged.update((k, lower[k]) for k, _ in below)
        else:
            pegged.update((k, upper[k]) for k, _ in above)
        rest = total - sum(pegged.values())
        free = [k for k in range(len(slopes)) if k not in pegged]
        if not free:
            return None
        free_lower = [lower[k] for k in free]
        free_upper = [upper[k] for k in free]
        free_i = [inverse[k] for k in free]
        free_c = [intercepts[k] for k in free]
        level = (rest + 0.5 * len(free) + sum(map(mul, free_c, free_i))) / sum(free_i)
        shares = [(level - c) * i for c, i in zip(free_c, free_i)]
    else:
        return None
    plan = [0] * len(slopes)
    for k, x in zip(free, shares):
        plan[k] = int(x)
    # Pegged ranks must agree with the final level: one at its maximum finishes it within
    # the level, one at its minimum finishes a next sample beyond it.
    for k, b in pegged.items():
        plan[k] = b
        if b == upper[k] and b > lower[k] and intercepts[k] + slopes[k] * b > level:
            return None
        if b == lower[k] and b < upper[k] and intercepts[k] + slopes[k] * (b + 1) <= level:
            return None
    return plan


def _within(values: Sequence[float], lower: Sequence[int], upper: Sequence[int]) -> bool:
    """Whether ``lower[k] <= values[k] <= upper[k]`` for every ``k``."""
    if max(lower) <= min(values) and max(values) <= min(upper):  # no bound near: one pass each
        return True
    return all([lo <= x <= hi for x, lo, hi in zip(values, lower, upper)])


def _time_at(
    intercepts: Sequence[float],
    slopes: Sequence[float],
    knotted: dict[int, StepTimeCurve],
    k: int,
    b: int,
) -> float:
    """Rank ``k``'s predicted step time at batch ``b``."""
    curve = knotted.get(k)
    return intercepts[k] + slopes[k] * b if curve is None else curve(b)


def _add(
    plan: list[int],
    count: int,
    intercepts: Sequence[float],
    slopes: Sequence[float],
    knotted: dict[int, StepTimeCurve],
    upper: Sequence[int],
) -> None:
    """Add the ``count`` samples that would finish soonest (ties to the lower rank)."""

    time = partial(_time_at, intercepts, slopes, knotted)
    following = [
        c + s * (b + 1) if b < hi else inf for c, s, b, hi in zip(intercepts, slopes, plan, upper)
    ]
    for k, curve in knotted.items():
        following[k] = curve(plan[k] + 1) if plan[k] < upper[k] else inf
    if count > len(plan) - following.count(inf):  # some rank must take several samples
        _one_by_one(plan, count, time, [(t, k) for k, t in enumerate(following)], +1, upper)
        return
    chosen = heapq.nsmallest(count, range(len(plan)), key=following.__getitem__)
    cutoff = following[chosen[-1]]
    # The answer is the ``count`` soonest next samples, unless a rank would also finish a
    # second one by the cutoff (a rank much faster per sample than the others).
    if knotted:
        more = [k for k in chosen if plan[k] + 2 <= upper[k] and time(k, plan[k] + 2) <= cutoff]
    else:
        more = [
            k
            for k in chosen
            if plan[k] + 2 <= upper[k] and intercepts[k] + slopes[k] * (plan[k] + 2) <= cutoff
        ]
    if more:
        # Every sample that finishes by the cutoff, sorted; the first ``count`` are the answer.
        candidates = [(t, k) for k, t in enumerate(following) if t <= cutoff]
        for k in more:
            b = plan[k] + 2
            while b <= upper[k] and (t := time(k, b)) <= cutoff:
                candidates.append((t, k))
                b += 1
        candidates.sort()
        chosen = [k for _, k in candidates[:count]]
    for k in chosen:
        plan[k] += 1


def _remove(
    plan: list[int],
    count: int,
    intercepts: Sequence[float],
    slopes: Sequence[float],
    knotted: dict[int, StepTimeCurve],
    lower: Sequence[int],
) -> None:
    """Take off the ``count`` samples that finish latest (ties from the higher rank)."""

    time = partial(_time_at, intercepts, slopes, knotted)
    last = [c + s * b if b > lo else -inf for c, s, b, lo in zip(intercepts, slopes, plan, lower)]
    for k, curve in knotted.items():
        last[k] = curve(plan[k]) if plan[k] > lower[k] else -inf
    if count > len(plan) - last.count(-inf):  # some rank must give up several samples
        _one_by_one(plan, count, time, [(-t, -k) for k, t in enumerate(last)], -1, lower)
        return
    key = [(t, k) for k, t in enumerate(last)]
    chosen = [k for _, k in heapq.nlargest(count, key)]
    cutoff = last[chosen[-1]]
    if knotted:
        more = [k for k in chosen if plan[k] - 1 > lower[k] and time(k, plan[k] - 1) >= cutoff]
    else:
        more = [
            k
            for k in chosen
            if plan[k] - 1 > lower[k] and intercepts[k] + slopes[k] * (plan[k] - 1) >= cutoff
        ]
    if more:
        candidates = [(t, k) for t, k in key if t >= cutoff]
        for k in more:
            b = plan[k] - 1
            while b > lower[k] and (t := time(k, b)) >= cutoff:
                candidates.append((t, k))
                b -= 1
        candidates.sort(reverse=True)
        chosen = [k for _, k in candidates[:count]]
    for k in chosen:
        plan[k] -= 1


def _one_by_one(
    plan: list[int],
    count: int,
    time: Callable[[int, int], float],
    heap: list[tuple[float, int]],
    sign: int,
    bound: Sequence[int],
) -> None:
    """``_add`` (``sign=+1``: soonest next sample first, ties to the lower rank) or
    ``_remove`` (``sign=-1``: latest last sample first, ties from the higher rank) one
    sample at a time, for when some rank takes or gives up several. ``heap`` holds
    ``(t, k)`` for adding and ``(-t, -k)`` for removing, infinite where a bound holds."""
    heapq.heapify(heap)
    for _ in range(count):
        key, rank = heapq.heappop(heap)
        k = rank if sign > 0 else -rank
        plan[k] += sign
        if plan[k] != bound[k]:
            t = time(k, plan[k] + 1) if sign > 0 else time(k, plan[k])
            heapq.heappush(heap, (t, k) if sign > 0 else (-t, -k))


def _columns(
    curves: Sequence[StepTimeCurve],
) -> tuple[list[float], list[float], dict[int, StepTimeCurve]]:
    intercepts = [curve.intercept for curve in curves]
    slopes = [curve.slope for curve in curves]
    knotted = {k: curve for k, curve in enumerate(curves) if not curve.is_affine}
    return intercepts, slopes, knotted


def solve_plan(curves: Sequence[StepTimeCurve], limits: BatchLimits) -> list[int]:
    """The integer plan within ``limits`` whose slowest rank is fastest on ``curves``.

    Exact: no integer plan that sums to the global batch within the bounds has a smaller
    largest predicted step time; among equally good plans the choice depends on the rank
    order only, so every machine makes the same one. ``O(N log N)`` for ``N`` knots and
    bounds in all (``O(K)`` plus a sort of ``K`` numbers for ``K`` lines none of whose
    bounds binds).

    Example:
        >>> line = StepTimeCurve.affine
        >>> solve_plan([line(0.1, 0.01), line(0.1, 0.02)], BatchLimits.build(2, 30))
        [20, 10]
    """
    if len(curves) != limits.world_size:
        raise ValueError(f"Expected {limits.world_size} curves (one per rank), got {len(curves)}.")
    intercepts, slopes, knotted = _columns(curves)
    plan, _ = _solve(
        intercepts,
        slopes,
        knotted,
        limits.global_batch_size,
        limits.min_batch_size,
        limits.max_batch_size,
    )
    return plan


def optimal_step_time(curves: Sequence[StepTimeCurve], limits: BatchLimits) -> float:
    """The smallest largest step time any integer plan within ``limits`` reaches on ``curves``.

    Example:
        >>> curves = [StepTimeCurve.affine(0.1, 0.01), StepTimeCurve.affine(0.1, 0.02)]
        >>> round(optimal_step_time(curves, BatchLimits.build(2, 30)), 6)
        0.3
    """
    plan = solve_plan(curves, limits)
    return max(curve(b) for curve, b in zip(curves, plan))


def allowed_speedup(
    observations: Sequence[Sequence[tuple[int, float]]],
    limits: BatchLimits,
    tolerance: float = 0.05,
) -> float:
    """The step-time speedup over the uniform plan that measured curves allow.

    Each rank's ``(batch_size, seconds)`` observations are fitted with
    [`StepTimeCurve.fit`][lightning_hetero.planning.model.StepTimeCurve.fit] (one size: all of the
    time per sample); the result is the
    fitted step time of the uniform plan (the global batch split evenly within the bounds)
    over [`optimal_step_time`][lightning_hetero.planning.model.optimal_step_time]. With fixed costs
    it is below the nominal
    ``sum(X) / (K * min(X))`` of [`ideal_speedup`][lightning_hetero.planning.ideal_speedup].

    Example:
        >>> observations = [[(64, 0.62), (81, 0.705)], [(64, 1.06), (47, 0.805)]]
        >>> round(allowed_speedup(observations, BatchLimits.build(2, 128)), 3)  # 1.06 s / 0.73 s
        1.452
    """
    if len(observations) != limits.world_size:
        raise ValueError(
            f"Expected observations for {limits.world_size} ranks, got {len(observations)}."
        )
    curves = [StepTimeCurve.fit(points, tolerance) for points in observations]
    uniform = proportional_split(
        [1.0] * limits.world_size,
        limits.global_batch_size,
        limits.min_batch_size,
        limits.max_batch_size,
    )
    uniform_s = max(curve(b) for curve, b in zip(curves, uniform))
    return uniform_s / optimal_step_time(curves, limits)


# --- the controller ------------------------------------------------------------------------------


class ModelController(LearnedMaximum, Controller):
    """Fit each rank's step-time curve and take the plan whose slowest rank is fastest.

    **Model.** Rank ``k``'s step takes ``t_k(b) = c_k + s_k * b`` seconds at batch size
    ``b``: a fixed cost ``c_k >= 0`` (kernel launches, the optimizer, the framework's loop)
    and ``s_k > 0`` per sample. The proportional controller is the case ``c_k = 0``: with a
    fixed cost it reads a rank with short steps, which spend more of their time on the
    fixed part, as slower than it is, and corrects in shrinking steps that the dead-band
    stops short of balance. Here each rank's curve is fitted to the last ``history``
    distinct batch sizes it was timed at
    ([`StepTimeCurve.fit`][lightning_hetero.planning.model.StepTimeCurve.fit]: relative least
    squares,
    or a non-decreasing piecewise-linear interpolation where no line fits within
    ``tolerance``: a device that is flat below some batch, a memory cliff). A line's slope
    is at least a tenth of the rank's mean time per sample: a fit through two noisy points
    can look flat, a flat rank looks free, and the min-max plan would flood it. A rank
    timed at one size only has no slope to go on and gets the line through 0: the first
    update from a uniform start is the proportional split.

    **Solve.** The next plan minimises ``max_k t_k(b_k)`` over integers with
    ``sum_k b_k = B`` and ``lo_k <= b_k <= hi_k``, exactly
    ([`solve_plan`][lightning_hetero.planning.model.solve_plan]): the water
    level ``L`` at which the largest real batches finishing within ``L`` add up to ``B``
    (in closed form when no bound binds, by pegging the ranks that overshoot a bound when
    a few do, else by sorting where the ranks reach bounds and knots), each rank's batch
    rounded down, and the missing samples handed to the ranks whose next sample would
    finish soonest. ``O(K log K)`` for ``K`` ranks.

    **Dead-band.** The plan changes only when the new plan's predicted step time beats the
    current plan's measured one, ``max_k t_k``, by more than ``deadband`` (relative), or
    when the current plan breaks the bounds; a balanced plan stays put under timing noise,
    and a plan that came within ``deadband`` of the optimum stays there.

    **Speed changes.** A rank timed again at a size it was timed at before, more than
    ``change_threshold`` (relative) away from that time, or timed at a new size in a way
    no non-decreasing curve through its older points allows (a larger batch that is faster
    by more than ``change_threshold``, or a smaller one slower by as much), has changed
    speed: its older points are dropped and it learns its curve again from the new one.

    **Memory.** A batch that outgrows memory makes steps much slower; the points show it as
    a curve that bends up, and the fit follows the bend. The learned-maximum rule of
    [`ProportionalController`][lightning_hetero.planning.ProportionalController] (a rank whose
    throughput fell
    by more than ``throughput_drop`` when its batch grew by more than the dead-band, and
    again at a later boundary above that size, is capped at its previous size for
    ``relearn_after`` boundaries, with a warning) is available with
    ``learn_max_batch_size=True``; it is off by default, since a speed change while a batch
    grows fires it too, and the cap then holds the rank below its best size until it is
    re-tested.

    Args:
        deadband: relative predicted gain below which the plan is kept, in ``[0, 1)``.
        throughput_drop: relative throughput loss that counts as a drop, in ``[0, 1)``.
        learn_max_batch_size: apply the learned-maximum rule.
        history: distinct batch sizes remembered per rank, at least 2.
        tolerance: root mean square relative residual up to which a line is kept, ``> 0``;
            keep it above the smoothed timing noise.
        change_threshold: relative difference that counts as a speed change, ``> 0``; keep
            it well above the smoothed timing noise.
        relearn_after: with ``learn_max_batch_size``, boundaries a learned maximum holds
            before it is lifted and re-tested, an integer ``>= 1``.

    Attributes:
        intercepts: each rank's fitted fixed cost ``c_k`` at the last update, seconds.
        slopes: each rank's fitted cost per sample ``s_k`` (past its last point for a
            piecewise curve), seconds.
        predicted_step_s: the predicted step time of the plan the last update chose (the
            measured one when it kept the plan).

    Example:
        Two ranks whose steps take ``0.3 + 0.005 * b`` and ``0.1 + 0.015 * b`` seconds:

        >>> from lightning_hetero.planning import BatchLimits
        >>> ctl, limits = ModelController(), BatchLimits.build(2, 128)
        >>> ctl.update([64, 64], [0.62, 1.06], limits)  # one size each: proportional
        [81, 47]
        >>> ctl.update([81, 47], [0.705, 0.805], limits)  # two sizes each: the lines
        [86, 42]
        >>> [round(c, 3) for c in ctl.intercepts], [round(s, 3) for s in ctl.slopes]
        ([0.3, 0.1], [0.005, 0.015])
        >>> ctl.update([86, 42], [0.73, 0.73], limits)  # balanced: kept
        [86, 42]
    """

    name = "model"
    replicable = True
    auto_deadband = True

    def __init__(
        self,
        deadband: Deadband = 0.05,
        throughput_drop: float = 0.1,
        learn_max_batch_size: bool = False,
        history: int = 4,
        tolerance: float = 0.05,
        change_threshold: float = 0.1,
        relearn_after: int = 10,
    ) -> None:
        check_deadband(deadband)
        if not 0.0 <= throughput_drop < 1.0:
            raise ValueError(f"`throughput_drop` must be in [0, 1), got {throughput_drop}.")
        if isinstance(history, bool) or not isinstance(history, int) or history < 2:
            raise ValueError(f"`history` must be an integer >= 2, got {history!r}.")
        if not (isfinite(tolerance) and tolerance > 0):
            raise ValueError(f"`tolerance` must be finite and > 0, got {tolerance}.")
        if not (isfinite(change_threshold) and change_threshold > 0):
            raise ValueError(f"`change_threshold` must be finite and > 0, got {change_threshold}.")
        self.deadband = deadband
        self.throughput_drop = throughput_drop
        self.learn_max_batch_size = learn_max_batch_size
        self.history = history
        self.tolerance = tolerance
        self.change_threshold = change_threshold
        self._init_learned(relearn_after)
        self.intercepts: list[float] = []
        self.slopes: list[float] = []
        self.predicted_step_s = nan
        self._knotted: dict[int, StepTimeCurve] = {}
        self._reset([])

    def _reset(self, points: Sequence[Sequence[Sequence[float]]]) -> None:
        """Take ``points`` (per rank, oldest first) as what has been measured."""
        # Each rank's latest point sits in two columns, its older ones in a list with their
        # _sums: a boundary at which no rank moved touches the columns only.
        self._older: list[list[list[float]]] = [[list(p) for p in pts[:-1]] for pts in points]
        self._sizes: list[int] = [int(pts[-1][0]) for pts in points]
        self._times: list[float] = [float(pts[-1][1]) for pts in points]
        self._older_sums = [_sums(older) for older in self._older]
        self._counts = [len(older) + 1 for older in self._older]

    @property
    def points(self) -> list[list[list[float]]]:
        """Per rank, the ``[batch_size, seconds]`` pairs its curve is fitted to, oldest first."""
        return [
            [*(list(p) for p in older), [b, t]]
            for older, b, t in zip(self._older, self._sizes, self._times)
        ]

    def curve(self, rank: int) -> StepTimeCurve:
        """Rank ``rank``'s curve as fitted at the last update."""
        knotted = self._knotted.get(rank)
        if knotted is not None:
            return knotted
        return StepTimeCurve.affine(self.intercepts[rank], self.slopes[rank])

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        current, compute_s, readings = check_inputs(batch_sizes, compute_s, limits, stats)
        upper = limits.max_batch_size
        if self.learn_max_batch_size:
            upper = self._upper_bounds(current, list(map(truediv, current, compute_s)), limits)
        self._observe(current, compute_s)
        self._fit()
        lower = limits.min_batch_size
        plan, predicted_s = _solve(
            self.intercepts, self.slopes, self._knotted, limits.global_batch_size, lower, upper
        )
        measured_s = max(compute_s)
        out_of_bounds = not _within(current, lower, upper)
        band = noise_deadband(self.deadband, compute_s, readings)
        if out_of_bounds or predicted_s < (1.0 - band) * measured_s:
            self.predicted_step_s = predicted_s
            return plan
        self.predicted_step_s = measured_s
        return current

    def _observe(self, current: list[int], compute_s: list[float]) -> None:
        """Make each rank's measurement its latest point; restart ranks whose speed changed."""
        if len(self._sizes) != len(current):
            self._reset([[[b, t]] for b, t in zip(current, compute_s)])
            return
        grow, shrink = 1.0 + self.change_threshold, 1.0 - self.change_threshold
        history = self.history
        sizes, times, olders, sums, counts = (
            self._sizes,
            self._times,
            self._older,
            self._older_sums,
            self._counts,
        )
        # A rank timed again at its latest size within the threshold only updates that
        # point's time; the others (moved, or changed speed in place) need a closer look.
        for k in [
            k
            for k, (b, t, size, seconds) in enumerate(zip(current, compute_s, sizes, times))
            if b != size or not shrink * seconds <= t <= grow * seconds
        ]:
            b = current[k]
            t = compute_s[k]
            size = sizes[k]
            seconds = times[k]
            low = shrink * t
            high = grow * t
            # A point at another size is inconsistent with the new one when no
            # non-decreasing curve goes through both: the speed changed.
            if size == b or (seconds > high if size < b else seconds < low):
                olders[k] = []
                sums[k] = _NO_SUMS
                counts[k] = 1
                continue
            older = olders[k]
            if counts[k] < history:
                for p_size, p_seconds in older:
                    if p_size == b or (p_seconds > high if p_size < b else p_seconds < low):
                        break
                else:  # the common case: the latest point joins the older ones
                    older.append([size, seconds])
                    inv = 1.0 / seconds
                    u = size * inv
                    r0, r1, r2, q0, q1 = sums[k]
                    sums[k] = (r0 + inv * inv, r1 + u * inv, r2 + u * u, q0 + inv, q1 + u)
                    counts[k] += 1
                    continue
            changed = False
            kept = []
            for p_size, p_seconds in [*older, [size, seconds]]:
                if p_size == b:  # timed at this size before: the new time replaces the old
                    changed = changed or not shrink * p_seconds <= t <= grow * p_seconds
                elif p_seconds > high if p_size < b else p_seconds < low:
                    changed = True
                else:
                    kept.append([p_size, p_seconds])
            kept = [] if changed else kept[max(len(kept) - history + 1, 0) :]
            olders[k], sums[k], counts[k] = kept, _sums(kept), len(kept) + 1
        self._sizes = current
        self._times = compute_s

    def _fit(self) -> None:
        """Fit every rank's curve to its points."""
        intercepts, slopes, bent = _fit_lines(
            self._older_sums,
            self._counts,
            self._sizes,
            self._times,
            self.tolerance,
        )
        knotted = {}
        for k in bent:
            points = sorted([*map(tuple, self._older[k]), (self._sizes[k], self._times[k])])
            knotted[k] = curve = _piecewise(points, slopes[k])
            intercepts[k], slopes[k] = curve.intercept, curve.slope
        self.intercepts, self.slopes, self._knotted = intercepts, slopes, knotted

    def state_dict(self) -> dict[str, Any]:
        return {
            "points": self.points,
            **self._learned_state(),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        points = state.get("points", [])
        self._reset(points)
        self.intercepts, self.slopes, self._knotted = [], [], {}
        if points:
            self._fit()
        self._load_learned_state(state)
