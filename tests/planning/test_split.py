"""Tests for lightning_hetero/planning/split.py: proportional splits, plan checks, balance."""

import math
import random

import pytest

from lightning_hetero.planning.split import (
    PlanError,
    balance_efficiency,
    check_plan,
    expand_bound,
    proportional_split,
)


def random_case(rng: random.Random) -> tuple[list[float], int, list[int], list[int]]:
    """A random feasible request: weights, total and per-rank bounds (sometimes binding)."""
    world_size = rng.randint(1, 16)
    weights = [
        rng.choice([rng.uniform(0.01, 1.0), rng.uniform(1.0, 100.0)]) for _ in range(world_size)
    ]
    lower = [rng.choice([1, 1, rng.randint(1, 20)]) for _ in range(world_size)]
    upper = [lo + rng.choice([0, rng.randint(0, 10), rng.randint(0, 500)]) for lo in lower]
    total = rng.randint(sum(lower), sum(upper))
    return weights, total, lower, upper


# --- proportional_split ------------------------------------------------------------------------


def test_split_of_omnilearn_hl4_is_exactly_proportional() -> None:
    assert proportional_split([9, 9, 6, 24], 256) == [48, 48, 32, 128]


def test_random_splits_sum_to_total_and_respect_bounds() -> None:
    rng = random.Random(0)
    for _ in range(500):
        weights, total, lower, upper = random_case(rng)
        plan = proportional_split(weights, total, lower, upper)
        assert len(plan) == len(weights)
        assert all(isinstance(b, int) for b in plan)
        assert sum(plan) == total
        assert all(lo <= b <= hi for b, lo, hi in zip(plan, lower, upper))


def test_unbounded_split_is_within_one_sample_of_exact_share() -> None:
    rng = random.Random(1)
    checked = 0
    while checked < 200:
        world_size = rng.randint(1, 16)
        weights = [rng.uniform(0.1, 10.0) for _ in range(world_size)]
        total = rng.randint(world_size, 5000)
        exact = [total * w / sum(weights) for w in weights]
        if min(exact) < 1:  # the default lower bound of 1 would bind
            continue
        plan = proportional_split(weights, total)
        assert sum(plan) == total
        assert all(abs(b - x) < 1 for b, x in zip(plan, exact))
        checked += 1


def test_only_largest_fractional_parts_are_rounded_up() -> None:
    # exact shares 10/7 * (1, 2, 4) = 1.43, 2.86, 5.71: the two largest fractions get the units
    assert proportional_split([1, 2, 4], 10) == [1, 3, 6]


def test_surplus_of_capped_rank_moves_to_ranks_with_room() -> None:
    assert proportional_split([1, 1, 1, 10], 40, lower=[1] * 4, upper=[16] * 4) == [8, 8, 8, 16]


def test_deficit_of_rank_held_at_minimum_is_taken_from_others() -> None:
    assert proportional_split([1, 1, 1, 100], 40, lower=[5] * 4, upper=[40] * 4) == [5, 5, 5, 25]


def test_surplus_is_shared_in_proportion_to_weights() -> None:
    # rank 0 is capped at 10; the remaining 90 go to ranks 1 and 2 in the ratio 1:2
    assert proportional_split([100, 1, 2], 100, upper=[10, 100, 100]) == [10, 30, 60]


def test_no_single_sample_move_improves_proportionality_within_bounds() -> None:
    # Water-filling optimality: a rank with room to grow never has a smaller share per unit
    # weight than a rank with room to shrink, up to one sample of rounding on each side.
    rng = random.Random(2)
    for _ in range(200):
        weights, total, lower, upper = random_case(rng)
        plan = proportional_split(weights, total, lower, upper)
        for i, (b_i, w_i) in enumerate(zip(plan, weights)):
            if b_i >= upper[i]:
                continue
            for j, (b_j, w_j) in enumerate(zip(plan, weights)):
                if j != i and b_j > lower[j]:
                    assert (b_i + 1) / w_i >= (b_j - 1) / w_j * (1 - 1e-9)


