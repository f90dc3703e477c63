"""The step-time guard: plan changes checked against the measured step time."""

import random

import pytest

from lightning_hetero.planning import (
    BatchLimits,
    ProportionalController,
    SimulatedWorker,
    StepTimeGuard,
    damped_plan,
)
from lightning_hetero.planning.scenarios import SCENARIOS, run_scenario
from lightning_hetero.planning.simulator import ClusterSimulator


def test_a_change_that_made_steps_slower_is_reverted_to_the_plan_before_it():
    guard = StepTimeGuard()
    assert guard.review([32, 32], 1.0, 0.01) is None
    assert guard.propose([32, 32], [50, 14]) == [50, 14]
    assert guard.review([50, 14], 1.2, 0.01) == [32, 32]
    assert guard.reverts == 1
    guard.review([32, 32], 1.0, 0.01)  # the plan before is as fast as it was
    assert guard.fraction == 0.5


def test_a_change_within_the_noise_is_kept_but_the_fastest_plan_stays_the_reference():
    guard = StepTimeGuard(z=2.0, tolerance=0.0)
    guard.review([32, 32], 1.00, 0.02)
    guard.propose([32, 32], [40, 24])
    # 1.05 - 1.00 < 2 * sqrt(0.02**2 + 0.02**2) = 0.0566: not slower beyond noise
    assert guard.review([40, 24], 1.05, 0.02) is None
    assert guard.baseline is not None and guard.baseline.plan == [32, 32]
    assert guard.reverts == 0


def test_changes_each_within_the_noise_cannot_add_up_to_a_slower_run():
    guard = StepTimeGuard(z=2.0, tolerance=0.0)  # noise band: 2 * sqrt(2) * 0.02 = 0.0566
    guard.review([32, 32], 1.00, 0.02)
    guard.propose([32, 32], [36, 28])
    assert guard.review([36, 28], 1.04, 0.02) is None  # 0.04 behind the fastest: kept
    guard.propose([36, 28], [40, 24])
    # 0.04 behind the one before, but 0.08 behind the fastest: back to the fastest
    assert guard.review([40, 24], 1.08, 0.02) == [32, 32]


def test_a_faster_change_is_kept_and_the_next_one_is_checked_against_it():
    guard = StepTimeGuard()
    guard.review([32, 32], 1.0, 0.0)
    guard.propose([32, 32], [40, 24])
    assert guard.review([40, 24], 0.8, 0.0) is None
    guard.propose([40, 24], [50, 14])
    assert guard.review([50, 14], 0.9, 0.0) == [40, 24]  # slower than 0.8, not than 1.0


@pytest.mark.parametrize(
    ("max_reverts", "expected"),
    [
        (2, [[120, 8], [92, 36], [64, 64]]),  # two reverts in a row: no more tries
        (3, [[120, 8], [92, 36], [78, 50], [64, 64]]),  # 1, 1/2, 1/4, then below min_fraction
    ],
)
def test_after_reverts_steps_shrink_until_the_guard_stops_trying(max_reverts, expected):
    guard = StepTimeGuard(shrink=0.5, min_fraction=0.2, max_reverts=max_reverts)
    guard.review([64, 64], 1.0, 0.0)
    tried = []
    for _ in range(4):
        step = guard.propose([64, 64], [120, 8])
        tried.append(step)
        if step == [64, 64]:
            break
        assert guard.review(step, 1.5, 0.0) == [64, 64]
        guard.review([64, 64], 1.0, 0.0)
    assert tried == expected


def test_a_kept_change_restores_full_steps():
    guard = StepTimeGuard()
    guard.review([64, 64], 1.0, 0.0)
    guard.propose([64, 64], [120, 8])
    guard.review([120, 8], 1.5, 0.0)
    guard.review([64, 64], 1.0, 0.0)
    half = guard.propose([64, 64], [120, 8])
    assert half == [92, 36]
    assert guard.review(half, 0.9, 0.0) is None
    assert guard.fraction == 1.0
    assert guard.propose(half, [100, 28]) == [100, 28]


def test_a_cluster_change_seen_in_the_baselines_step_time_forgets_the_reverts():
    guard = StepTimeGuard()
    guard.review([64, 64], 1.0, 0.01)
    guard.propose([64, 64], [120, 8])
    guard.review([120, 8], 1.5, 0.01)
    guard.review([64, 64], 1.0, 0.01)
    assert guard.fraction == 0.5
    guard.review([64, 64], 1.6, 0.01)  # the same plan, much slower: speeds changed
    assert guard.fraction == 1.0
    assert guard.propose([64, 64], [120, 8]) == [120, 8]


def test_the_state_round_trip_continues_a_trial():
    guard = StepTimeGuard()
    guard.review([32, 32], 1.0, 0.01)
    guard.propose([32, 32], [50, 14])
    restored = StepTimeGuard()
    restored.load_state_dict(guard.state_dict())
    assert restored.review([50, 14], 1.3, 0.01) == [32, 32]


