"""Property-based tests of the planning layer (hypothesis): random worlds, speeds, bounds."""

import math

from hypothesis import assume, example, given
from hypothesis import strategies as st

from lightning_hetero.planning import (
    CONTROLLERS,
    BatchLimits,
    MemoryModel,
    PlanError,
    RankStats,
    TimeModel,
    check_plan,
    make_controller,
    merge_weights,
    plan_dual_batch,
    proportional_split,
)
from lightning_hetero.planning.dual import DualBatchError

speeds = st.floats(min_value=1e-3, max_value=1e3, allow_nan=False, allow_infinity=False)


@st.composite
def worlds(draw, max_ranks=12):
    """A world size, positive speeds (ties and skew included) and per-rank bounds."""
    n = draw(st.integers(1, max_ranks))
    weights = draw(st.lists(st.sampled_from([1.0, 2.0, 7.5]) | speeds, min_size=n, max_size=n))
    lower = draw(st.lists(st.integers(1, 8), min_size=n, max_size=n))
    upper = [lo + draw(st.integers(0, 64)) for lo in lower]
    total = draw(st.integers(1, sum(upper) + 16))
    return weights, total, lower, upper


def feasible(total, lower, upper):
    return all(lo <= hi for lo, hi in zip(lower, upper)) and sum(lower) <= total <= sum(upper)


@given(worlds())
@example(([1.0, 1.0], 3, [1, 1], [1, 1]))  # B above the sum of the maximums
@example(([1e3, 1e-3, 1e-3], 3, [1, 1, 1], [64, 64, 64]))  # very skewed, B at the minimums
def test_proportional_split_fits_or_raises_plan_error(world):
    weights, total, lower, upper = world
    try:
        plan = proportional_split(weights, total, lower, upper)
    except PlanError:
        assert not feasible(total, lower, upper)
        return
    assert feasible(total, lower, upper)
    assert sum(plan) == total
    assert all(lo <= b <= hi for b, lo, hi in zip(plan, lower, upper))
    # deterministic: the same numbers (in another container) give the same plan
    assert proportional_split(tuple(weights), total, tuple(lower), tuple(upper)) == plan


@given(worlds(), st.data())
def test_permuting_the_ranks_permutes_the_split_of_distinct_speeds(world, data):
    weights, total, lower, upper = world
    assume(feasible(total, lower, upper) and len(set(weights)) == len(weights))
    order = data.draw(st.permutations(range(len(weights))))
    plan = proportional_split(weights, total, lower, upper)
    permuted = proportional_split(
        [weights[k] for k in order], total, [lower[k] for k in order], [upper[k] for k in order]
    )
    # rounding hands leftovers by fractional part, ties to the lower rank: equal up to one
    assert all(abs(permuted[i] - plan[k]) <= 1 for i, k in enumerate(order))
    assert sum(permuted) == total


@given(worlds())
def test_batch_limits_admit_exactly_the_valid_plans(world):
    weights, total, lower, upper = world
    try:
        limits = BatchLimits.build(len(weights), total, lower, upper)
    except PlanError:
        assert not feasible(total, lower, [min(hi, total) for hi in upper])
        return
    plan = proportional_split(weights, total, limits.min_batch_size, limits.max_batch_size)
    assert limits.admits(plan)
    assert check_plan(plan, len(plan), total, limits.min_batch_size, limits.max_batch_size) == plan
    bumped = [plan[0] + 1, *plan[1:]]
    assert not limits.admits(bumped)  # the sum is off


@st.composite
def boundaries(draw):
    """Limits, a starting plan and a sequence of measured compute times."""
    weights, total, lower, upper = draw(worlds(max_ranks=8))
    assume(feasible(total, lower, upper))
    limits = BatchLimits.build(len(weights), total, lower, upper)
    plan = proportional_split([1.0] * len(weights), total, lower, upper)
    rounds = draw(st.integers(1, 4))
    speeds_per_round = [
        draw(st.lists(speeds, min_size=len(weights), max_size=len(weights))) for _ in range(rounds)
    ]
    return limits, plan, speeds_per_round


