"""Tests for lightning_hetero/planning/proportional.py, on made-up timings and on the simulator.

The cluster scenarios follow DESIGN section 6: four workers with OmniLearn's speed
proportions (HL2, HL4, HL8), a global batch of 256 and a uniform start.
"""

import json
import random
import warnings

import pytest

from lightning_hetero.planning.base import BatchLimits, RankStats
from lightning_hetero.planning.guard import StepTimeGuard
from lightning_hetero.planning.proportional import ProportionalController
from lightning_hetero.planning.registry import make_controller
from lightning_hetero.planning.scenarios import run_scenario
from lightning_hetero.planning.simulator import (
    HETEROGENEITY_LEVELS,
    ClusterSimulator,
    SimulatedWorker,
    SimulationResult,
)
from lightning_hetero.planning.split import proportional_split

GLOBAL_BATCH = 256
UNIFORM = [64, 64, 64, 64]
HETEROGENEOUS_LEVELS = ["HL2", "HL4", "HL8"]
SEEDS = range(10)


def speeds(level: str) -> list[float]:
    return [float(s) for s in HETEROGENEITY_LEVELS[level]]


def ideal_split(level: str) -> list[float]:
    """The real-valued speed-proportional split of the global batch."""
    level_speeds = speeds(level)
    return [GLOBAL_BATCH * s / sum(level_speeds) for s in level_speeds]


def run_level(
    level: str,
    start: list[int] = UNIFORM,
    limits: BatchLimits | None = None,
    boundaries: int = 6,
    noise: float = 0.0,
    seed: int = 0,
    controller: ProportionalController | None = None,
) -> SimulationResult:
    sim = ClusterSimulator.from_speeds(speeds(level), noise=noise, seed=seed)
    return sim.run(
        controller or ProportionalController(),
        start,
        limits or BatchLimits.build(4, GLOBAL_BATCH),
        boundaries,
    )


def assert_plans_valid(result: SimulationResult, limits: BatchLimits) -> None:
    for plan in result.plans:
        assert sum(plan) == limits.global_batch_size
        assert all(
            lo <= b <= hi for b, lo, hi in zip(plan, limits.min_batch_size, limits.max_batch_size)
        )


def step_change_simulator(noise: float = 0.0, seed: int = 0) -> ClusterSimulator:
    """HL1 -> HL2 -> HL4 -> HL8 -> HL1 at boundaries 0, 5, 10, 15, 20, as multipliers of HL1."""
    base = speeds("HL1")
    changes = {
        5 * i: [s / b for s, b in zip(speeds(level), base)]
        for i, level in enumerate(["HL1", "HL2", "HL4", "HL8", "HL1"])
    }
    return ClusterSimulator.from_speeds(base, noise=noise, speed_changes=changes, seed=seed)


def memory_capped_hl8(memory_cap: int, noise: float = 0.0, seed: int = 0) -> ClusterSimulator:
    """HL8 cluster whose fastest worker slows down past ``memory_cap`` samples."""
    level_speeds = speeds("HL8")
    workers = [
        SimulatedWorker(0.01 * max(level_speeds) / s, memory_cap=memory_cap if k == 3 else None)
        for k, s in enumerate(level_speeds)
    ]
    return ClusterSimulator(workers, noise=noise, seed=seed)


# --- single updates on made-up timings ---------------------------------------------------------


def test_update_gives_batches_proportional_to_measured_throughput() -> None:
    controller = ProportionalController(deadband=0.05)
    plan = controller.update(UNIFORM, [4.0, 4.0, 6.0, 1.5], BatchLimits.build(4, GLOBAL_BATCH))
    assert plan == [48, 48, 32, 128]


def test_balanced_timings_keep_the_plan() -> None:
    plan = [48, 48, 32, 128]
    controller = ProportionalController()
    assert controller.update(plan, [2.0, 2.0, 2.0, 2.0], BatchLimits.build(4, 256)) == plan


def test_change_within_deadband_keeps_the_plan() -> None:
    # the target is [52, 48]: 4% away from the current plan, inside a 5% dead-band
    controller = ProportionalController(deadband=0.05)
    assert controller.update([50, 50], [1.0, 52 / 48], BatchLimits.build(2, 100)) == [50, 50]


def test_change_beyond_deadband_moves_to_target() -> None:
    # the target is [53, 47]: 6% away from the current plan, outside a 5% dead-band
    controller = ProportionalController(deadband=0.05)
    assert controller.update([50, 50], [1.0, 53 / 47], BatchLimits.build(2, 100)) == [53, 47]


def test_zero_deadband_follows_every_one_sample_change() -> None:
    controller = ProportionalController(deadband=0.0)
    assert controller.update([50, 50], [1.0, 51 / 49], BatchLimits.build(2, 100)) == [51, 49]


def test_plan_outside_bounds_is_corrected_even_within_deadband() -> None:
    controller = ProportionalController(deadband=0.5)
    limits = BatchLimits.build(2, 100, max_batch_size=55)
    assert controller.update([40, 60], [1.0, 1.0], limits) == [45, 55]


def test_random_updates_sum_to_global_batch_and_respect_bounds(random_case) -> None:
    rng = random.Random(0)
    for _ in range(200):
        limits, current, compute_s = random_case(rng)
        global_batch = limits.global_batch_size
        lower, upper = limits.min_batch_size[0], limits.max_batch_size[0]
        plan = ProportionalController(deadband=rng.choice([0.0, 0.05, 0.2])).update(
            current, compute_s, limits
        )
        assert sum(plan) == global_batch
        assert all(lower <= b <= upper for b in plan)