@pytest.mark.parametrize(
    ("option", "value"),
    [
        ("z", -1.0),
        ("tolerance", -0.1),
        ("shrink", 1.0),
        ("shrink", 0.0),
        ("min_fraction", 0.0),
        ("max_reverts", 0),
    ],
)
def test_bad_options_are_refused(option, value):
    with pytest.raises(ValueError, match=option):
        StepTimeGuard(**{option: value})


def test_damped_plans_keep_the_sum_and_lie_between_the_two_plans():
    rng = random.Random(0)
    for _ in range(500):
        k = rng.randint(1, 9)
        plan = [rng.randint(1, 40) for _ in range(k)]
        total = sum(plan)
        cuts = sorted(rng.sample(range(1, total), k - 1)) if k > 1 else []
        target = [b - a for a, b in zip([0, *cuts], [*cuts, total])]
        fraction = rng.random()
        damped = damped_plan(plan, target, fraction)
        assert sum(damped) == total
        assert all(min(p, t) <= d <= max(p, t) for p, t, d in zip(plan, target, damped))
    assert damped_plan([10, 20], [30, 0], 1.0) == [30, 0]
    assert damped_plan([10, 20], [30, 0], 0.0) == [10, 20]


def test_damped_plan_refuses_a_target_of_another_sum():
    with pytest.raises(ValueError, match="re-split"):
        damped_plan([10, 20], [10, 21], 0.5)


def test_on_a_floored_cluster_the_guarded_controller_never_ends_slower_than_uniform():
    # workers 1-3 take 1.5 s whatever their batch below 75 samples; a proportional split
    # reads them as slow and pushes worker 0 past 1.5 s with a dead-band of 1%
    workers = [SimulatedWorker(0.01), *[SimulatedWorker(0.02, floor_s=1.5)] * 3]
    limits = BatchLimits.build(4, 256)
    for seed in range(5):
        sim = ClusterSimulator(workers, noise=0.02, seed=seed)
        result = sim.run(
            ProportionalController(deadband=0.01), [64] * 4, limits, 30, guard=StepTimeGuard()
        )
        uniform_s = max(sim.true_step_s([64] * 4, 0))
        last_s = max(sim.true_step_s(result.plans[-1], 0))
        assert last_s <= 1.03 * uniform_s


@pytest.mark.parametrize("name", ["loader", "floor", "floor-slow"])
def test_the_default_configuration_reaches_the_optimum_on_loader_and_floor_clusters(name):
    # what HeteroStrategy runs by default: proportional, deadband="auto", the guard
    for seed in range(3):
        report = run_scenario(
            SCENARIOS[name], ProportionalController(deadband="auto"), seed, guard=StepTimeGuard()
        )
        assert report.steady_efficiency >= 0.97


def test_a_plan_with_too_few_steps_is_held_until_it_can_be_judged():
    guard = StepTimeGuard(min_steps=3)
    guard.review([32, 32], 1.0, 0.01, steps=5)
    guard.propose([32, 32], [50, 14])
    assert guard.review([50, 14], 1.5, 0.01, steps=2) is None  # two steps: no verdict yet
    assert guard.propose([50, 14], [60, 4]) == [50, 14]  # and no new change on top
    assert guard.review([50, 14], 1.5, 0.01, steps=4) == [32, 32]


def test_a_revert_the_cluster_caused_does_not_shrink_the_next_steps():
    guard = StepTimeGuard()
    guard.review([32, 32], 1.0, 0.01)
    guard.propose([32, 32], [50, 14])
    assert guard.review([50, 14], 1.5, 0.01) == [32, 32]  # slower, but was it the change?
    guard.review([32, 32], 1.6, 0.01)  # no: the plan before is now slower too
    assert guard.fraction == 1.0
    assert guard.propose([32, 32], [50, 14]) == [50, 14]


def test_a_kept_plan_that_slows_down_later_moves_the_reference_instead_of_reverting():
    guard = StepTimeGuard()
    guard.review([32, 32], 1.0, 0.01)
    guard.propose([32, 32], [40, 24])
    assert guard.review([40, 24], 1.01, 0.01) is None  # judged: kept, within the noise
    assert guard.review([40, 24], 1.50, 0.01) is None  # the cluster slowed: no revert
    assert guard.baseline is not None and guard.baseline.step_s == 1.50
    guard.propose([40, 24], [48, 16])
    assert guard.review([48, 16], 1.40, 0.01) is None  # judged against the new reference


def test_a_new_global_batch_starts_a_new_reference_and_never_goes_back_to_the_old_one():
    # an input-scale change doubled the global batch: its longer steps are no regression,
    # and a plan of the old sum could not run any more
    guard = StepTimeGuard()
    assert guard.review([4, 4], 0.010, 0.0001) is None
    assert guard.review([8, 8], 0.020, 0.0001) is None
    assert guard.baseline is not None and guard.baseline.plan == [8, 8]
    assert guard.reverts == 0
    # later changes are judged against the new global batch's plan
    guard.propose([8, 8], [10, 6])
    assert guard.review([10, 6], 0.030, 0.0001) == [8, 8]


