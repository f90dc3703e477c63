"""Tests for lightning_hetero/planning/updates.py: batch scaling by update counts (paper 004)."""

import json
import random
from math import inf, nan

import pytest

from lightning_hetero.planning.base import BatchLimits, RankStats
from lightning_hetero.planning.registry import make_controller
from lightning_hetero.planning.simulator import ClusterSimulator
from lightning_hetero.planning.updates import UpdatesController


def reported(*updates: int | None) -> list[RankStats]:
    return [RankStats(updates=u) for u in updates]


def megabatch_counts(batch_sizes: list[int], samples_per_s: list[float], pool: int) -> list[int]:
    """Updates each rank makes while ranks claim batches from a shared pool until it is used up."""
    free_at = [0.0] * len(batch_sizes)
    counts = [0] * len(batch_sizes)
    while pool > 0:
        rank = min(range(len(free_at)), key=lambda k: (free_at[k], k))
        pool -= batch_sizes[rank]
        free_at[rank] += batch_sizes[rank] / samples_per_s[rank]
        counts[rank] += 1
    return counts


# --- the rule ----------------------------------------------------------------------------------


def test_each_rank_moves_by_beta_times_its_deviation_from_the_mean_count() -> None:
    controller = UpdatesController(beta=2.0)
    plan = controller.update([64, 64], [1.0, 1.0], BatchLimits.build(2, 128), reported(12, 8))
    assert plan == [68, 60]


def test_lr_factors_are_new_over_old_batch_size() -> None:
    controller = UpdatesController(beta=2.0)
    controller.update([64, 64], [1.0, 1.0], BatchLimits.build(2, 128), reported(12, 8))
    assert controller.lr_factors == [68 / 64, 60 / 64]


def test_unchanged_plan_has_lr_factors_one() -> None:
    controller = UpdatesController()
    plan = controller.update([48, 80], [1.0, 1.0], BatchLimits.build(2, 128))
    assert plan == [48, 80]
    assert controller.lr_factors == [1.0, 1.0]


def test_move_past_a_bound_is_rejected_and_the_rest_renormalised() -> None:
    # targets 30, 40, 50: rank 2's move would pass its maximum of 45, so it keeps 40;
    # [30, 40, 40] is scaled by 120 / 110 to [32.7, 43.6, 43.6] and rounded to keep 120
    limits = BatchLimits.build(3, 120, max_batch_size=45)
    controller = UpdatesController(beta=1.0)
    assert controller.update([40, 40, 40], [1.0] * 3, limits, reported(0, 10, 20)) == [33, 44, 43]


def test_move_below_the_minimum_is_rejected() -> None:
    limits = BatchLimits.build(2, 40, min_batch_size=15)
    controller = UpdatesController(beta=1.0)
    # rank 0 would fall to 12: it keeps 20; [20, 28] is scaled by 40 / 48 to [16.7, 23.3]
    assert controller.update([20, 20], [1.0, 1.0], limits, reported(2, 18)) == [17, 23]


def test_default_beta_is_half_the_mean_batch_per_mean_count() -> None:
    # beta = 64 / (2 * 20) = 1.6: deviations of 10 updates move 16 samples
    controller = UpdatesController()
    plan = controller.update([64, 64], [1.0, 1.0], BatchLimits.build(2, 128), reported(30, 10))
    assert plan == [80, 48]


def test_no_updates_anywhere_keeps_the_plan() -> None:
    controller = UpdatesController()
    assert controller.update([50, 50], [1.0, 1.0], BatchLimits.build(2, 100), reported(0, 0)) == [
        50,
        50,
    ]


# --- update counts -----------------------------------------------------------------------------


def test_derived_counts_are_the_time_of_the_pool_over_each_step_time() -> None:
    # 15 samples/s in all: a pool of 300 lasts 20 s, in which the ranks step 20 and 10 times
    controller = UpdatesController(megabatch_size=300)
    counts = controller.update_counts([10, 10], [1.0, 2.0], BatchLimits.build(2, 20))
    assert counts == pytest.approx([20.0, 10.0])
    assert sum(b * u for b, u in zip([10, 10], counts)) == pytest.approx(300)


def test_default_megabatch_is_ten_global_batches() -> None:
    counts = UpdatesController().update_counts([10, 10], [1.0, 2.0], BatchLimits.build(2, 20))
    assert counts == pytest.approx([40 / 3, 20 / 3])


def test_reported_counts_are_used_when_every_rank_reports() -> None:
    controller = UpdatesController()
    limits = BatchLimits.build(2, 20)
    assert controller.update_counts([10, 10], [1.0, 2.0], limits, reported(7, 9)) == [7.0, 9.0]
    derived = controller.update_counts([10, 10], [1.0, 2.0], limits)
    assert controller.update_counts([10, 10], [1.0, 2.0], limits, reported(7, None)) == derived
    assert controller.update_counts([10, 10], [1.0, 2.0], limits, reported(None, None)) == derived


def test_last_updates_holds_the_counts_used() -> None:
    controller = UpdatesController()
    controller.update([64, 64], [1.0, 1.0], BatchLimits.build(2, 128), reported(30, 10))
    assert controller.last_updates == [30.0, 10.0]


def test_megabatch_size_matters_only_with_a_fixed_beta() -> None:
    limits = BatchLimits.build(4, 256)
    compute_s = [4.0, 4.0, 6.0, 1.5]

    def plan(beta: float | None, megabatch_size: int) -> list[int]:
        return UpdatesController(beta, megabatch_size).update([64] * 4, compute_s, limits)

    assert plan(None, 256) == plan(None, 25600)
    assert plan(1.0, 256) != plan(1.0, 25600)