def _run(name, limits, plan, speeds_per_round):
    controller = make_controller(name)
    plans = []
    for samples_per_s in speeds_per_round:
        compute = [b / x for b, x in zip(plan, samples_per_s)]
        stats = [
            RankStats(0.5, 0.5, 0.5, max(int(100 * x / max(samples_per_s)), 1))
            for x in samples_per_s
        ]
        plan = controller.update(plan, compute, limits, stats)
        plans.append(plan)
    return plans


@given(st.sampled_from(sorted(CONTROLLERS)), boundaries())
def test_every_controller_keeps_every_plan_valid_and_is_deterministic(name, case):
    limits, plan, speeds_per_round = case
    plans = _run(name, limits, plan, speeds_per_round)
    assert all(limits.admits(p) for p in plans), plans
    # every rank runs the same controller on the same gathered numbers: same plans
    assert _run(name, limits, plan, speeds_per_round) == plans


@given(st.sampled_from(sorted(CONTROLLERS)), boundaries(), st.sampled_from([0.0, -1.0, math.nan]))
def test_bad_timings_are_refused_not_planned(name, case, bad):
    limits, plan, _ = case
    compute = [1.0] * len(plan)
    compute[-1] = bad
    try:
        result = make_controller(name).update(plan, compute, limits)
    except ValueError:
        return  # the documented refusal (check_inputs)
    # controllers that ignore timings (static, dual) keep the plan
    assert result == plan and name in ("static", "dual")


@given(
    st.lists(st.integers(1, 512), min_size=1, max_size=8),
    st.data(),
    st.floats(0.0, 0.5),
)
def test_merge_weights_are_shares_except_for_the_documented_perturbation(batch_sizes, data, delta):
    n = len(batch_sizes)
    updates = data.draw(st.lists(st.integers(0, 100), min_size=n, max_size=n))
    assume(sum(updates) > 0)
    norms = data.draw(st.lists(st.floats(0.0, 10.0), min_size=n, max_size=n))
    merged = merge_weights(batch_sizes, updates, norms, delta=delta)
    assert all(w >= 0 for w in merged.weights)
    if not merged.perturbed:
        assert math.isclose(sum(merged.weights), 1.0, rel_tol=1e-9)
    else:  # as in paper 004: 1 + delta * (alpha_max - alpha_min), not renormalized
        alpha = [u / sum(updates) for u in updates]
        expected = 1 + delta * (max(alpha) - min(alpha))
        assert math.isclose(sum(merged.weights), expected, rel_tol=1e-9)


@given(
    st.floats(0.0, 1e6),
    st.floats(1.0, 1e4),
    st.floats(1e3, 1e9),
    st.floats(1e3, 1e9),
)
def test_memory_bound_grows_with_the_budget(fixed, per_sample, budget, more):
    model = MemoryModel(fixed, per_sample)
    try:
        small = model.max_batch_size(budget)
    except PlanError:
        return  # not even one sample fits the smaller budget
    assert small >= 1 and model.max_batch_size(budget + more) >= small


@given(
    st.integers(2, 16),
    st.data(),
    st.floats(1.001, 2.0),
    st.floats(1e-5, 1e-2),
    st.floats(1e-4, 1.0),
)
def test_dual_plans_cover_the_dataset_or_raise_the_documented_error(n, data, k, a, b):
    d = data.draw(st.integers(n, 200000))
    n_small = data.draw(st.integers(0, n))
    large = data.draw(st.integers(2, 1024))
    try:
        plan = plan_dual_batch(TimeModel(a, b), d, n, n_small, large, k)
    except DualBatchError:
        return
    assert sum(plan.samples) == d and min(plan.samples) >= 1
    assert all(1 <= size <= large for size in plan.batch_sizes)
    assert plan == plan_dual_batch(TimeModel(a, b), d, n, n_small, large, k)
