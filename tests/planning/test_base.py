"""Tests for lightning_hetero/planning/base.py: BatchLimits and the Controller interface."""

import dataclasses

import pytest

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats
from lightning_hetero.planning.split import PlanError


def test_scalar_bounds_expand_to_one_per_rank() -> None:
    limits = BatchLimits.build(4, 256, min_batch_size=8, max_batch_size=128)
    assert limits == BatchLimits(256, [8] * 4, [128] * 4)
    assert limits.world_size == 4


def test_default_bounds_are_one_and_the_global_batch() -> None:
    limits = BatchLimits.build(3, 30)
    assert limits.min_batch_size == [1, 1, 1]
    assert limits.max_batch_size == [30, 30, 30]


def test_maximums_above_global_batch_are_clipped_to_it() -> None:
    assert BatchLimits.build(2, 16, max_batch_size=[100, 10]).max_batch_size == [16, 10]


def test_per_rank_bounds_are_kept() -> None:
    limits = BatchLimits.build(3, 30, min_batch_size=[1, 2, 3], max_batch_size=[10, 11, 12])
    assert limits.min_batch_size == [1, 2, 3]
    assert limits.max_batch_size == [10, 11, 12]


def test_global_batch_equal_to_sum_of_bounds_is_feasible() -> None:
    assert BatchLimits.build(4, 32, min_batch_size=8).global_batch_size == 32
    assert BatchLimits.build(4, 32, max_batch_size=8).global_batch_size == 32


def test_min_above_max_raises_plan_error() -> None:
    with pytest.raises(PlanError, match=r"Rank 0: `min_batch_size` 9 > `max_batch_size` 8"):
        BatchLimits.build(2, 16, min_batch_size=9, max_batch_size=8)


def test_min_below_one_raises_plan_error() -> None:
    with pytest.raises(PlanError, match=r"Rank 1: `min_batch_size` must be >= 1, got 0"):
        BatchLimits.build(2, 16, min_batch_size=[1, 0])


def test_global_batch_below_k_times_min_raises_plan_error() -> None:
    with pytest.raises(
        PlanError, match=r"global batch size 30 .* minimums \(`min_batch_size`: 32\)"
    ):
        BatchLimits.build(4, 30, min_batch_size=8)


def test_global_batch_above_k_times_max_raises_plan_error() -> None:
    with pytest.raises(
        PlanError, match=r"global batch size 40 .* maximums \(`max_batch_size`: 32\)"
    ):
        BatchLimits.build(4, 40, max_batch_size=8)


def test_per_rank_bounds_of_wrong_length_raise_plan_error() -> None:
    with pytest.raises(PlanError, match="Expected 4 per-rank bounds"):
        BatchLimits.build(4, 40, min_batch_size=[1, 1])


def test_limits_are_immutable() -> None:
    limits = BatchLimits.build(2, 16)
    with pytest.raises(dataclasses.FrozenInstanceError):
        limits.global_batch_size = 32  # type: ignore[misc]


def test_controller_cannot_be_built_without_update() -> None:
    with pytest.raises(TypeError):
        Controller()  # type: ignore[abstract]


def test_limits_admit_only_plans_with_the_global_sum_and_in_bounds() -> None:
    limits = BatchLimits.build(3, 12, min_batch_size=2, max_batch_size=[4, 6, 6])
    assert limits.admits([4, 4, 4]) and limits.admits([2, 4, 6])
    assert not limits.admits([4, 4, 5])  # sum 13
    assert not limits.admits([5, 4, 3])  # rank 0 above its maximum
    assert not limits.admits([1, 5, 6])  # rank 0 below the minimum
    assert not limits.admits([6, 6])  # wrong length


def test_the_auto_deadband_is_twice_the_largest_relative_noise_within_its_bounds():
    from lightning_hetero.planning.base import (
        AUTO_DEADBAND_FALLBACK,
        AUTO_DEADBAND_FLOOR,
        noise_deadband,
    )

    quiet = [RankStats(compute_se=0.001), RankStats(compute_se=0.0)]
    assert noise_deadband("auto", [1.0, 1.0], quiet) == AUTO_DEADBAND_FLOOR
    noisy = [RankStats(compute_se=0.03), RankStats(compute_se=0.01)]
    assert noise_deadband("auto", [1.0, 0.5], noisy) == 0.06
    assert noise_deadband("auto", [1.0, 1.0], [RankStats()] * 2) == AUTO_DEADBAND_FALLBACK
    assert noise_deadband(0.2, [1.0, 1.0], noisy) == 0.2


@pytest.mark.parametrize("bad", [-0.1, 1.0, "off", True, None])
def test_a_deadband_that_is_neither_auto_nor_in_0_1_is_refused(bad):
    from lightning_hetero.planning.base import check_deadband

    with pytest.raises(ValueError, match="deadband"):
        check_deadband(bad)


@pytest.mark.parametrize("name", ["proportional", "model"])
def test_with_an_auto_deadband_a_calm_cluster_settles_closer_than_the_fixed_band(name):
    # 4% off balance: inside the old fixed 5% band, outside twice the measured 0.5% noise
    from lightning_hetero.planning import make_controller

    limits = BatchLimits.build(2, 200)
    calm = [RankStats(compute_se=0.005)] * 2
    assert make_controller(name, deadband=0.05).update([100, 100], [1.0, 1.04], limits, calm) == [
        100,
        100,
    ]
    moved = make_controller(name, deadband="auto").update([100, 100], [1.0, 1.04], limits, calm)
    assert moved[0] > 100 and sum(moved) == 200
    noisy = [RankStats(compute_se=0.05)] * 2  # the same gap is noise here
    kept = make_controller(name, deadband="auto").update([100, 100], [1.0, 1.04], limits, noisy)
    assert kept == [100, 100]


def test_controllers_without_an_auto_deadband_keep_their_own_default():
    from lightning_hetero.planning import LBBSPController, make_controller

    assert make_controller("lbbsp", deadband="auto").deadband == LBBSPController().deadband