def test_controllers_fed_the_same_numbers_reach_the_same_plan() -> None:
    rng = random.Random(1)
    first, second = ProportionalController(), ProportionalController()
    plan = list(UNIFORM)
    limits = BatchLimits.build(4, GLOBAL_BATCH)
    samples_per_s = [10.0, 25.0, 40.0, 100.0]
    for _ in range(20):
        compute_s = [b / x * rng.gauss(1.0, 0.01) for b, x in zip(plan, samples_per_s)]
        plan_first = first.update(plan, compute_s, limits)
        assert second.update(plan, compute_s, limits) == plan_first
        plan = plan_first


@pytest.mark.parametrize(
    "kwargs",
    [{"deadband": -0.01}, {"deadband": 1.0}, {"throughput_drop": -0.1}, {"throughput_drop": 1.0}],
    ids=["deadband-negative", "deadband-one", "drop-negative", "drop-one"],
)
def test_invalid_deadband_or_throughput_drop_raises(kwargs: dict[str, float]) -> None:
    with pytest.raises(ValueError, match="in \\[0, 1\\)"):
        ProportionalController(**kwargs)


# --- learned maximums on made-up timings -------------------------------------------------------

CAPPED = "^hetero: Rank 1's batch size is capped at 100"


def grow_rank_one_with_a_drop(controller: ProportionalController, limits: BatchLimits) -> None:
    """Rank 1 grows 100 -> 133 and its throughput falls from 200 to 133 samples/s."""
    assert controller.update([100, 100], [1.0, 0.5], limits) == [67, 133]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # a candidate alone says nothing
        assert controller.update([67, 133], [0.67, 1.0], limits) == [86, 114]  # plans freely
    assert controller.learned_max == [None, None]
    assert controller.max_candidates[1] == {
        "size": 100,
        "throughput": 200.0,
        "grown_to": 133,
        "dropped_to": 133.0,
        "waited": 0,
    }