def test_equal_weights_give_remainder_to_lowest_ranks() -> None:
    assert proportional_split([1, 1, 1], 10) == [4, 3, 3]
    assert proportional_split([2.5] * 4, 6) == [2, 2, 1, 1]


def test_split_is_deterministic_across_calls() -> None:
    rng = random.Random(3)
    for _ in range(100):
        weights, total, lower, upper = random_case(rng)
        first = proportional_split(weights, total, lower, upper)
        assert proportional_split(list(weights), total, list(lower), list(upper)) == first


def test_scaling_all_weights_leaves_split_unchanged() -> None:
    weights = [12.0, 12.0, 8.0, 16.0]
    assert proportional_split([w * 1e-3 for w in weights], 256) == proportional_split(weights, 256)


def test_single_rank_takes_whole_batch() -> None:
    assert proportional_split([3.0], 17) == [17]


@pytest.mark.parametrize(
    ("lower", "upper", "message"),
    [
        ([10, 10, 10], [50, 50, 50], "minimums sum to 30"),  # sum(lower) > total
        ([1, 1, 1], [5, 5, 5], "maximums to 15"),  # sum(upper) < total
        ([1, 8, 1], [20, 7, 20], "minimum batch size 8 exceeds maximum 7"),
        ([1, 0, 1], [20, 20, 20], "minimum batch size must be >= 1, got 0"),
    ],
    ids=["sum-lower-above-total", "sum-upper-below-total", "lower-above-upper", "lower-below-one"],
)
def test_infeasible_bounds_raise_plan_error(
    lower: list[int], upper: list[int], message: str
) -> None:
    with pytest.raises(PlanError, match=message):
        proportional_split([1.0, 1.0, 1.0], 20, lower, upper)


@pytest.mark.parametrize(
    "weights",
    [[1.0, 0.0], [1.0, -2.0], [math.nan, 1.0], [math.inf, 1.0]],
    ids=["zero", "negative", "nan", "inf"],
)
def test_non_positive_or_non_finite_weights_raise_plan_error(weights: list[float]) -> None:
    with pytest.raises(PlanError, match="finite and positive"):
        proportional_split(weights, 10)


def test_empty_weights_raise_plan_error() -> None:
    with pytest.raises(PlanError, match="zero ranks"):
        proportional_split([], 10)


def test_bounds_of_wrong_length_raise_plan_error() -> None:
    with pytest.raises(PlanError, match="one entry per rank"):
        proportional_split([1.0, 1.0], 10, lower=[1, 1, 1])


def test_plan_error_is_a_value_error() -> None:
    assert issubclass(PlanError, ValueError)


# --- expand_bound ------------------------------------------------------------------------------


def test_expand_bound_repeats_scalar_and_defaults_none() -> None:
    assert expand_bound(4, 3, default=99) == [4, 4, 4]
    assert expand_bound(None, 2, default=99) == [99, 99]
    assert expand_bound([1, 2], 2, default=99) == [1, 2]


def test_expand_bound_with_wrong_length_raises_plan_error() -> None:
    with pytest.raises(PlanError, match="Expected 3 per-rank bounds"):
        expand_bound([1, 2], 3, default=99)


# --- check_plan --------------------------------------------------------------------------------


def test_check_plan_returns_valid_plan_as_ints() -> None:
    plan = check_plan([32, 32.0, 64], world_size=3, total=128, lower=[1] * 3, upper=[64] * 3)
    assert plan == [32, 32, 64]
    assert all(type(b) is int for b in plan)


def test_check_plan_with_wrong_length_names_world_size() -> None:
    with pytest.raises(PlanError, match="3 entries but the world size is 4"):
        check_plan([1, 2, 3], world_size=4)


@pytest.mark.parametrize("bad", [0, -3], ids=["zero", "negative"])
def test_check_plan_with_non_positive_entry_names_rank(bad: int) -> None:
    with pytest.raises(PlanError, match=r"Rank 1: batch sizes must be positive integers"):
        check_plan([4, bad], world_size=2)


