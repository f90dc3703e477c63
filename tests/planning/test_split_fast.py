"""The exact (water-filling) splits against the 200-pass bisections they replaced, and planning
at 1,024 ranks (issue 16).

The old implementations are kept here, verbatim up to names, as slow references. Where a
plan differs, the difference must come from a tie in exact arithmetic that the floats broke
the other way: both plans valid, and the real-valued shares the same within 1e-9.
"""

import random
from math import floor, fsum
from statistics import fmean

import pytest

from lightning_hetero.planning.base import BatchLimits
from lightning_hetero.planning.lbbsp import LBBSPController
from lightning_hetero.planning.proportional import (
    ProportionalController,
    _omnilearn_shares,
    _omnilearn_split,
)
from lightning_hetero.planning.simulator import HETEROGENEITY_LEVELS, ClusterSimulator
from lightning_hetero.planning.split import _fill_level, _round_shares, proportional_split

# ------------------------------------------------------------------ the old implementations


def old_shares(weights, total, lower, upper):
    """The real-valued split of the old ``proportional_split`` (bisection on the scale)."""

    def allocated(scale):
        return [min(max(scale * w, lo), hi) for w, lo, hi in zip(weights, lower, upper)]

    low_scale, high_scale = 0.0, total / min(weights)
    for _ in range(200):
        mid = 0.5 * (low_scale + high_scale)
        if sum(allocated(mid)) < total:
            low_scale = mid
        else:
            high_scale = mid
    return allocated(high_scale)


def old_round(shares, total, lower, upper):
    """The old rounding: floors, then passes over the ranks by largest fractional part."""
    world_size = len(shares)
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
        assert moved
    return plan


def old_split(weights, total, lower, upper):
    return old_round(old_shares(weights, total, lower, upper), total, lower, upper)


def old_omnilearn_shares(batch_sizes, compute_s, total, lower, upper):
    """The old ``_omnilearn_split`` up to rounding (bisection on the equal shift)."""
    mean_s = fmean(compute_s)
    moved = [b * mean_s / t for b, t in zip(batch_sizes, compute_s)]

    def shifted(shift):
        return [min(max(x - shift, lo), hi) for x, lo, hi in zip(moved, lower, upper)]

    shares = shifted((sum(moved) - total) / len(moved))
    if abs(sum(shares) - total) > 1e-9 * total:
        low = min(x - hi for x, hi in zip(moved, upper))
        high = max(x - lo for x, lo in zip(moved, lower))
        for _ in range(200):
            mid = 0.5 * (low + high)
            if sum(shifted(mid)) > total:
                low = mid
            else:
                high = mid
        shares = shifted(high)
    return shares


def old_omnilearn(batch_sizes, compute_s, total, lower, upper):
    shares = old_omnilearn_shares(batch_sizes, compute_s, total, lower, upper)
    return old_split(shares, total, lower, upper)


# ------------------------------------------------------------------------- random requests


def random_bounds(rng, world_size):
    """Per-rank bounds: loose, tight (a few samples wide), pinned (lo == hi) or mixed."""
    kind = rng.choice(["loose", "tight", "pinned", "mixed"])
    lower, upper = [], []
    for _ in range(world_size):
        lo = rng.choice([1, 1, rng.randint(1, 20)])
        if kind == "loose":
            width = rng.randint(0, 500)
        elif kind == "tight":
            width = rng.randint(0, 3)
        elif kind == "pinned":
            width = rng.choice([0, 0, rng.randint(1, 40)])
        else:
            width = rng.choice([0, rng.randint(0, 10), rng.randint(0, 500)])
        lower.append(lo)
        upper.append(lo + width)
    return lower, upper


def random_total(rng, lower, upper):
    low, high = sum(lower), sum(upper)
    return rng.choice([low, high, rng.randint(low, high), rng.randint(low, high)])


def random_weights(rng, world_size):
    """Weights spanning 1e-3..1e3, or a few repeated values (exact ties between ranks)."""
    if rng.random() < 0.3:
        pool = [rng.choice([0.5, 1, 2, 3, 7.25, 10 ** rng.uniform(-3, 3)]) for _ in range(3)]
        return [rng.choice(pool) for _ in range(world_size)]
    return [10 ** rng.uniform(-3, 3) for _ in range(world_size)]


def assert_valid(plan, total, lower, upper):
    assert all(isinstance(b, int) for b in plan)
    assert sum(plan) == total
    assert all(lo <= b <= hi for b, lo, hi in zip(plan, lower, upper))


