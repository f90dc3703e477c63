"""Integer batch splits: proportional shares, rounding that keeps the sum, bounds.

Every plan in this package is a list of positive integers, one per rank, that sums
to the global batch ``B``. The functions here turn real-valued weights (speeds,
core counts, FLOPs) into such plans and check plans given by users.
"""

from collections.abc import Sequence
from math import floor, isfinite
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


def is_count(value: Any, least: int = 1) -> bool:
    """Whether ``value`` is an ``int`` (not a ``bool``) of at least ``least``.

    Example:
        >>> is_count(3), is_count(0), is_count(True), is_count(2.0), is_count(4, least=5)
        (True, False, False, False, False)
    """
    return isinstance(value, int) and not isinstance(value, bool) and value >= least


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
    for rank, (lo, hi) in enumerate(zip(lower, upper)):
        if lo < 1:
            raise PlanError(f"Rank {rank}: the minimum batch size must be >= 1, got {lo}.")
        if lo > hi:
            raise PlanError(f"Rank {rank}: minimum batch size {lo} exceeds maximum {hi}.")
    if not sum(lower) <= total <= sum(upper):
        raise PlanError(
            f"A global batch of {total} cannot be split within the bounds: the per-rank minimums"
            f" sum to {sum(lower)} and the maximums to {sum(upper)}."
        )


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
    sums to ``total`` exactly and is the same on every machine.

    Example:
        >>> proportional_split([9, 9, 6, 24], 256)
        [48, 48, 32, 128]
        >>> proportional_split([1, 1, 1, 10], 40, lower=[1] * 4, upper=[16] * 4)
        [8, 8, 8, 16]
    """
    world_size = len(weights)
    if world_size == 0:
        raise PlanError("Cannot split a batch over zero ranks.")
    if any(not isfinite(w) or w <= 0 for w in weights):
        raise PlanError(f"Split weights must be finite and positive, got {list(weights)}.")
    lower = [1] * world_size if lower is None else list(lower)
    upper = [total] * world_size if upper is None else list(upper)
    if len(lower) != world_size or len(upper) != world_size:
        raise PlanError("weights, lower and upper must have one entry per rank.")
    _check_feasible(total, lower, upper)

    def allocated(scale: float) -> list[float]:
        return [min(max(scale * w, lo), hi) for w, lo, hi in zip(weights, lower, upper)]

    # sum(allocated(scale)) is continuous and non-decreasing in scale: bisect for the total.
    low_scale, high_scale = 0.0, total / min(weights)
    for _ in range(200):
        mid = 0.5 * (low_scale + high_scale)
        if sum(allocated(mid)) < total:
            low_scale = mid
        else:
            high_scale = mid
    shares = allocated(high_scale)

    plan = [min(max(floor(x), lo), hi) for x, lo, hi in zip(shares, lower, upper)]
    missing = total - sum(plan)
    order = sorted(range(world_size), key=lambda k: (-(shares[k] - plan[k]), k))
    step = 1 if missing > 0 else -1
    while missing != 0:
        moved = False
        for k in order if step > 0 else reversed(order):
            if missing == 0:
                break
            if lower[k] <= plan[k] + step <= upper[k]:
                plan[k] += step
                missing -= step
                moved = True
        if not moved:  # pragma: no cover - excluded by _check_feasible
            raise PlanError("Could not round the split within the bounds.")
    return plan


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
    throughput = [b / t for b, t in zip(batch_sizes, compute_s)]
    best_step_s = sum(batch_sizes) / sum(throughput)
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
