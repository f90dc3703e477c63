"""Tests for lightning_hetero/planning/stepwise.py: LB-BSP step-by-step moves (paper 001 Alg. 2)."""

import json
import random
import warnings
from dataclasses import replace
from math import nan

import pytest

from lightning_hetero.planning.base import BatchLimits, RankStats
from lightning_hetero.planning.registry import make_controller
from lightning_hetero.planning.scenarios import SCENARIOS, run_scenario
from lightning_hetero.planning.simulator import ClusterSimulator
from lightning_hetero.planning.split import proportional_split
from lightning_hetero.planning.stepwise import StepwiseController

LIMITS_2 = BatchLimits.build(2, 64)
LIMITS_3 = BatchLimits.build(3, 90)


def feed(
    controller: StepwiseController,
    plan: list[int],
    compute_s: list[float],
    limits: BatchLimits,
    times: int,
    stats: list[RankStats] | None = None,
) -> list[list[int]]:
    """Call ``update`` ``times`` times, each on the plan the previous call returned."""
    plans = []
    for _ in range(times):
        plan = controller.update(plan, compute_s, limits, stats)
        plans.append(plan)
    return plans


def memory(*used: float) -> list[RankStats]:
    return [RankStats(memory_used=u) for u in used]


# --- observation window ------------------------------------------------------------------------


def test_move_comes_after_a_whole_window_of_boundaries() -> None:
    plans = feed(StepwiseController(), [32, 32], [1.0, 2.0], LIMITS_2, 5)
    assert plans == [[32, 32]] * 4 + [[37, 27]]


def test_window_restarts_after_each_move() -> None:
    controller = StepwiseController(fast_window=3)
    plans = feed(controller, [32, 32], [1.0, 2.0], LIMITS_2, 6)
    assert plans == [[32, 32], [32, 32], [37, 27], [37, 27], [37, 27], [42, 22]]


def test_boundary_with_the_pair_the_other_way_round_delays_the_move() -> None:
    controller = StepwiseController(fast_window=3)
    # rank 1 led at the first boundary: rank 0 must then lead for three boundaries of its own
    assert controller.update([32, 32], [2.0, 1.0], LIMITS_2) == [32, 32]
    assert feed(controller, [32, 32], [1.0, 2.0], LIMITS_2, 3) == [[32, 32]] * 2 + [[37, 27]]


def test_timings_under_another_plan_do_not_count() -> None:
    controller = StepwiseController(fast_window=3)
    feed(controller, [32, 32], [1.0, 2.0], LIMITS_2, 2)
    # someone else changed the plan: the window starts again
    assert feed(controller, [30, 34], [1.0, 2.0], LIMITS_2, 3) == [[30, 34]] * 2 + [[35, 29]]


def test_lead_within_the_deadband_does_not_count() -> None:
    controller = StepwiseController(fast_window=1, deadband=0.05)
    assert feed(controller, [32, 32], [1.0, 1.04], LIMITS_2, 3) == [[32, 32]] * 3
    assert controller.update([32, 32], [1.0, 1.06], LIMITS_2) == [37, 27]


def test_windows_and_steps_follow_the_options() -> None:
    controller = StepwiseController(fast_step=3, fast_window=2)
    assert feed(controller, [32, 32], [1.0, 2.0], LIMITS_2, 2) == [[32, 32], [35, 29]]
    assert controller.step == 3 and controller.window == 2


# --- leader, straggler, bounds -----------------------------------------------------------------


def test_samples_move_from_slowest_to_fastest_rank() -> None:
    controller = StepwiseController(fast_window=1)
    assert controller.update([30, 30, 30], [2.0, 3.0, 1.0], LIMITS_3) == [30, 25, 35]


def test_leader_skips_a_rank_using_095_of_its_memory_or_more() -> None:
    compute_s = [2.0, 3.0, 1.0]
    controller = StepwiseController(fast_window=1)
    assert controller.update([30, 30, 30], compute_s, LIMITS_3, memory(0.5, 0.5, 0.95)) == [
        35,
        25,
        30,
    ]
    controller = StepwiseController(fast_window=1)
    assert controller.update([30, 30, 30], compute_s, LIMITS_3, memory(0.5, 0.5, 0.94)) == [
        30,
        25,
        35,
    ]


def test_unknown_memory_use_counts_as_room() -> None:
    controller = StepwiseController(fast_window=1)
    plan = controller.update([30, 30, 30], [2.0, 3.0, 1.0], LIMITS_3, memory(nan, nan, nan))
    assert plan == [30, 25, 35]


def test_memory_threshold_is_an_option() -> None:
    controller = StepwiseController(fast_window=1, memory_threshold=0.5)
    plan = controller.update([30, 30, 30], [2.0, 3.0, 1.0], LIMITS_3, memory(0.4, 0.4, 0.6))
    assert plan == [35, 25, 30]


def test_no_move_when_every_other_rank_is_short_of_memory() -> None:
    controller = StepwiseController(fast_window=1)
    stats = memory(0.99, 0.5, 0.99)
    assert feed(controller, [30, 30, 30], [2.0, 3.0, 1.0], LIMITS_3, 3, stats) == [[30, 30, 30]] * 3