def assert_shares_agree(new, old, total):
    assert len(new) == len(old)
    scale = max(1.0, total)
    for x, y in zip(new, old):
        assert abs(x - y) <= 1e-9 * max(abs(x), abs(y), 1.0) + 1e-12 * scale, (x, y)


def assert_same_or_tie(new_plan, old_plan, new_shares, old_shares_, total, lower, upper):
    """Identical plans, or two valid roundings of the same real-valued split."""
    assert_valid(new_plan, total, lower, upper)
    assert_shares_agree(new_shares, old_shares_, total)
    if new_plan == old_plan:
        return
    assert_valid(old_plan, total, lower, upper)
    # each plan is within one unit of the shares, and rounding the new shares the old way
    # gives the new plan: only the order of (nearly) equal fractional parts differs
    for plan in (new_plan, old_plan):
        assert all(abs(b - x) < 1 + 1e-6 for b, x in zip(plan, new_shares))
    assert old_round(new_shares, total, lower, upper) == new_plan
    fractions = {k: new_shares[k] - floor(new_shares[k]) for k in range(len(new_plan))}
    moved = [k for k in range(len(new_plan)) if new_plan[k] != old_plan[k]]
    near = [fractions[k] for k in moved]
    # the ranks that swapped a unit had fractional parts equal up to rounding (or at 0/1)
    spread = max(near) - min(near)
    wrapped = max((f + 0.5) % 1.0 for f in near) - min((f + 0.5) % 1.0 for f in near)
    assert min(spread, wrapped) < 1e-6, (moved, near)


def new_shares_of(weights, total, lower, upper):
    level = _fill_level(list(weights), total, lower, upper)
    if level is None:
        return [float(lo) for lo in lower]
    return [min(max(level * w, lo), hi) for w, lo, hi in zip(weights, lower, upper)]


# ---------------------------------------------------------------------------------- tests


@pytest.mark.parametrize("seed", range(4))
def test_water_filling_split_matches_the_bisection(seed):
    rng = random.Random(seed)
    differing = 0
    for _ in range(60):
        world_size = rng.randint(1, 300)
        weights = random_weights(rng, world_size)
        lower, upper = random_bounds(rng, world_size)
        total = random_total(rng, lower, upper)
        new = proportional_split(weights, total, lower, upper)
        old_s = old_shares(weights, total, lower, upper)
        old = old_round(old_s, total, lower, upper)
        new_s = new_shares_of(weights, total, lower, upper)
        assert_same_or_tie(new, old, new_s, old_s, total, lower, upper)
        differing += new != old
    assert differing <= 6  # ties broken the other way are rare


@pytest.mark.parametrize("seed", range(4))
def test_water_filling_omnilearn_split_matches_the_bisection(seed):
    rng = random.Random(100 + seed)
    for _ in range(30):
        world_size = rng.randint(1, 300)
        lower, upper = random_bounds(rng, world_size)
        total = random_total(rng, lower, upper)
        current = proportional_split([rng.uniform(0.5, 2.0) for _ in lower], total, lower, upper)
        speeds = random_weights(rng, world_size)
        compute_s = [b / v for b, v in zip(current, speeds)]
        new_s = _omnilearn_shares(current, compute_s, total, lower, upper)
        old_s = old_omnilearn_shares(current, compute_s, total, lower, upper)
        assert_shares_agree(new_s, old_s, total)
        assert abs(fsum(new_s) - total) <= 1e-9 * total
        new = _omnilearn_split(current, compute_s, total, lower, upper)
        old = old_split(old_s, total, lower, upper)
        # the old code split the shares again (a rescaling by 1 +- rounding); the new one
        # rounds them as they are
        assert_same_or_tie(
            new, old, new_s, old_shares(old_s, total, lower, upper), total, lower, upper
        )


def test_water_filling_finds_the_same_scale_on_hand_made_cases():
    # exactly proportional, capped, held at a minimum, every rank pinned
    cases = [
        ([9, 9, 6, 24], 256, [1] * 4, [256] * 4),
        ([1, 1, 1, 10], 40, [1] * 4, [16] * 4),
        ([1, 1, 1, 100], 40, [5] * 4, [40] * 4),
        ([100, 1, 2], 100, [1, 1, 1], [10, 100, 100]),
        ([3, 1, 2], 6, [2, 2, 2], [2, 2, 2]),
        ([3, 1, 2], 9, [1, 1, 1], [3, 3, 3]),
        ([1e-3, 1e3, 1.0], 12, [1, 1, 1], [10, 10, 10]),
    ]
    for weights, total, lower, upper in cases:
        new_s = new_shares_of(weights, total, lower, upper)
        assert_shares_agree(new_s, old_shares(weights, total, lower, upper), total)
        assert proportional_split(weights, total, lower, upper) == old_split(
            weights, total, lower, upper
        )