def test_one_throughput_drop_does_not_bind_a_maximum() -> None:
    limits = BatchLimits.build(2, 200)
    controller = ProportionalController()
    grow_rank_one_with_a_drop(controller, limits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # above 100 again at its old 200 samples/s: the drop was noise; the candidate goes
        assert controller.update([86, 114], [0.86, 0.57], limits) == [67, 133]
        assert controller.update([67, 133], [0.67, 0.665], limits) == [67, 133]
    assert controller.learned_max == [None, None]
    assert controller.max_candidates == [None, None]


def test_a_drop_seen_at_two_boundaries_binds_and_warns_with_the_rank_and_size() -> None:
    limits = BatchLimits.build(2, 200)
    controller = ProportionalController()
    grow_rank_one_with_a_drop(controller, limits)
    # still 133 samples/s at 114, above 100: confirmed; the cap holds the plan
    with pytest.warns(UserWarning, match=CAPPED) as caught:
        assert controller.update([86, 114], [0.86, 114 / 133], limits) == [100, 100]
    (message,) = [str(w.message) for w in caught]
    assert "from 200.0 samples/s at batch size 100 to 133.0 at 133, and was 133.0 at 114" in message
    assert "re-tested after 10 boundaries" in message
    assert controller.learned_max == [None, 100]
    assert controller.learned_expires_in == [None, 10]
    assert controller.max_candidates == [None, None]


def test_a_candidate_waits_while_the_rank_is_at_or_below_its_size() -> None:
    # a memory cliff: the collapsed throughput sends the rank below the candidate, where it
    # is fast again and the plan grows it; the second drop above the size confirms it
    limits = BatchLimits.build(2, 200)
    controller = ProportionalController()
    grow_rank_one_with_a_drop(controller, limits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        controller.update([110, 90], [1.1, 0.45], limits)
        controller.update([100, 100], [1.0, 0.5], limits)
    assert controller.max_candidates[1]["waited"] == 2
    with pytest.warns(UserWarning, match=CAPPED):
        assert controller.update([67, 133], [0.67, 1.0], limits) == [100, 100]
    assert controller.learned_max == [None, 100]


def test_a_candidate_waits_at_most_relearn_after_boundaries() -> None:
    limits = BatchLimits.build(2, 200)
    controller = ProportionalController(relearn_after=2)
    grow_rank_one_with_a_drop(controller, limits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        controller.update([110, 90], [1.1, 0.45], limits)
        assert controller.max_candidates[1] is not None
        controller.update([110, 90], [1.1, 0.45], limits)
        assert controller.max_candidates == [None, None]
        # a drop from 90 starts a new candidate at 90; nothing binds
        controller.update([67, 133], [0.67, 1.0], limits)
    assert controller.learned_max == [None, None]
    assert controller.max_candidates[1]["size"] == 90


def test_a_rank_slowed_for_one_boundary_returns_to_the_balanced_split() -> None:
    # the user's report: [32, 32] -> [63, 1] -> [32, 32] for good. Rank 0 runs 32 samples/s
    # and rank 1 16 (balanced: [43, 21]); rank 1 crawls for one interval, and rank 0 is
    # contended during the next, when it happens to have grown to 63
    limits = BatchLimits.build(2, 64)
    samples_per_s = [[32.0, 0.5], [20.0, 16.0]] + [[32.0, 16.0]] * 6
    controller = ProportionalController()
    plan, plans = [32, 32], []
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        for rates in samples_per_s:
            plan = controller.update(plan, [b / x for b, x in zip(plan, rates)], limits)
            plans.append(plan)
    assert plans[0] == [63, 1]  # rank 1 crawled
    assert plans[1] == [36, 28]  # rank 0 slow at 63: a candidate, not a cap of 32
    assert plans[2:] == [[43, 21]] * 6
    assert controller.learned_max == [None, None]
    assert controller.max_candidates == [None, None]


def test_a_learned_max_expires_after_relearn_after_boundaries_and_can_be_relearned() -> None:
    limits = BatchLimits.build(2, 200)
    controller = ProportionalController(relearn_after=3)
    grow_rank_one_with_a_drop(controller, limits)
    with pytest.warns(UserWarning, match="re-tested after 3 boundaries"):
        assert controller.update([86, 114], [0.86, 114 / 133], limits) == [100, 100]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        # rank 1 looks twice as fast at the cap; it holds for 3 boundaries (this one counted)
        for left in (2, 1):
            assert controller.update([100, 100], [1.0, 0.5], limits) == [100, 100]
            assert controller.learned_expires_in == [None, left]
        assert controller.update([100, 100], [1.0, 0.5], limits) == [67, 133]  # re-tested
        assert controller.learned_max == [None, None]
        assert controller.learned_expires_in == [None, None]
        # slow above 100 once more: a candidate again, which must be confirmed again
        assert controller.update([67, 133], [0.67, 1.0], limits) == [86, 114]
    assert controller.learned_max == [None, None]
    with pytest.warns(UserWarning, match=CAPPED):
        assert controller.update([86, 114], [0.86, 114 / 133], limits) == [100, 100]
    assert controller.learned_max == [None, 100]
    assert controller.learned_expires_in == [None, 3]


def test_growth_without_throughput_drop_learns_nothing() -> None:
    limits = BatchLimits.build(2, 200)
    controller = ProportionalController()
    controller.update([100, 100], [1.0, 0.5], limits)
    controller.update([67, 133], [0.67, 0.665], limits)
    assert controller.learned_max == [None, None]
    assert controller.max_candidates == [None, None]


def test_learning_can_be_switched_off() -> None:
    limits = BatchLimits.build(2, 200)
    controller = ProportionalController(learn_max_batch_size=False)
    controller.update([100, 100], [1.0, 0.5], limits)
    controller.update([67, 133], [0.67, 1.0], limits)
    controller.update([86, 114], [0.86, 114 / 133], limits)
    assert controller.learned_max == [None, None]
    assert controller.max_candidates == [None, None]


def test_learned_maxima_leaving_no_room_are_forgotten_with_warning() -> None:
    controller = ProportionalController()
    controller.load_state_dict({"learned_max": [30, 30]})
    with pytest.warns(UserWarning, match="^hetero: The learned maximum .* forgetting them"):
        plan = controller.update([50, 50], [1.0, 1.0], BatchLimits.build(2, 100))
    assert plan == [50, 50]
    assert controller.learned_max == [None, None]
    assert controller.learned_expires_in == [None, None]


@pytest.mark.parametrize("relearn_after", [0, -1, 2.5, True, "3"])
def test_invalid_relearn_after_raises(relearn_after: object) -> None:
    with pytest.raises(ValueError, match="`relearn_after` must be an integer >= 1"):
        ProportionalController(relearn_after=relearn_after)  # type: ignore[arg-type]


# --- state -------------------------------------------------------------------------------------


@pytest.mark.filterwarnings("ignore:hetero. Rank 3's batch size is capped")
def test_state_dict_is_plain_data() -> None:
    controller = ProportionalController()
    memory_capped_hl8(100).run(controller, UNIFORM, BatchLimits.build(4, GLOBAL_BATCH), 4)
    state = controller.state_dict()
    assert json.loads(json.dumps(state)) == state
    assert state["learned_max"] == [None, None, None, 64]
    assert state["learned_expires_in"] == [None, None, None, 9]


@pytest.mark.filterwarnings("ignore:hetero. Rank 3's batch size is capped")
def test_state_round_trip_gives_identical_subsequent_plans() -> None:
    limits = BatchLimits.build(4, GLOBAL_BATCH)
    original = ProportionalController()
    memory_capped_hl8(100, noise=0.03, seed=1).run(original, UNIFORM, limits, 4)
    restored = ProportionalController()
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))

    def continue_run(controller: ProportionalController) -> list[list[int]]:
        sim = memory_capped_hl8(100, noise=0.03, seed=2)
        return sim.run(controller, [32, 32, 21, 171], limits, 8).plans

    fresh_plans = continue_run(ProportionalController())
    restored_plans = continue_run(restored)
    assert restored_plans == continue_run(original)
    assert restored.state_dict() == original.state_dict()
    # the state matters: without it the controller does not know rank 3's memory limit
    assert restored_plans != fresh_plans


def test_state_round_trip_keeps_pending_candidates_and_expiry() -> None:
    limits = BatchLimits.build(2, 200)
    original = ProportionalController(relearn_after=4)
    grow_rank_one_with_a_drop(original, limits)
    restored = ProportionalController(relearn_after=4)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    for controller in (original, restored):  # the restored candidate is confirmed alike
        with pytest.warns(UserWarning, match=CAPPED):
            assert controller.update([86, 114], [0.86, 114 / 133], limits) == [100, 100]
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    for expected in ([100, 100], [100, 100], [100, 100], [67, 133]):  # and expires alike
        for controller in (original, restored):
            assert controller.update([100, 100], [1.0, 0.5], limits) == expected
    assert restored.state_dict() == original.state_dict()


def test_old_state_without_candidates_or_expiry_loads() -> None:
    # saved before learned maxima were confirmed and expired: the cap gets a full
    # relearn_after from the load, and nothing is pending
    old = {
        "learned_max": [None, 100],
        "last_batch_sizes": [100, 100],
        "last_throughput": [100.0, 200.0],
    }
    limits = BatchLimits.build(2, 200)
    controller = ProportionalController(relearn_after=2)
    controller.load_state_dict(old)
    assert controller.learned_expires_in == [None, 2]
    assert controller.max_candidates == [None, None]
    assert controller.update([100, 100], [1.0, 0.5], limits) == [100, 100]
    assert controller.update([100, 100], [1.0, 0.5], limits) == [67, 133]
    assert controller.learned_max == [None, None]


def test_loading_empty_state_gives_a_fresh_controller() -> None:
    controller = ProportionalController()
    controller.load_state_dict({})
    assert controller.state_dict() == ProportionalController().state_dict()


# --- simulated clusters: convergence -----------------------------------------------------------


@pytest.mark.parametrize("level", HETEROGENEOUS_LEVELS)
def test_uniform_start_reaches_balance_095_within_two_adjustments(level: str) -> None:
    result = run_level(level)
    assert result.balance[0] < 0.7  # the uniform start really is unbalanced
    adjustments = result.adjustments_to_balance(0.95)
    assert adjustments is not None and adjustments <= 2


@pytest.mark.parametrize("level", HETEROGENEOUS_LEVELS)
def test_uniform_start_reaches_balance_095_within_two_adjustments_under_noise(level: str) -> None:
    for seed in SEEDS:
        adjustments = run_level(level, noise=0.03, seed=seed).adjustments_to_balance(0.95)
        assert adjustments is not None and adjustments <= 2, f"seed {seed}"


@pytest.mark.parametrize("level", HETEROGENEOUS_LEVELS)
def test_steady_plan_is_within_one_sample_of_speed_proportional_split(level: str) -> None:
    result = run_level(level)
    assert result.plans[-1] == result.plans[-2]  # steady
    assert all(abs(b - x) < 1 for b, x in zip(result.plans[-1], ideal_split(level)))


@pytest.mark.parametrize("level", HETEROGENEOUS_LEVELS)
def test_plans_under_noise_stay_within_three_samples_of_speed_proportional_split(
    level: str,
) -> None:
    for seed in SEEDS:
        result = run_level(level, boundaries=10, noise=0.03, seed=seed)
        for plan in result.plans[1:]:
            assert all(abs(b - x) <= 3 for b, x in zip(plan, ideal_split(level))), f"seed {seed}"


@pytest.mark.parametrize("level", HETEROGENEOUS_LEVELS)
def test_every_plan_sums_to_global_batch_and_respects_bounds(level: str) -> None:
    limits = BatchLimits.build(4, GLOBAL_BATCH, min_batch_size=8, max_batch_size=192)
    for seed in SEEDS:
        assert_plans_valid(run_level(level, limits=limits, noise=0.03, seed=seed), limits)


@pytest.mark.parametrize(
    ("bounds", "binding_rank"),
    [({"max_batch_size": 100}, 3), ({"min_batch_size": 24}, 2)],
    ids=["max-100", "min-24"],
)
def test_tight_bounds_hold_and_plan_settles_on_bounded_proportional_split(
    bounds: dict[str, int], binding_rank: int
) -> None:
    # at HL8 the fast worker wants 171 samples and the slowest 21: one bound binds
    limits = BatchLimits.build(4, GLOBAL_BATCH, **bounds)
    (bound,) = bounds.values()
    for noise in (0.0, 0.03):
        result = run_level("HL8", limits=limits, boundaries=10, noise=noise)
        assert_plans_valid(result, limits)
        assert result.plans[-1][binding_rank] == bound
    lower, upper = limits.min_batch_size, limits.max_batch_size
    expected = proportional_split(speeds("HL8"), GLOBAL_BATCH, lower, upper)
    assert run_level("HL8", limits=limits).plans[-1] == expected


# --- simulated clusters: calm under noise ------------------------------------------------------


@pytest.mark.parametrize("level", ["HL1", *HETEROGENEOUS_LEVELS])
def test_deadband_keeps_balanced_plan_still_under_three_percent_noise(level: str) -> None:
    start = proportional_split(speeds(level), GLOBAL_BATCH)
    for seed in SEEDS:
        controller = ProportionalController()
        result = run_level(
            level, start, boundaries=30, noise=0.03, seed=seed, controller=controller
        )
        assert result.adjustments == 0, f"seed {seed}: plans {result.plans}"
        assert controller.learned_max == [None] * 4


@pytest.mark.parametrize("level", ["HL2", "HL4", "HL8"])
def test_learned_max_rule_does_not_fire_under_three_percent_noise_on_linear_workers(
    level: str,
) -> None:
    for seed in SEEDS:
        controller = ProportionalController()
        run_level(level, boundaries=30, noise=0.03, seed=seed, controller=controller)
        assert controller.learned_max == [None] * 4, f"seed {seed}"


# --- simulated clusters: changing speeds -------------------------------------------------------


def test_balance_095_is_back_within_two_adjustments_after_each_speed_change() -> None:
    controller = ProportionalController()
    result = step_change_simulator().run(controller, UNIFORM, BatchLimits.build(4, 256), 30)
    for change in (0, 5, 10, 15, 20):
        adjustments = result.adjustments_to_balance(0.95, start=change)
        assert adjustments is not None and adjustments <= 2, f"change at boundary {change}"
    assert min(result.balance[5], result.balance[10], result.balance[15], result.balance[20]) < 0.8
    assert controller.learned_max == [None] * 4  # speeds changed, not batch-size curves


def test_balance_095_is_back_within_two_adjustments_after_each_speed_change_under_noise() -> None:
    for seed in SEEDS:
        result = step_change_simulator(noise=0.03, seed=seed).run(
            ProportionalController(), UNIFORM, BatchLimits.build(4, 256), 30
        )
        for change in (0, 5, 10, 15, 20):
            adjustments = result.adjustments_to_balance(0.95, start=change)
            assert adjustments is not None and adjustments <= 2, f"seed {seed}, change {change}"


# --- simulated clusters: memory limits (paper 000, learned maximums) ---------------------------


@pytest.mark.parametrize("noise", [0.0, 0.03])
def test_worker_slowing_past_memory_cap_gets_max_lowered_to_previous_size_at_second_boundary(
    noise: float,
) -> None:
    # the fast worker grows 64 -> ~171 past its cap of 100 and its throughput collapses: a
    # candidate; the plan moves it to ~120, still past its cap and still slow: confirmed
    for seed in SEEDS if noise else [0]:
        controller = ProportionalController()
        with pytest.warns(UserWarning, match="Rank 3's batch size is capped at 64") as caught:
            result = memory_capped_hl8(100, noise=noise, seed=seed).run(
                controller, UNIFORM, BatchLimits.build(4, 256), 12
            )
        assert len(caught) == 1, f"seed {seed}"
        assert result.plans[1][3] > 100 and result.plans[2][3] > 100, f"seed {seed}"
        assert controller.learned_max == [None, None, None, 64], f"seed {seed}"
        assert all(plan[3] <= 64 for plan in result.plans[3:]), f"seed {seed}"
        assert_plans_valid(result, BatchLimits.build(4, 256))


def test_memory_cap_is_retested_every_relearn_after_boundaries_and_learned_again() -> None:
    controller = ProportionalController(relearn_after=10)
    with pytest.warns(UserWarning, match="Rank 3's batch size is capped at 64") as caught:
        result = memory_capped_hl8(100).run(controller, UNIFORM, BatchLimits.build(4, 256), 30)
    # bound at boundaries 2, 14 and 26; each time lifted 10 boundaries later, the worker
    # grows past its cap again for the two boundaries that confirm it anew
    assert len(caught) == 3
    assert [i for i, plan in enumerate(result.plans) if plan[3] > 64] == [1, 2, 13, 14, 25, 26]
    assert controller.learned_max == [None, None, None, 64]


def test_memory_candidate_waits_while_the_plan_puts_the_worker_below_it() -> None:
    # "memory": 20x per sample above 96. The collapsed throughput at ~171 sends the worker
    # to ~46, under the candidate of 64, where it is fast and grows again: the second
    # collapse confirms the candidate instead of starting the cycle over
    controller = ProportionalController()
    with pytest.warns(UserWarning, match="Rank 3's batch size is capped at 64"):
        report = run_scenario("memory", controller)
    worker = [plan[3] for plan in report.result.plans]
    assert worker[1] > 96 and worker[2] < 64 and worker[3] > 96
    assert worker[5:14] == [64] * 9
    assert controller.learned_max == [None, None, None, 64]


def test_after_a_speed_change_the_capped_worker_settles_near_its_memory_cap() -> None:
    # HL4 puts the capped worker at 128 (under its cap of 150); HL8 pushes it to 170. Sizes
    # that run within `throughput_drop` of the speed at the previous size drop each
    # candidate, so the worker closes in on its cap and the maximum confirmed is the last
    # size that fit, near 150 (not 128, the size it had before the speed change)
    workers = [SimulatedWorker(0.01, memory_cap=150 if k == 3 else None) for k in range(4)]
    base = speeds("HL1")
    changes = {
        0: [s / b for s, b in zip(speeds("HL4"), base)],
        5: [s / b for s, b in zip(speeds("HL8"), base)],
    }
    controller = ProportionalController()
    sim = ClusterSimulator(workers, speed_changes=changes)
    limits = BatchLimits.build(4, 256)
    with pytest.warns(UserWarning, match="Rank 3's batch size is capped at 15"):
        result = sim.run(controller, UNIFORM, limits, 20)
    assert result.plans[5][3] == 128
    assert max(plan[3] for plan in result.plans) > 150
    cap = controller.learned_max[3]
    assert cap is not None and 150 <= cap < 160
    assert all(150 <= plan[3] < 170 for plan in result.plans[12:])
    efficiency = [
        sim.optimal_step_s(limits, i) / max(sim.true_step_s(plan, i))
        for i, plan in enumerate(result.plans)
    ]
    assert min(efficiency[12:]) > 0.9  # a cap of 128 would give 0.75


# --- OmniLearn renormalisation (paper 002, Eqs. 6 and 8) ---------------------------------------


def omnilearn(**kwargs: float) -> ProportionalController:
    return ProportionalController(renormalization="omnilearn", **kwargs)


def test_default_renormalization_is_the_bounded_projection() -> None:
    assert ProportionalController().renormalization == "project"


def test_omnilearn_subtracts_the_same_excess_from_every_rank() -> None:
    # Eq. 6: t_mean = 3.875, so 64 * 3.875 / t = [62, 62, 41.33, 165.33], summing to 330.67;
    # Eq. 8: each rank gives back 74.67 / 4 = 18.67 -> [43.33, 43.33, 22.67, 146.67];
    # rounding hands the two missing samples to the largest fractions (ranks 2 and 3)
    plan = omnilearn().update(UNIFORM, [4.0, 4.0, 6.0, 1.5], BatchLimits.build(4, GLOBAL_BATCH))
    assert plan == [43, 43, 23, 147]


def test_omnilearn_shares_what_a_maximum_clamps_equally_among_the_others() -> None:
    # rank 3's 146.67 is clamped to 140; the 6.67 samples go 2.22 to each other rank:
    # [45.56, 45.56, 24.89, 140] -> rank 2, then rank 0 (tie with rank 1) round up
    limits = BatchLimits.build(4, GLOBAL_BATCH, max_batch_size=140)
    assert omnilearn().update(UNIFORM, [4.0, 4.0, 6.0, 1.5], limits) == [46, 45, 25, 140]


@pytest.mark.parametrize(("lower", "expected"), [(1, [15, 14, 1]), (3, [14, 13, 3])])
def test_omnilearn_clamps_a_rank_pushed_below_its_minimum(lower: int, expected: list[int]) -> None:
    # Eq. 6 gives [20, 20, 5]; Eq. 8 subtracts 5 each: [15, 15, 0]. Rank 2 is clamped to its
    # minimum and the others give up the difference equally: [14.5, 14.5, 1] or [13.5, 13.5, 3]
    limits = BatchLimits.build(3, 30, min_batch_size=lower)
    assert omnilearn().update([10, 10, 10], [1.0, 1.0, 4.0], limits) == expected


def test_omnilearn_differs_from_the_proportional_projection() -> None:
    # Eq. 6: [37.5, 75]; Eq. 8: minus 6.25 each -> [31.25, 68.75]; projection: [33.3, 66.7]
    limits = BatchLimits.build(2, 100)
    assert omnilearn().update([50, 50], [1.0, 0.5], limits) == [31, 69]
    assert ProportionalController().update([50, 50], [1.0, 0.5], limits) == [33, 67]


def test_omnilearn_keeps_a_balanced_plan_and_honours_the_deadband() -> None:
    limits = BatchLimits.build(2, 100)
    assert omnilearn().update([60, 40], [2.0, 2.0], limits) == [60, 40]
    # Eqs. 6 and 8 give [50.76, 49.24] -> [51, 49]: 2% away from the plan
    assert omnilearn(deadband=0.0).update([50, 50], [1.0, 1.0 / 0.97], limits) == [51, 49]
    assert omnilearn(deadband=0.05).update([50, 50], [1.0, 1.0 / 0.97], limits) == [50, 50]


def test_unknown_renormalization_raises() -> None:
    with pytest.raises(ValueError, match="`renormalization` must be one of"):
        ProportionalController(renormalization="scale")


def test_renormalization_is_selectable_by_name() -> None:
    controller = make_controller("proportional", renormalization="omnilearn")
    assert isinstance(controller, ProportionalController)
    assert controller.renormalization == "omnilearn"


def test_omnilearn_random_updates_sum_to_global_batch_and_respect_bounds(random_case) -> None:
    rng = random.Random(2)
    for _ in range(200):
        limits, current, compute_s = random_case(rng)
        global_batch = limits.global_batch_size
        lower, upper = limits.min_batch_size[0], limits.max_batch_size[0]
        plan = omnilearn(deadband=rng.choice([0.0, 0.05, 0.2])).update(current, compute_s, limits)
        assert sum(plan) == global_batch
        assert all(lower <= b <= upper for b in plan)


@pytest.mark.parametrize("level", HETEROGENEOUS_LEVELS)
def test_omnilearn_settles_on_the_same_split_as_the_projection(level: str) -> None:
    result = run_level(level, boundaries=40, controller=omnilearn(deadband=0.0))
    assert all(abs(b - x) < 1 for b, x in zip(result.plans[-1], ideal_split(level)))
    assert result.balance[-1] > 0.99


def test_a_rank_whose_time_does_not_fall_with_its_batch_twice_keeps_the_size_before() -> None:
    # rank 1 takes 1.5 s for any batch below 75 samples (a floor); proportional control
    # reads it as slow and shrinks it, which saves nothing
    limits = BatchLimits.build(2, 128)
    ctl = ProportionalController(deadband=0.01, learn_floor=True)
    assert ctl.update([64, 64], [0.64, 1.5], limits) == [90, 38]
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # one reading: only a candidate
        plan = ctl.update([90, 38], [0.90, 1.5], limits)
    assert plan[1] < 38 and ctl.learned_min == [None, None]
    with pytest.warns(UserWarning, match=r"^hetero: Rank 1.s step time hardly falls.*at 64"):
        plan = ctl.update(plan, [plan[0] / 100, 1.5], limits)
    assert plan == [64, 64] and ctl.learned_min == [None, 64]
    assert ctl.update([64, 64], [0.64, 1.5], limits) == [64, 64]  # held at its minimum


def test_a_slowdown_that_passes_is_no_floor() -> None:
    # rank 1 shrank while a co-located job slowed it; by the next boundary the job is gone
    limits = BatchLimits.build(2, 128)
    ctl = ProportionalController(deadband=0.01, learn_floor=True)
    ctl.update([64, 64], [0.64, 0.64], limits)
    ctl.update([64, 64], [0.64, 1.28], limits)
    ctl.update([85, 43], [0.85, 0.86], limits)  # 43 samples, as slow as 64 were: a candidate
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.update([85, 43], [0.85, 0.43], limits)  # the job left: 10 ms per sample again
    assert ctl.learned_min == [None, None] and ctl.floor_candidates == [None, None]


def test_a_rank_whose_time_fell_with_its_batch_learns_no_floor() -> None:
    limits = BatchLimits.build(2, 128)
    ctl = ProportionalController(deadband=0.01, learn_floor=True)
    ctl.update([64, 64], [0.64, 1.28], limits)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        ctl.update([85, 43], [0.85, 0.86], limits)
    assert ctl.learned_min == [None, None] and ctl.floor_candidates == [None, None]


def test_a_learned_floor_expires_after_relearn_after_boundaries_and_travels_in_the_state() -> None:
    limits = BatchLimits.build(2, 128)
    ctl = ProportionalController(deadband=0.01, relearn_after=2, learn_floor=True)
    ctl.update([64, 64], [0.64, 1.5], limits)
    plan = ctl.update([90, 38], [0.90, 1.5], limits)
    with pytest.warns(UserWarning, match="per-step"):
        ctl.update(plan, [plan[0] / 100, 1.5], limits)
    restored = ProportionalController(deadband=0.01, relearn_after=2, learn_floor=True)
    restored.load_state_dict(ctl.state_dict())
    assert restored.learned_min == [None, 64] and restored.floor_expires_in == [None, 2]
    restored.update([64, 64], [0.64, 1.5], limits)
    assert restored.learned_min == [None, 64]
    restored.update([64, 64], [0.64, 1.5], limits)
    assert restored.learned_min == [None, None]


def test_the_floor_rule_is_off_by_default_and_can_be_switched_off() -> None:
    limits = BatchLimits.build(2, 128)
    assert ProportionalController().learn_floor is False
    ctl = ProportionalController(deadband=0.01, learn_floor=False)
    plan = ctl.update([64, 64], [0.64, 1.5], limits)
    plan = ctl.update(plan, [plan[0] / 100, 1.5], limits)
    assert ctl.update(plan, [plan[0] / 100, 1.5], limits) != [64, 64]
    assert ctl.learned_min == [None, None]


def _times(plan: list[int], throughput: list[float]) -> list[float]:
    return [b / x for b, x in zip(plan, throughput)]


def test_an_outlier_reading_at_a_size_makes_no_candidate_maximum() -> None:
    # pytorch-forecasting's ar.py (issue 33): rank 0 read 142-188 samples/s at 64, once 221.7
    ctl = ProportionalController(deadband=0.05)
    limits = BatchLimits.build(2, 128)
    for x0 in (165.0, 158.0, 170.0, 162.0):
        assert ctl.update([64, 64], _times([64, 64], [x0, 160.0]), limits) == [64, 64]
    moved = ctl.update([64, 64], _times([64, 64], [221.7, 160.0]), limits)
    assert moved[0] > 64
    ctl.update(moved, _times(moved, [165.0, 160.0]), limits)  # as fast as it usually is at 64
    assert ctl.max_candidates == [None, None] and ctl.learned_max == [None, None]


def test_a_plan_the_guard_imposes_lifts_the_maximum_it_contradicts() -> None:
    ctl = ProportionalController(deadband=0.05)
    limits = BatchLimits.build(2, 128)
    ctl.update([64, 64], _times([64, 64], [200.0, 150.0]), limits)
    ctl.learned_max, ctl.learned_expires_in = [64, None], [10, None]
    ctl.max_candidates = [
        None,
        {"size": 40, "throughput": 1.0, "grown_to": 50, "dropped_to": 0.5, "waited": 0},
    ]
    ctl.plan_imposed([77, 51])  # the step-time guard measured [77, 51] faster
    assert ctl.learned_max == [None, None] and ctl.learned_expires_in == [None, None]
    assert ctl.max_candidates == [None, None]
    # the controller no longer forces rank 0 back to 64: no alternation with the guard
    assert ctl.update([77, 51], _times([77, 51], [200.0, 150.0]), limits)[0] > 64


def test_a_replay_of_guard_and_learned_maximum_does_not_alternate() -> None:
    # ar.py run 3 (issue 33): rank 0 capped at 64, though [77, 51] runs faster (rank 0 is
    # more efficient at larger batches); the guard reverts [64, 64] to [77, 51]
    from lightning_hetero.planning.guard import StepTimeGuard

    def speeds(plan: list[int]) -> list[float]:
        return [165.0 if plan[0] <= 64 else 190.0, 128.0]

    ctl, guard = ProportionalController(deadband=0.05), StepTimeGuard()
    limits = BatchLimits.build(2, 128)
    ctl.update([77, 51], _times([77, 51], speeds([77, 51])), limits)
    ctl.learned_max, ctl.learned_expires_in = [64, None], [10, None]
    plan, plans = [77, 51], []
    for _ in range(10):
        times = _times(plan, speeds(plan))
        back = guard.review(plan, max(times), 0.001, 20)
        new = ctl.update(plan, times, limits)
        if back is not None:
            new = back
            ctl.plan_imposed(back)
        else:
            new = guard.propose(plan, new)
        plans.append(plan)
        plan = new
    changes = sum(a != b for a, b in zip(plans, plans[1:]))
    assert changes <= 2 and plans[-1] == [77, 51], plans


# ---------------------------------------------------------------- moves sized by evidence
# Issue 42: two ranks, 8 steps between boundaries (adjust_every=8), 30% per-step noise and
# stalls (the probability, seconds), in milliseconds: 16 samples take 16 ms on a rank of speed 1.
_HEAVY_NOISE = [(0.15, 0.05), (0.3, 0.02)]


def _noisy_pair(speeds: list[float], stalls: tuple[float, float], seed: int) -> list[list[int]]:
    workers = [SimulatedWorker(0.001 * max(speeds) / s) for s in speeds]
    sim = ClusterSimulator(workers, noise=0.3, stalls=stalls, seed=seed)
    limits = BatchLimits.build(2, 32)
    result = sim.run(
        ProportionalController(deadband="auto"), [16, 16], limits, 32, 8, guard=StepTimeGuard()
    )
    return result.plans


@pytest.mark.filterwarnings("ignore:hetero. Rank .*'s batch size is capped")
@pytest.mark.parametrize("stalls", _HEAVY_NOISE)
def test_equal_ranks_stay_within_ten_percent_of_uniform_under_heavy_noise(stalls) -> None:
    for seed in range(10):
        plans = _noisy_pair([1.0, 1.0], stalls, seed)
        assert all(abs(plan[0] - 16) <= 1.6 for plan in plans), (seed, plans)


@pytest.mark.filterwarnings("ignore:hetero. Rank .*'s batch size is capped")
@pytest.mark.parametrize("stalls", _HEAVY_NOISE)
def test_a_three_to_one_pair_under_heavy_noise_is_split_by_the_second_boundary(stalls) -> None:
    for seed in range(10):
        plans = _noisy_pair([3.0, 1.0], stalls, seed)
        assert abs(plans[2][0] - 24) <= 0.15 * 24, (seed, plans[:3])


def _se(relative: float, compute_s: list[float]) -> list[RankStats]:
    return [RankStats(compute_se=relative * t) for t in compute_s]


def test_an_unsure_move_is_a_probe_of_a_tenth_of_the_batch() -> None:
    ctl = ProportionalController(deadband="auto")
    limits = BatchLimits.build(2, 64)
    times = [0.032, 0.064]  # 2:1 in speed, but each time is only 15% sure: z = 3.3
    assert ctl.update([32, 32], times, limits, _se(0.15, times)) == [35, 29]
    assert ctl.probing == [1, -1]


def test_a_sure_move_is_made_in_full_at_once() -> None:
    ctl = ProportionalController(deadband="auto")
    limits = BatchLimits.build(2, 64)
    times = [0.032, 0.064]  # 1% sure: z = 49
    assert ctl.update([32, 32], times, limits, _se(0.01, times)) == [43, 21]
    assert ctl.probing is None


def test_a_probe_the_next_boundary_confirms_moves_to_the_pooled_split() -> None:
    ctl = ProportionalController(deadband="auto")
    limits = BatchLimits.build(2, 64)
    first = [0.032, 0.064]
    probe = ctl.update([32, 32], first, limits, _se(0.15, first))
    then = [0.035, 0.058]  # at the probe [35, 29]: the same 2:1 speeds, the same way
    assert ctl.update(probe, then, limits, _se(0.15, then)) == [43, 21]


def test_a_probe_the_next_boundary_contradicts_is_not_followed() -> None:
    ctl = ProportionalController(deadband="auto")
    limits = BatchLimits.build(2, 64)
    first = [0.032, 0.064]
    probe = ctl.update([32, 32], first, limits, _se(0.15, first))
    for slower in (1.3, 1.8):  # now rank 0 looks slower: the first boundary was a fluke
        then = [0.035 * slower, 0.029]
        back = ctl.update(probe, then, limits, _se(0.15, then))
        assert back[0] <= probe[0] and abs(back[0] - 32) <= 3


def test_timings_without_noise_readings_move_in_full_as_before() -> None:
    ctl = ProportionalController(deadband=0.05)
    assert ctl.update([32, 32], [0.032, 0.064], BatchLimits.build(2, 64)) == [43, 21]


def test_a_throughput_drop_within_the_noise_binds_no_maximum() -> None:
    # rank 0 grew 16 -> 24 and its throughput fell 20%, but each reading is 15% unsure
    ctl = ProportionalController(deadband=0.01)
    limits = BatchLimits.build(2, 32)
    ctl.update([16, 16], [0.016, 0.048], limits, _se(0.15, [0.016, 0.048]))
    for _ in range(3):
        ctl.update([24, 8], [0.030, 0.024], limits, _se(0.15, [0.030, 0.024]))
    assert ctl.learned_max == [None, None] and ctl.max_candidates == [None, None]


@pytest.mark.parametrize("kwargs", [{"jump_z": -1.0}, {"probe_step": 0.0}, {"probe_step": 1.5}])
def test_bad_evidence_options_are_refused(kwargs) -> None:
    with pytest.raises(ValueError, match=next(iter(kwargs))):
        ProportionalController(**kwargs)


# ---------------------------------------------------------------- fixed per-step costs
# Issue 43: 4 ranks, 50 ms a step on each (fixed) and 200 ms per 16 samples more on rank 1
# (a backward straggler), 8 steps between boundaries, as bench.straggler's hetero run.
def _straggler_workers() -> list[SimulatedWorker]:
    workers = [SimulatedWorker(0.0005, 0.05) for _ in range(4)]
    workers[1] = SimulatedWorker(0.0005 + 0.2 / 16, 0.05)
    return workers


def test_a_slow_rank_with_a_fixed_step_cost_gets_its_equal_time_batch_at_the_second_move():
    limits = BatchLimits.build(4, 64)
    for fixed_costs, final in ((True, [21, 1, 21, 21]), (False, [21, 2, 21, 20])):
        ctl = ProportionalController(deadband="auto", fixed_costs=fixed_costs)
        plan, plans = [16] * 4, []
        for _ in range(4):
            times = [w.step_s(b) for w, b in zip(_straggler_workers(), plan)]
            plans.append(plan)
            plan = ctl.update(plan, times, limits, _se(0.01, times))
        # proportional steps alone stop at 2 samples (76 ms a step against 63 at 1)
        assert plans[1] == [20, 4, 20, 20] and plans[2:] == [final, final], plans
    assert ctl.fixed_s == [0.0] * 4  # the plan holds: nothing fitted


@pytest.mark.parametrize("noise", [0.02, 0.05, 0.1])
def test_the_backward_straggler_recovers_ninety_percent_of_the_allowed_speedup_by_boundary_3(
    noise: float,
) -> None:
    limits = BatchLimits.build(4, 64)
    for seed in range(10):
        sim = ClusterSimulator(_straggler_workers(), noise=noise, seed=seed)
        ctl = ProportionalController(deadband="auto")
        result = sim.run(ctl, [16] * 4, limits, 4, 8, guard=StepTimeGuard())
        best, uniform = sim.optimal_step_s(limits, 0), max(sim.true_step_s([16] * 4, 0))
        third = max(sim.true_step_s(result.plans[3], 0))
        assert (uniform / third) / (uniform / best) >= 0.9, (seed, result.plans)


def test_a_fixed_cost_is_fitted_only_from_a_shrink_of_a_quarter_beyond_the_noise() -> None:
    from lightning_hetero.planning.proportional import _fixed_costs

    before = ([16, 16, 16, 16], [16 / 0.258, 16 / 0.08, 16 / 0.16, 16 / 0.1])
    now = [4, 13, 32, 4]  # shrunk 75%, shrunk 19%, grew, shrunk 75% on a linear rank
    times = [0.102, 0.07, 0.3, 0.025]
    fixed = _fixed_costs(now, times, [0.01] * 4, before, [0.01] * 4)
    assert fixed[0] == pytest.approx(0.05) and fixed[1:] == [0.0, 0.0, 0.0]
    # the same readings 20% noisy: an intercept within two standard errors is no cost
    assert _fixed_costs(now, times, [0.2] * 4, before, [0.2] * 4) == [0.0] * 4


def test_a_probe_on_four_ranks_is_confirmed_by_its_main_move_despite_one_sample_jitter() -> None:
    from lightning_hetero.planning.proportional import _agrees

    probe = [0, -1, 1, 1]  # [20, 4, 19, 21] -> [20, 3, 19, 22]
    assert _agrees(probe, [20, 3, 19, 22], [21, 1, 19, 23])
    assert not _agrees(probe, [20, 3, 19, 22], [20, 4, 19, 21])  # the main move reversed
    assert not _agrees(probe, [20, 3, 19, 22], [20, 1, 17, 26])  # rank 2 back by 2 samples
    assert not _agrees(None, [20, 3, 19, 22], [21, 1, 19, 23])