def test_leader_at_its_maximum_gives_way_to_the_next_fastest() -> None:
    limits = BatchLimits.build(3, 90, max_batch_size=[40, 40, 30])
    controller = StepwiseController(fast_window=1)
    assert controller.update([30, 30, 30], [2.0, 3.0, 1.0], limits) == [35, 25, 30]


def test_move_stops_at_the_leaders_maximum() -> None:
    limits = BatchLimits.build(2, 64, max_batch_size=34)
    controller = StepwiseController(fast_window=1)
    assert controller.update([32, 32], [1.0, 2.0], limits) == [34, 30]


def test_plan_outside_the_limits_is_brought_within() -> None:
    limits = BatchLimits.build(2, 64, max_batch_size=40)
    assert StepwiseController().update([50, 14], [1.0, 1.0], limits) == [40, 24]


def test_mismatched_lengths_or_bad_timings_raise() -> None:
    with pytest.raises(ValueError, match="per rank"):
        StepwiseController().update([32, 32], [1.0, 1.0, 1.0], LIMITS_2)
    with pytest.raises(ValueError, match="finite and positive"):
        StepwiseController().update([32, 32], [1.0, nan], LIMITS_2)


# --- phases ------------------------------------------------------------------------------------


def test_gainer_becoming_the_straggler_switches_to_fine_tune() -> None:
    controller = StepwiseController(fast_window=1, fine_window=1)
    assert controller.update([32, 32], [1.0, 2.0], LIMITS_2) == [37, 27]
    assert controller.phase == "fast"
    # rank 0 overshot: it is now the straggler, so the next move is one sample back
    assert controller.update([37, 27], [2.0, 1.0], LIMITS_2) == [36, 28]
    assert controller.phase == "fine"
    assert (controller.step, controller.window) == (1, 1)


def test_giver_becoming_the_leader_switches_to_fine_tune() -> None:
    controller = StepwiseController(fast_window=1, fine_window=1)
    assert controller.update([30, 30, 30], [1.0, 2.0, 3.0], LIMITS_3) == [35, 30, 25]
    # rank 2 gave samples and is now the fastest; rank 0 is not the straggler
    assert controller.update([35, 30, 25], [2.0, 3.0, 1.0], LIMITS_3) == [35, 29, 26]
    assert controller.phase == "fine"


def test_moves_toward_balance_stay_in_fast_approach() -> None:
    controller = StepwiseController(fast_window=1)
    plan = [30, 30, 30]
    for compute_s in ([2.0, 3.0, 1.0], [3.0, 2.0, 1.0], [2.0, 3.0, 1.0]):
        plan = controller.update(plan, compute_s, LIMITS_3)
    assert plan == [25, 20, 45]
    assert controller.phase == "fast"


def test_fine_tune_waits_for_its_own_longer_window() -> None:
    controller = StepwiseController(fast_window=1, fine_window=4)
    controller.update([32, 32], [1.0, 2.0], LIMITS_2)
    plans = feed(controller, [37, 27], [2.0, 1.0], LIMITS_2, 4)
    assert plans == [[37, 27]] * 3 + [[36, 28]]


def test_fine_tune_is_for_good() -> None:
    controller = StepwiseController(fast_window=1, fine_window=1)
    controller.update([32, 32], [1.0, 2.0], LIMITS_2)
    plans = feed(controller, [37, 27], [2.0, 1.0], LIMITS_2, 3)
    assert plans == [[36, 28], [35, 29], [34, 30]]
    assert controller.phase == "fine"


# --- a straggler with nothing left to give -----------------------------------------------------


def test_straggler_that_would_reach_zero_warns_and_stops_at_its_minimum() -> None:
    limits = BatchLimits.build(2, 40)
    controller = StepwiseController(fast_window=1)
    with pytest.warns(UserWarning, match="Rank 1 is the straggler .* without this rank"):
        assert controller.update([36, 4], [1.0, 2.0], limits) == [39, 1]


def test_warning_comes_once_per_episode() -> None:
    limits = BatchLimits.build(2, 40, min_batch_size=4)
    controller = StepwiseController(fast_window=1)
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        feed(controller, [36, 4], [1.0, 2.0], limits, 5)
        assert len(caught) == 1
        # rank 0 straggles (rank 1 has no memory to lead): the episode ends without a move
        assert controller.update([36, 4], [2.0, 1.0], limits, memory(0.5, 0.99)) == [36, 4]
        feed(controller, [36, 4], [1.0, 2.0], limits, 2)
    assert len(caught) == 2
    assert all("Rank 1" in str(w.message) for w in caught)


def test_straggler_with_room_gives_without_a_warning() -> None:
    controller = StepwiseController(fast_window=1)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert controller.update([32, 32], [1.0, 2.0], LIMITS_2) == [37, 27]


# --- plans always valid ------------------------------------------------------------------------