@pytest.mark.parametrize("bad", [2.5, math.nan, True], ids=["fraction", "nan", "bool"])
def test_check_plan_with_non_integer_entry_names_rank(bad: object) -> None:
    with pytest.raises(PlanError, match=r"Rank 1: batch sizes must be positive integers"):
        check_plan([4, bad], world_size=2)  # type: ignore[list-item]


def test_check_plan_with_wrong_sum_names_both_sums() -> None:
    with pytest.raises(PlanError, match="sums to 7, not the global batch 8"):
        check_plan([3, 4], world_size=2, total=8)


def test_check_plan_below_minimum_names_rank_and_bound() -> None:
    with pytest.raises(PlanError, match="Rank 0: batch size 2 is below its minimum 3"):
        check_plan([2, 6], world_size=2, lower=[3, 3])


def test_check_plan_above_maximum_names_rank_and_bound() -> None:
    with pytest.raises(PlanError, match="Rank 1: batch size 6 is above its maximum 5"):
        check_plan([2, 6], world_size=2, upper=[5, 5])


# --- balance_efficiency ------------------------------------------------------------------------


def test_balance_is_one_when_every_rank_takes_same_time() -> None:
    assert balance_efficiency([10, 20, 70], [2.0, 2.0, 2.0]) == pytest.approx(1.0)


def test_balance_is_half_for_two_ranks_one_three_times_slower() -> None:
    assert balance_efficiency([10, 10], [1.0, 3.0]) == pytest.approx(0.5)


def test_balance_is_one_over_k_when_straggler_is_k_plus_one_times_slower() -> None:
    # equal batches, one rank (K + 1) x slower: E = K / (1 + (K - 1)(K + 1)) = 1 / K
    for world_size in range(2, 9):
        compute_s = [1.0] * (world_size - 1) + [world_size + 1.0]
        assert balance_efficiency([8] * world_size, compute_s) == pytest.approx(1 / world_size)


def test_balance_falls_as_straggler_slows() -> None:
    values = [balance_efficiency([16] * 4, [1.0, 1.0, 1.0, slow]) for slow in (1, 2, 4, 8, 16)]
    assert values == sorted(values, reverse=True)
    assert values[0] == pytest.approx(1.0)


def test_balance_is_invariant_to_time_unit() -> None:
    batch_sizes, compute_s = [12, 30, 5], [0.7, 1.9, 0.4]
    assert balance_efficiency(batch_sizes, [t * 1000 for t in compute_s]) == pytest.approx(
        balance_efficiency(batch_sizes, compute_s)
    )


def test_balance_lies_in_zero_one_for_random_inputs() -> None:
    rng = random.Random(4)
    for _ in range(500):
        world_size = rng.randint(1, 16)
        batch_sizes = [rng.randint(1, 512) for _ in range(world_size)]
        compute_s = [rng.uniform(1e-3, 10.0) for _ in range(world_size)]
        value = balance_efficiency(batch_sizes, compute_s)
        assert 0.0 < value <= 1.0 + 1e-12


def test_balance_of_proportional_split_beats_uniform_split() -> None:
    speeds = [6.0, 6.0, 4.0, 32.0]  # samples per second
    uniform = [64] * 4
    proportional = proportional_split(speeds, 256)
    uniform_e = balance_efficiency(uniform, [b / s for b, s in zip(uniform, speeds)])
    proportional_e = balance_efficiency(proportional, [b / s for b, s in zip(proportional, speeds)])
    assert uniform_e == pytest.approx(1 / 3)
    assert proportional_e > 0.99


@pytest.mark.parametrize(
    ("batch_sizes", "compute_s"), [([], []), ([1, 2], [1.0])], ids=["empty", "length-mismatch"]
)
def test_balance_with_empty_or_mismatched_inputs_raises(
    batch_sizes: list[int], compute_s: list[float]
) -> None:
    with pytest.raises(ValueError, match="non-empty and of equal length"):
        balance_efficiency(batch_sizes, compute_s)
