"""The noisy-node benchmark's configuration and figures (its runs are benchmarks, not tests)."""

import pytest

from lightning_hetero.bench.noisy import (
    configs,
    expected_step_s,
    ideal,
    plan_figures,
    ratio,
    target,
    wall_ratio,
)
from lightning_hetero.bench.run import RunConfig
from lightning_hetero.emulate import Throttle


def test_the_clusters_are_two_ranks_with_the_issues_stalls():
    slower = RunConfig(**configs("slower", 6, 0.005, 0.15, 0.2))
    assert slower.workers == 2 and slower.batch_size == 32
    assert slower.sample_cost == pytest.approx([0.005, 0.0075])  # rank 1 1.5x slower
    assert slower.stalls == [0.15, 0.2]
    equal = RunConfig(**configs("equal", 6, 0.005, 0.15, 0.2))
    assert equal.sample_cost == [0.005, 0.005]
    # the run's Throttle accepts the pair as it comes from JSON
    assert Throttle(slower.sample_cost, stalls=slower.stalls).stalls == (0.15, 0.2)


def test_the_targets_are_the_speed_proportional_splits():
    assert target("slower") == pytest.approx([38.4, 25.6])
    assert target("equal") == pytest.approx([32.0, 32.0])


def _history(*plans):
    return [{"batch_sizes": [32, 32], "next_batch_sizes": plan} for plan in plans]


def test_plan_figures_count_boundaries_until_the_plan_stays_within_the_tolerance():
    goal = target("slower")
    figures = plan_figures(_history([34, 30], [38, 26], [39, 25], [38, 26]), goal, 0.15)
    assert figures["plans"][1] == [38, 26]
    assert figures["distances"][0] == pytest.approx((30 - 25.6) / 25.6)
    assert figures["boundaries_to_reach"] == 2 and figures["stays"]
    # leaving and coming back: reached for good later, and it did not stay
    back = plan_figures(_history([38, 26], [32, 32], [38, 26]), goal, 0.15)
    assert back["boundaries_to_reach"] == 3 and not back["stays"]
    never = plan_figures(_history([32, 32], [32, 32]), goal, 0.15)
    assert never["boundaries_to_reach"] is None and not never["stays"]


def test_plan_figures_read_the_plan_in_use_without_a_next_plan():
    figures = plan_figures([{"batch_sizes": [33, 31]}], target("equal"), 0.10)
    assert figures["plans"] == [[33, 31]] and figures["boundaries_to_reach"] == 1


def test_the_ratio_is_of_steady_epochs():
    pair = {"ddp": {"epoch_s": [9.0, 9.0, 3.0, 3.0]}, "hetero": {"epoch_s": [5.0, 1.0, 2.0, 2.0]}}
    assert ratio(pair, skip=2) == 1.5


def test_the_expected_step_averages_the_slowest_rank_over_every_stall_pattern():
    costs, plan = [0.005, 0.0075], [32, 32]  # 160 and 240 ms
    assert expected_step_s(costs, plan, 0.0, 0.2) == pytest.approx(0.24)
    assert expected_step_s(costs, plan, 1.0, 0.2) == pytest.approx(0.44)
    # no stall 72.25%: 240; rank 0 alone 12.75%: 360; rank 1 stalled 15%: 440 ms
    mean = 0.7225 * 0.24 + 0.1275 * 0.36 + 0.15 * 0.44
    assert expected_step_s(costs, plan, 0.15, 0.2) == pytest.approx(mean)


def test_the_ideal_ratio_is_ddps_mean_step_over_the_proportional_plans():
    assert ideal("equal", 0.005, 0.15, 0.2) == 1.0
    assert ideal("slower", 0.005, 0.0, 0.2) == pytest.approx(0.24 / 0.195)  # plan [38, 26]
    # stalls the plan cannot avoid shrink the gain
    assert 1.0 < ideal("slower", 0.005, 0.15, 0.2) < ideal("slower", 0.005, 0.0, 0.2)
    assert round(ideal("slower", 0.005, 0.15, 0.2), 3) == 1.142


def test_loading_on_the_training_thread_counts_in_the_target_and_the_ideal():
    config = RunConfig(**configs("slower", 6, 0.005, 0.15, 0.2, load_cost=0.005))
    assert config.load_cost == 0.005
    # speeds 1 / 10 ms and 1 / 12.5 ms: the split of 64 is [35.6, 28.4]
    assert target("slower", 0.005, 0.005) == pytest.approx([64 * 12.5 / 22.5, 64 * 10 / 22.5])
    # loading both ranks pay narrows the gap a plan can close
    assert 1.0 < ideal("slower", 0.005, 0.0, 0.2, 0.005) < ideal("slower", 0.005, 0.0, 0.2)
    # DDP 12.5 ms x 32 = 400 ms; plan [36, 28]: max(10 ms x 36, 12.5 ms x 28) = 360 ms
    assert ideal("slower", 0.005, 0.0, 0.2, 0.005) == pytest.approx(0.4 / 0.36)


def test_the_wall_ratio_is_of_whole_fits():
    assert wall_ratio({"ddp": {"fit_s": 30.0}, "hetero": {"fit_s": 20.0}}) == 1.5