def test_a_restart_makes_the_next_plan_the_reference_without_a_verdict():
    # issue 33's unfreezing replay: [8, 8] at 3.5 s, then [10, 6] at 6.9 s because the
    # model's backbone was unfrozen meanwhile (the strategy calls `restart`)
    guard = StepTimeGuard()
    assert guard.review([8, 8], 3.5, 0.01) is None
    assert guard.propose([8, 8], [10, 6]) == [10, 6]
    guard.restart()
    assert guard.review([10, 6], 6.9, 0.01) is None and guard.reverts == 0
    assert guard.baseline is not None and guard.baseline.plan == [10, 6]
    # later changes are judged against the new reference
    guard.propose([10, 6], [12, 4])
    assert guard.review([12, 4], 8.0, 0.01) == [10, 6]


def _drifting_pair(
    guard: StepTimeGuard, slower_by: float, drift: float, boundaries: int = 16
) -> list[list[int]]:
    """Issue 42's repro: the controller asks for B at every boundary; B is ``slower_by``
    slower than A and the whole load drifts by ``drift`` every two boundaries."""
    a, b = [32, 32], [40, 24]
    plan, plans = a, []
    for k in range(boundaries):
        load = 1.0 if k % 4 < 2 else 1.0 + drift
        base = {(32, 32): 1.0, (40, 24): 1.0 + slower_by}.get(tuple(plan), 1.0 + slower_by / 2)
        back = guard.review(plan, base * load, 0.005, steps=20)
        plan = back if back is not None else guard.propose(plan, b)
        plans.append(plan)
    return plans


@pytest.mark.parametrize("drift", [0.0, 0.03, 0.06])
def test_a_slower_plan_under_a_drifting_load_is_reverted_at_most_twice_and_not_kept(drift):
    guard = StepTimeGuard()
    plans = _drifting_pair(guard, slower_by=0.05, drift=drift)
    assert guard.reverts <= 2
    assert plans[-1] == [32, 32]
    assert plans.count([40, 24]) <= 2


def test_a_real_regression_is_still_reverted_under_a_drifting_load():
    guard = StepTimeGuard()
    plans = _drifting_pair(guard, slower_by=0.10, drift=0.03)
    assert plans[1] == [32, 32] and guard.reverts >= 1
    assert plans[-1] == [32, 32]


def test_a_whole_machine_slowdown_under_a_balanced_plan_is_not_reverted():
    # per-sample 20 ms on rank 0, 12.5 ms on rank 1: [24, 40] is at balance 0.98
    guard = StepTimeGuard()
    assert guard.review([32, 32], 0.64, 0.002, compute_s=[0.64, 0.40]) is None
    assert guard.propose([32, 32], [24, 40]) == [24, 40]
    # everything runs 40% slower meanwhile: 0.70 s against 0.64 s, yet every rank's time per
    # sample rose by 40%, so the plan is not to blame
    slow = [0.48 * 1.4, 0.50 * 1.4]
    assert guard.review([24, 40], 0.70, 0.002, compute_s=slow) is None
    assert guard.reverts == 0
    # without per-rank times the same numbers read as a slower plan
    blind = StepTimeGuard()
    blind.review([32, 32], 0.64, 0.002)
    blind.propose([32, 32], [24, 40])
    assert blind.review([24, 40], 0.70, 0.002) == [32, 32]


def test_a_plan_slower_on_some_rank_is_reverted_despite_per_rank_times():
    # the flooded rank's time per sample is unchanged (it only got more samples): no load
    guard = StepTimeGuard()
    guard.review([32, 32], 0.64, 0.002, compute_s=[0.64, 0.40])
    guard.propose([32, 32], [8, 56])
    assert guard.review([8, 56], 0.70, 0.002, compute_s=[0.16, 0.70]) == [32, 32]


def test_a_refused_change_is_tried_again_when_the_cluster_changes_beyond_the_drift():
    guard = StepTimeGuard()
    plans = _drifting_pair(guard, slower_by=0.05, drift=0.03)
    assert guard.propose(plans[-1], [40, 24]) == [32, 32]  # refused
    guard.review([32, 32], 1.5, 0.005, steps=20)  # far outside 1.00-1.03: the cluster changed
    assert guard.propose([32, 32], [40, 24]) == [40, 24]


def test_a_refused_change_is_tried_again_when_the_controller_asks_for_another_plan():
    guard = StepTimeGuard()
    plans = _drifting_pair(guard, slower_by=0.05, drift=0.0)
    assert guard.propose(plans[-1], [39, 25]) == [32, 32]  # close to the refused target
    assert guard.propose(plans[-1], [24, 40]) == [24, 40]  # the other way: judged afresh


def test_the_state_round_trip_keeps_a_refusal():
    guard = StepTimeGuard()
    plans = _drifting_pair(guard, slower_by=0.05, drift=0.03)
    restored = StepTimeGuard()
    restored.load_state_dict(guard.state_dict())
    assert restored.propose(plans[-1], [40, 24]) == [32, 32]