def test_invalid_reported_counts_raise() -> None:
    with pytest.raises(ValueError, match="Update counts must be finite and >= 0"):
        UpdatesController().update([5, 5], [1.0, 1.0], BatchLimits.build(2, 10), reported(-1, 3))


def test_bad_timings_or_lengths_raise() -> None:
    limits = BatchLimits.build(2, 10)
    with pytest.raises(ValueError, match="finite and positive"):
        UpdatesController().update([5, 5], [1.0, 0.0], limits)
    with pytest.raises(ValueError, match="per rank"):
        UpdatesController().update([5, 5], [1.0], limits)


# --- plans always valid ------------------------------------------------------------------------


@pytest.mark.parametrize("counts", ["derived", "reported"])
def test_random_updates_sum_to_global_batch_and_respect_bounds(counts: str, random_case) -> None:
    rng = random.Random(0)
    for _ in range(200):
        limits, current, compute_s = random_case(rng)
        world_size, global_batch = limits.world_size, limits.global_batch_size
        lower, upper = limits.min_batch_size[0], limits.max_batch_size[0]
        stats = (
            reported(*(rng.randint(0, 500) for _ in range(world_size)))
            if counts == "reported"
            else None
        )
        controller = UpdatesController(beta=rng.choice([None, 0.1, 1.0, 50.0]))
        plan = controller.update(current, compute_s, limits, stats)
        assert sum(plan) == global_batch
        assert all(lower <= b <= upper for b in plan)
        assert controller.lr_factors == [new / old for new, old in zip(plan, current)]


# --- construction ------------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"beta": 0.0}, "`beta` must be a finite number > 0"),
        ({"beta": -1.0}, "`beta` must be a finite number > 0"),
        ({"beta": nan}, "`beta` must be a finite number > 0"),
        ({"beta": inf}, "`beta` must be a finite number > 0"),
        ({"beta": True}, "`beta` must be a finite number > 0"),
        ({"beta": "1"}, "`beta` must be a finite number > 0"),
        ({"megabatch_size": 0}, "`megabatch_size` must be a positive integer"),
        ({"megabatch_size": 2.5}, "`megabatch_size` must be a positive integer"),
        ({"megabatch_size": True}, "`megabatch_size` must be a positive integer"),
    ],
    ids=lambda value: str(value) if isinstance(value, dict) else "",
)
def test_invalid_options_raise(kwargs: dict[str, object], message: str) -> None:
    with pytest.raises(ValueError, match=message):
        UpdatesController(**kwargs)  # type: ignore[arg-type]


def test_built_by_name_ignoring_the_deadband() -> None:
    assert isinstance(make_controller("updates", deadband=0.05), UpdatesController)


# --- state -------------------------------------------------------------------------------------


def test_state_round_trip_gives_identical_continuation() -> None:
    limits = BatchLimits.build(4, 256)
    original = UpdatesController()
    sim = ClusterSimulator.from_speeds([9, 9, 6, 24], noise=0.02, seed=1)
    result = sim.run(original, [64] * 4, limits, 3)
    restored = UpdatesController()
    restored.load_state_dict(json.loads(json.dumps(original.state_dict())))
    assert restored.state_dict() == original.state_dict()
    assert restored.lr_factors == original.lr_factors != []

    def continue_run(controller: UpdatesController) -> list[list[int]]:
        sim = ClusterSimulator.from_speeds([9, 9, 6, 24], noise=0.02, seed=2)
        return sim.run(controller, result.plans[-1], limits, 6).plans

    assert continue_run(restored) == continue_run(original)


def test_loading_empty_state_gives_a_fresh_controller() -> None:
    controller = UpdatesController()
    controller.load_state_dict({})
    assert controller.state_dict() == UpdatesController().state_dict()


# --- a dynamic mega-batch schedule -------------------------------------------------------------


def test_reported_counts_of_a_megabatch_schedule_even_out() -> None:
    samples_per_s = [9.0, 9.0, 6.0, 24.0]
    limits = BatchLimits.build(4, 256)
    controller = UpdatesController()
    plan = [64] * 4
    counts = megabatch_counts(plan, samples_per_s, 2560)
    assert max(counts) - min(counts) >= 10  # uniform batches: the fast rank runs ahead
    for _ in range(15):
        plan = controller.update(plan, [1.0] * 4, limits, reported(*counts))
        counts = megabatch_counts(plan, samples_per_s, 2560)
    assert max(counts) - min(counts) <= 1
    assert all(abs(b - x) <= 3 for b, x in zip(plan, [48, 48, 32, 128]))


def test_deadband_keeps_a_plan_whose_measured_balance_is_within_it():
    limits = BatchLimits.build(2, 128)
    # E = 0.96 on [64, 64] with times [1.0, 1.08]: kept with a 5% dead-band, moved without
    assert UpdatesController(deadband=0.05).update([64, 64], [1.0, 1.08], limits) == [64, 64]
    assert UpdatesController().update([64, 64], [1.0, 1.08], limits) != [64, 64]
    # E = 0.5: moved either way
    assert UpdatesController(deadband=0.05).update([64, 64], [1.0, 3.0], limits) != [64, 64]


@pytest.mark.parametrize("deadband", [-0.1, 1.0])
def test_bad_deadband_is_refused(deadband):
    with pytest.raises(ValueError, match="deadband"):
        UpdatesController(deadband=deadband)


def test_deadband_never_keeps_a_plan_outside_the_limits():
    limits = BatchLimits.build(2, 128, max_batch_size=[60, 100])
    # balanced, but rank 0 is above its (new) maximum: the plan must still be replaced
    plan = UpdatesController(deadband=0.05).update([64, 64], [1.0, 1.0], limits)
    assert limits.admits(plan), plan