def test_random_updates_sum_to_global_batch_and_respect_bounds() -> None:
    rng = random.Random(0)
    for _ in range(100):
        world_size = rng.randint(1, 8)
        lower = rng.randint(1, 6)
        upper = lower + rng.randint(0, 40)
        global_batch = rng.randint(world_size * lower, world_size * upper)
        limits = BatchLimits.build(world_size, global_batch, lower, upper)
        controller = StepwiseController(
            fast_step=rng.randint(1, 8), fast_window=rng.randint(1, 3), fine_window=2
        )
        plan = proportional_split(
            [1.0] * world_size, global_batch, limits.min_batch_size, limits.max_batch_size
        )
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")
            for _ in range(20):
                compute_s = [rng.uniform(0.01, 5.0) for _ in range(world_size)]
                stats = memory(*(rng.choice([nan, 0.5, 0.97]) for _ in range(world_size)))
                plan = controller.update(plan, compute_s, limits, stats)
                assert sum(plan) == global_batch
                assert all(lower <= b <= upper for b in plan)


def test_single_rank_keeps_the_whole_batch() -> None:
    limits = BatchLimits.build(1, 16)
    assert feed(StepwiseController(fast_window=1), [16], [1.0], limits, 3) == [[16]] * 3


# --- construction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"fast_step": 0}, "`fast_step` must be an integer >= 1"),
        ({"fast_window": 0}, "`fast_window` must be an integer >= 1"),
        ({"fine_step": -1}, "`fine_step` must be an integer >= 1"),
        ({"fine_window": 0}, "`fine_window` must be an integer >= 1"),
        ({"fine_window": 2.5}, "`fine_window` must be an integer >= 1"),
        ({"memory_threshold": 0.0}, "`memory_threshold` must be in \\(0, 1\\]"),
        ({"memory_threshold": 1.01}, "`memory_threshold` must be in \\(0, 1\\]"),
        ({"deadband": 1.0}, "`deadband` must be in \\[0, 1\\)"),
        ({"deadband": -0.1}, "`deadband` must be in \\[0, 1\\)"),
    ],
    ids=lambda value: str(value) if isinstance(value, dict) else "",
)
def test_invalid_options_raise(kwargs: dict[str, float], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        StepwiseController(**kwargs)  # type: ignore[arg-type]


def test_defaults_are_the_papers() -> None:
    controller = StepwiseController()
    assert (controller.fast_step, controller.fast_window) == (5, 5)
    assert (controller.fine_step, controller.fine_window) == (1, 20)
    assert (controller.memory_threshold, controller.deadband) == (0.95, 0.0)


def test_built_by_name_with_the_strategys_deadband() -> None:
    controller = make_controller("stepwise", deadband=0.05)
    assert isinstance(controller, StepwiseController)
    assert controller.deadband == 0.05


# --- state -------------------------------------------------------------------------------------


def test_state_round_trip_gives_identical_continuation() -> None:
    limits = BatchLimits.build(4, 256)
    sim = ClusterSimulator.from_speeds([9, 9, 6, 24], noise=0.02, seed=3)
    original = StepwiseController(fast_window=2, fine_window=3)
    sim.run(original, [64] * 4, limits, 28)
    plan = original.last_plan
    assert original.phase == "fine" and original.observed
    restored = StepwiseController(fast_window=2, fine_window=3)
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()

    def continue_run(controller: StepwiseController) -> list[list[int]]:
        return (
            ClusterSimulator.from_speeds([9, 9, 6, 24], noise=0.02, seed=4)
            .run(controller, plan, limits, 20)
            .plans
        )

    restored_plans = continue_run(restored)
    assert restored_plans == continue_run(original)
    # the state matters: a fresh controller is still in the fast-approach phase
    assert restored_plans != continue_run(StepwiseController(fast_window=2, fine_window=3))


def test_loading_empty_state_gives_a_fresh_controller() -> None:
    controller = StepwiseController()
    controller.load_state_dict({})
    assert controller.state_dict() == StepwiseController().state_dict()


# --- simulated clusters ------------------------------------------------------------------------


def test_capped_rank_stops_leading_once_it_uses_095_of_its_memory() -> None:
    scenario = replace(SCENARIOS["memory"], boundaries=120)
    result = run_scenario(scenario, StepwiseController()).result
    capped = [entry["batch_sizes"][3] for entry in result.history]
    used = [entry["stats"][3].memory_used for entry in result.history]
    assert max(used) >= 0.95  # the rule was put to the test
    for now, after, memory_used in zip(capped, capped[1:], used):
        if after > now:
            assert memory_used < 0.95
    assert max(capped) == 94  # 89 samples use 0.93 of the cap of 96, 94 use 0.98


def test_deadband_keeps_a_homogeneous_cluster_still_under_noise() -> None:
    limits = BatchLimits.build(4, 256)
    for seed in range(5):
        sim = ClusterSimulator.from_speeds([1.0] * 4, noise=0.05, seed=seed)
        result = sim.run(StepwiseController(deadband=0.05), [64] * 4, limits, 60)
        assert result.adjustments == 0, f"seed {seed}"