def test_total_at_the_sum_of_minimums_or_maximums_pins_every_rank():
    assert proportional_split([5.0, 1.0, 2.0], 6, [1, 2, 3], [9, 9, 9]) == [1, 2, 3]
    assert proportional_split([5.0, 1.0, 2.0], 9, [1, 1, 1], [2, 3, 4]) == [2, 3, 4]


def test_rounding_hands_units_to_the_largest_fractions_ties_to_the_lower_rank():
    shares = [1.5, 2.5, 3.25, 1.75]  # sums to 9: floors sum to 7, two units missing
    assert _round_shares(shares, 9, [1] * 4, [10] * 4) == old_round(shares, 9, [1] * 4, [10] * 4)
    assert _round_shares(shares, 9, [1] * 4, [10] * 4) == [2, 2, 3, 2]


@pytest.mark.parametrize("seed", range(3))
def test_rounding_that_needs_several_passes_matches_the_pass_by_pass_loop(seed):
    """Shares far from the total (not the output of a split): units go round the ranks."""
    rng = random.Random(seed)
    for _ in range(300):
        world_size = rng.randint(1, 40)
        lower, upper = random_bounds(rng, world_size)
        total = random_total(rng, lower, upper)
        shares = [rng.uniform(lo, hi) for lo, hi in zip(lower, upper)]
        if rng.random() < 0.3:  # equal fractional parts
            shares = [
                float(floor(x)) + 0.5 if floor(x) < hi else float(hi)
                for x, hi in zip(shares, upper)
            ]
        expected = old_round(shares, total, lower, upper)
        assert _round_shares(shares, total, lower, upper) == expected


def test_large_splits_agree_with_the_bisection_and_sum_exactly():
    rng = random.Random(7)
    for world_size in (1024, 4096):
        weights = [10 ** rng.uniform(-3, 3) for _ in range(world_size)]
        lower = [1] * world_size
        upper = [rng.randint(2, 200) for _ in range(world_size)]
        total = (sum(lower) + sum(upper)) // 2
        new = proportional_split(weights, total, lower, upper)
        old_s = old_shares(weights, total, lower, upper)
        new_s = new_shares_of(weights, total, lower, upper)
        assert_same_or_tie(
            new, old_round(old_s, total, lower, upper), new_s, old_s, total, lower, upper
        )
        assert abs(fsum(new_s) - total) < 1e-9 * total


# ------------------------------------------------------------------- 1,024 simulated ranks


def hl_mix(copies: int) -> list[int]:
    """Core counts of ``copies`` times the four-worker clusters HL8, HL4, HL2 and HL8 again."""
    levels = ["HL8", "HL4", "HL2", "HL8"]
    return [c for _ in range(copies) for level in levels for c in HETEROGENEITY_LEVELS[level]]


@pytest.mark.parametrize(
    "controller",
    [
        ProportionalController,
        lambda: LBBSPController(predictor="last"),
        lambda: LBBSPController(predictor="ema"),
    ],
    ids=["proportional", "lbbsp-last", "lbbsp-ema"],
)
def test_1024_ranks_of_the_hl_mix_balance_within_two_adjustments(controller):
    cores = hl_mix(64)
    assert len(cores) == 1024
    simulator = ClusterSimulator.from_speeds(cores, noise=0.02, seed=0)
    limits = BatchLimits.build(len(cores), 256 * len(cores))
    result = simulator.run(controller(), [256] * len(cores), limits, boundaries=4)
    assert result.balance[0] < 0.5
    assert result.adjustments_to_balance(0.95) is not None
    assert result.adjustments_to_balance(0.95) <= 2
    assert min(result.balance[1:]) >= 0.95
    assert all(sum(plan) == limits.global_batch_size for plan in result.plans)


def test_1024_ranks_with_memory_caps_balance_within_two_adjustments():
    """The fastest ranks hit their maximum: the water-filling path of the split."""
    cores = hl_mix(64)
    simulator = ClusterSimulator.from_speeds(cores, noise=0.02, seed=1)
    limits = BatchLimits.build(len(cores), 256 * len(cores), 1, 660)  # 32 cores: 683 unbounded
    result = simulator.run(ProportionalController(), [256] * len(cores), limits, boundaries=4)
    assert result.adjustments_to_balance(0.95) is not None
    assert result.adjustments_to_balance(0.95) <= 2
    assert min(result.balance[1:]) >= 0.95
    assert max(result.plans[-1]) == 660
