"""Integer batch splits: proportional shares, rounding that keeps the sum, bounds.

Every plan in this package is a list of positive integers, one per rank, that sums
to the global batch ``B``. The functions here turn real-valued weights (speeds,
core counts, FLOPs) into such plans and check plans given by users.
"""

import zlib
from array import array
from bisect import bisect_left
from collections.abc import Callable, Iterable, Sequence
from itertools import accumulate, repeat
from math import floor, inf, isfinite
from operator import le, mul, sub, truediv
from typing import Any

__all__ = [
    "PlanError",
    "is_count",
    "balance_efficiency",
    "check_plan",
    "expand_bound",
    "ideal_speedup",
    "proportional_split",
]


class PlanError(ValueError):
    """A plan or a planning request that cannot be satisfied."""


def plan_checksum(plan: Sequence[int]) -> int:
    """A number that tells plans apart: CRC-32 of the sizes as 64-bit integers (the same on
    every machine, and exact in a float64 row)."""
    return zlib.crc32(array("q", plan).tobytes())


def is_count(value: Any, least: int = 1) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) of at least ``least``.

    Example:
        >>> is_count(3), is_count(0), is_count(True), is_count(2.0), is_count(4, least=5)
        (True, False, False, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


def finite_and_positive(values: Sequence[float], zero_ok: bool = False) -> bool:
    """Whether every value is finite and > 0 (>= 0 with ``zero_ok``).

    One pass in C in the usual case (a finite sum has no inf or nan term); a sum that
    overflows, or a value that fails, gets the per-value check.
    """
    if not values:
        return True
    low = min(values)
    if isfinite(sum(values)) and (low >= 0 if zero_ok else low > 0):
        return True
    return all(isfinite(v) and (v >= 0 if zero_ok else v > 0) for v in values)


def expand_bound(bound: int | Sequence[int] | None, world_size: int, default: int) -> list[int]:
    """Return a per-rank bound: an int applies to every rank, ``None`` means ``default``."""
    if bound is None:
        return [default] * world_size
    if isinstance(bound, int):
        return [bound] * world_size
    values = [int(b) for b in bound]
    if len(values) != world_size:
        raise PlanError(f"Expected {world_size} per-rank bounds (one per rank), got {len(values)}.")
    return values


def _check_feasible(total: int, lower: Sequence[int], upper: Sequence[int]) -> None:
    low, high = sum(lower), sum(upper)
    if not (min(lower) >= 1 and all(map(le, lower, upper))):  # the common case is one pass
        for rank, (lo, hi) in enumerate(zip(lower, upper)):
            if lo < 1:
                raise PlanError(f"Rank {rank}: the minimum batch size must be >= 1, got {lo}.")
            if lo > hi:
                raise PlanError(f"Rank {rank}: minimum batch size {lo} exceeds maximum {hi}.")
    if not low <= total <= high:
        raise PlanError(
            f"A global batch of {total} cannot be split within the bounds: the per-rank minimums"
            f" sum to {low} and the maximums to {high}."
        )


def _first_reaching(points: list[float], level: Callable[[float], float], total: float) -> int:
    """Smallest index ``i`` of the sorted ``points`` with ``level(points[i]) >= total``."""
    low, high = 0, len(points)
    while low < high:
        mid = (low + high) // 2
        if level(points[mid]) >= total:
            high = mid
        else:
            low = mid + 1
    return low


def _fill_level(
    weights: Sequence[float],
    total: float,
    lower: Sequence[int],
    upper: Sequence[int],
    offsets: Sequence[float] | None = None,
) -> float | None:
    """The level ``lam`` at which ``sum_k clip(c_k + lam * w_k, lo_k, hi_k)`` is ``total``.

    Water-filling, exact up to rounding: the sum is continuous, non-decreasing and linear
    between the breakpoints ``(lo_k - c_k) / w_k`` (rank ``k`` leaves its minimum) and
    ``(hi_k - c_k) / w_k`` (it reaches its maximum). The breakpoints are sorted once;
    prefix sums in that order give the sum at any breakpoint in ``O(log K)``, a binary
    search finds the linear piece that reaches ``total``, and that piece is solved
    exactly, its slope summed over the ranks strictly between their bounds:
    ``O(K log K)`` in all. ``c_k`` (``offsets``) are 0 when ``None``.

    The unbounded level ``lam0 = (total - sum(c)) / sum(w)`` brackets the answer: if no
    rank would sit at its maximum there, the sum at ``lam0`` is at least ``total``, so
    ``lam <= lam0`` and no rank is at its maximum at ``lam`` either (likewise for the
    minimums). Only the bounds that can bind are sorted, and when none can, ``lam0`` is
    the answer.

    Returns ``None`` when every rank sits at its minimum (``total == sum(lower)``: any
    level low enough). Assumes positive weights and ``sum(lower) <= total <= sum(upper)``.
    """
    size = len(weights)
    sum_w = sum(weights)
    if offsets is None:
        sum_c = 0.0
        leave = list(map(truediv, lower, weights))
        reach = list(map(truediv, upper, weights))
    else:
        sum_c = sum(offsets)
        leave = list(map(truediv, map(sub, lower, offsets), weights))
        reach = list(map(truediv, map(sub, upper, offsets), weights))
    unbounded = (total - sum_c) / sum_w
    minimums_bind = max(leave) > unbounded  # else the level is >= unbounded >= every leave
    maximums_bind = min(reach) < unbounded  # else the level is <= unbounded <= every reach
    if not (minimums_bind or maximums_bind):
        return unbounded  # no rank at a bound: the common case

    if minimums_bind != maximums_bind:  # one side binds: sort that side only
        points, bounds = (reach, upper) if maximums_bind else (leave, lower)
        return _fill_one_side(
            points, bounds, weights, offsets, total, maximums_bind, unbounded, sum_w, sum_c
        )

    # Both sides: the ranks by breakpoint and prefix sums of (bound, weight, offset) in
    # that order.
    def side(points: list[float], bounds: Sequence[int]) -> tuple[list[Any], ...]:
        order = sorted(range(size), key=points.__getitem__)
        ordered = list(map(points.__getitem__, order))
        bound_sum = list(accumulate(map(bounds.__getitem__, order), initial=0))
        weight_sum = list(accumulate(map(weights.__getitem__, order), initial=0.0))
        if offsets is None:
            offset_sum = [0.0] * (size + 1)
        else:
            offset_sum = list(accumulate(map(offsets.__getitem__, order), initial=0.0))
        return order, ordered, bound_sum, weight_sum, offset_sum

    by_leave, leave_sorted, lower_sum, weight_leave, offset_leave = side(leave, lower)
    by_reach, reach_sorted, upper_sum, weight_reach, offset_reach = side(reach, upper)
    all_lower = lower_sum[-1]

    def filled(lam: float) -> float:
        # ranks whose breakpoint is below lam have left their minimum / reached their maximum
        i, j = bisect_left(leave_sorted, lam), bisect_left(reach_sorted, lam)
        slope = weight_leave[i] - weight_reach[j]
        offset = offset_leave[i] - offset_reach[j]
        return all_lower - lower_sum[i] + upper_sum[j] + offset + lam * slope

    i = _first_reaching(leave_sorted, filled, total)
    j = _first_reaching(reach_sorted, filled, total)
    above = min(leave_sorted[i] if i < size else inf, reach_sorted[j] if j < size else inf)
    below = max(leave_sorted[i - 1] if i else -inf, reach_sorted[j - 1] if j else -inf)
    if above == inf:  # rounding missed the last breakpoint, where every rank is at its maximum
        above = below
    elif below == -inf:  # the lowest breakpoint already holds the total: all at the minimum
        return None
    # the piece (below, above]: solve it over the ranks strictly inside their bounds
    i, j = bisect_left(leave_sorted, above), bisect_left(reach_sorted, above)
    fixed = all_lower - lower_sum[i] + upper_sum[j]
    if j:
        at_max = set(by_reach[:j])
        free = [k for k in by_leave[:i] if k not in at_max]
    else:
        free = by_leave[:i]
    slope = sum(map(weights.__getitem__, free))
    if offsets is not None:
        fixed += sum(map(offsets.__getitem__, free))
    lam = (total - fixed) / slope if slope > 0 else above
    return below if lam < below else above if lam > above else lam


def _fill_one_side(
    points: list[float],
    bounds: Sequence[int],
    weights: Sequence[float],
    offsets: Sequence[float] | None,
    total: float,
    rising: bool,
    unbounded: float,
    sum_w: float,
    sum_c: float,
) -> float | None:
    """``_fill_level`` when only the maximums (``rising``) or only the minimums bind.

    Then the level lies beyond ``unbounded`` (above it for maximums, below for minimums)
    and ranks reach their bound in the order of their breakpoints ``points`` from there.
    With the first ``m`` of them at their bound, the sum at the breakpoint ``p`` of the
    ``m``-th is ``sum(c) + p * sum(w) - sum_{first m} (c_k + p * w_k - bound_k)``. Usually
    few ranks are at their bound, so the prefix sums are built for a growing head of the
    order only (galloping), then a binary search finds ``m``.
    """
    size = len(points)
    order = sorted(range(size), key=points.__getitem__, reverse=not rising)

    def reached(
        m: int, bound_sum: list[Any], weight_sum: list[float], offset_sum: list[float]
    ) -> bool:
        level = points[order[m]]
        value = sum_c + level * sum_w - (offset_sum[m] + level * weight_sum[m] - bound_sum[m])
        return value >= total if rising else value <= total

    start, head = 0, 16
    while True:
        head = min(head, size)
        bound_sum = list(accumulate(map(bounds.__getitem__, order[:head]), initial=0))
        weight_sum = list(accumulate(map(weights.__getitem__, order[:head]), initial=0.0))
        if offsets is None:
            offset_sum = [0.0] * (head + 1)
        else:
            offset_sum = list(accumulate(map(offsets.__getitem__, order[:head]), initial=0.0))
        if head == size or reached(head - 1, bound_sum, weight_sum, offset_sum):
            break
        start, head = head, 4 * head
    low, high = start, head  # the first m in [start, head) that reaches, else head
    while low < high:
        mid = (low + high) // 2
        if reached(mid, bound_sum, weight_sum, offset_sum):
            high = mid
        else:
            low = mid + 1
    m = low
    if m == size and not rising:  # every rank at its minimum
        return None
    # between the breakpoints of the m-th and the (m+1)-th rank: the first m at their bound
    free = order[m:]
    slope = sum(map(weights.__getitem__, free))
    fixed = sum(map(bounds.__getitem__, order[:m]))
    if offsets is not None:
        fixed += sum(map(offsets.__getitem__, free))
    passed = points[order[m - 1]] if m else unbounded
    ahead = points[order[m]] if m < size else passed
    low_level, high_level = (
        (max(passed, unbounded), ahead) if rising else (ahead, min(passed, unbounded))
    )
    if slope <= 0:
        return high_level if not rising else low_level
    level = (total - fixed) / slope
    return low_level if level < low_level else high_level if level > high_level else level


def _round_shares(
    shares: list[float], total: int, lower: Sequence[int], upper: Sequence[int]
) -> list[int]:
    """Integers summing to ``total``: floors, plus one unit each to the largest fractions.

    ``shares`` lie within ``[lower, upper]``. The units missing after taking every floor go
    to the largest fractional parts, ties to the lower rank; a rank at its maximum is
    passed over, and if units remain after every rank was offered one, the offers repeat
    in the same order (units in excess are taken back from the smallest fractional parts,
    ties to the higher rank, the same way). That is the outcome of handing out units one
    pass at a time; here it takes one sort.
    """
    plan = list(map(floor, shares))  # within the bounds already: they are integers
    missing = total - sum(plan)
    if missing == 0:
        return plan
    fractions = list(map(sub, shares, plan))  # floats (from float shares): the fast sort
    order = sorted(range(len(plan)), key=fractions.__getitem__, reverse=True)  # ties: by rank
    if 0 < missing <= len(order) and fractions[order[missing - 1]] > 0:
        # the usual case: a rank with a fractional part is below its (integer) maximum
        for k in order[:missing]:
            plan[k] += 1
        return plan
    if missing > 0:
        room, step = list(map(sub, upper, plan)), 1
    else:
        order.reverse()
        room, step, missing = list(map(sub, plan, lower)), -1, -missing
    rounds = 0
    if missing > len(room) - room.count(0):  # more than one offer per rank (never in exact
        rounds = _complete_rounds(room, missing)  # arithmetic: the fractions sum to `missing`)
        plan = [b + step * (r if r < rounds else rounds) for b, r in zip(plan, room)]
        missing -= sum(r if r < rounds else rounds for r in room)
    for k in order:
        if missing == 0:
            break
        if room[k] > rounds:
            plan[k] += step
            missing -= 1
    if missing:  # pragma: no cover - excluded by _check_feasible
        raise PlanError("Could not round the split within the bounds.")
    return plan


def _complete_rounds(room: list[int], units: int) -> int:
    """Most rounds of one unit per rank with room left that ``units`` complete.

    After ``r`` rounds rank ``k`` holds ``min(r, room_k)`` units; a binary search over
    ``r`` with the rooms sorted.
    """
    ordered = sorted(room)
    below = list(accumulate(ordered, initial=0))

    def handed(rounds: int) -> int:
        i = bisect_left(ordered, rounds)
        return below[i] + rounds * (len(ordered) - i)

    low, high = 0, ordered[-1]
    while low < high:
        mid = (low + high + 1) // 2
        if handed(mid) <= units:
            low = mid
        else:
            high = mid - 1
    return low


def _clip(values: Iterable[float], lower: Sequence[int], upper: Sequence[int]) -> list[float]:
    """``[min(max(x, lo), hi) ...]`` as floats: the value, or the bound it crosses."""
    return [
        x if lo <= x <= hi else float(hi) if x > hi else float(lo)
        for x, lo, hi in zip(values, lower, upper)
    ]


def proportional_split(
    weights: Sequence[float],
    total: int,
    lower: Sequence[int] | None = None,
    upper: Sequence[int] | None = None,
) -> list[int]:
    """Split ``total`` into integers proportional to ``weights`` within ``[lower, upper]``.

    The real-valued split is ``x_k = clip(lam * w_k, lower_k, upper_k)`` with the
    scale ``lam`` chosen so that the ``x_k`` sum to ``total``: when a rank hits a
    bound, its surplus (or deficit) is shared by the others in proportion to
    their weights. Rounding takes the floor of each ``x_k`` and hands the missing
    units to the largest fractional parts (ties to the lower rank), so the result
    sums to ``total`` exactly and is the same on every machine. ``lam`` is found by
    water-filling (sorted breakpoints, one linear piece solved exactly): ``O(K log K)``
    for ``K`` ranks, pure Python, so every machine computes the same floats.

    Example:
        >>> proportional_split([9, 9, 6, 24], 256)
        [48, 48, 32, 128]
        >>> proportional_split([1, 1, 1, 10], 40, lower=[1] * 4, upper=[16] * 4)
        [8, 8, 8, 16]
    """
    world_size = len(weights)
    if world_size == 0:
        raise PlanError("Cannot split a batch over zero ranks.")
    weights = list(weights)
    if not finite_and_positive(weights):
        raise PlanError(f"Split weights must be finite and positive, got {weights}.")
    lower = [1] * world_size if lower is None else list(lower)
    upper = [total] * world_size if upper is None else list(upper)
    if len(lower) != world_size or len(upper) != world_size:
        raise PlanError("weights, lower and upper must have one entry per rank.")
    _check_feasible(total, lower, upper)
    lam = _fill_level(weights, total, lower, upper)
    shares = (
        [float(lo) for lo in lower]
        if lam is None
        else _clip(map(mul, repeat(lam), weights), lower, upper)
    )
    return _round_shares(shares, total, lower, upper)


def check_plan(
    plan: Sequence[int],
    world_size: int,
    total: int | None = None,
    lower: Sequence[int] | None = None,
    upper: Sequence[int] | None = None,
) -> list[int]:
    """Validate an explicit plan and return it as a list of ints.

    Raises:
        PlanError: wrong length, a non-positive or non-integer entry, a sum different
            from ``total``, or an entry outside its bounds.
    """
    values = list(plan)
    if len(values) != world_size:
        raise PlanError(
            f"The plan {values} has {len(values)} entries but the world size is {world_size}:"
            " give one batch size per rank."
        )
    for rank, size in enumerate(values):
        if (
            isinstance(size, bool)
            or not isinstance(size, (int, float))
            or not float(size).is_integer()
            or size < 1
        ):
            raise PlanError(f"Rank {rank}: batch sizes must be positive integers, got {size!r}.")
    values = [int(v) for v in values]
    if total is not None and sum(values) != total:
        raise PlanError(f"The plan {values} sums to {sum(values)}, not the global batch {total}.")
    for rank, size in enumerate(values):
        if lower is not None and size < lower[rank]:
            raise PlanError(f"Rank {rank}: batch size {size} is below its minimum {lower[rank]}.")
        if upper is not None and size > upper[rank]:
            raise PlanError(f"Rank {rank}: batch size {size} is above its maximum {upper[rank]}.")
    return values


def balance_efficiency(batch_sizes: Sequence[int], compute_s: Sequence[float]) -> float:
    """Balance efficiency ``E = T* / max_k t_k`` with ``T* = B / sum_k (b_k / t_k)``.

    ``E`` is 1.0 when every rank needs the same time and falls toward 0 as one rank
    straggles (DESIGN section 1, formula 1).

    Example:
        >>> balance_efficiency([10, 10], [1.0, 1.0])
        1.0
        >>> balance_efficiency([10, 10], [1.0, 3.0])
        0.5
    """
    if len(batch_sizes) != len(compute_s) or not batch_sizes:
        raise ValueError("batch_sizes and compute_s must be non-empty and of equal length.")
    best_step_s = sum(batch_sizes) / sum(map(truediv, batch_sizes, compute_s))
    return best_step_s / max(compute_s)


def ideal_speedup(samples_per_s: Sequence[float]) -> float:
    """Best epoch-time speedup of a speed-proportional split over a uniform one.

    Uniform BSP runs at the pace of the slowest rank, ``K * min(X)`` samples/s in all;
    a perfect split uses every rank fully, ``sum(X)`` (DESIGN section 6).

    Example:
        >>> ideal_speedup([9, 9, 6, 24])
        2.0
    """
    return sum(samples_per_s) / (len(samples_per_s) * min(samples_per_s))
