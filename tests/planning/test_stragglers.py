"""The pure decisions of StragglerReport: the pace-setter from per-rank timings, the noise
threshold, the per-rank summary of steps and the planner's allowed speedup (no timing)."""

import math

import pytest

from lightning_hetero.planning.stragglers import (
    MIN_GAP,
    RankTiming,
    pace_setter,
    summarize_steps,
    verdict,
    with_earlier_point,
)


def test_the_slowest_rank_beyond_the_noise_sets_the_pace():
    assert pace_setter([0.05, 0.25, 0.05, 0.05], [0.001] * 4) == 1
    assert pace_setter([0.30, 0.10], [0.01, 0.01]) == 0


def test_no_rank_sets_the_pace_within_the_noise():
    # 20% slower, but the steps' spread makes the gap's standard error 0.007: 3 SE = 0.021
    assert pace_setter([0.10, 0.12], [0.005, 0.005]) is None
    # the same gap measured precisely is a pace-setter
    assert pace_setter([0.10, 0.12], [0.001, 0.001]) == 1


def test_no_rank_sets_the_pace_below_the_minimum_gap_however_precise():
    slower = 1 + MIN_GAP / 2
    assert pace_setter([0.1, 0.1 * slower], [0.0, 0.0]) is None
    assert pace_setter([0.1, 0.1 * slower], [0.0, 0.0], min_gap=0.0) == 1


def test_the_reference_is_the_median_of_the_other_ranks():
    # two slow ranks of four: the others' median for rank 1 is a fast rank's time
    assert pace_setter([0.1, 0.3, 0.3, 0.1], [0.001] * 4) == 1  # the lower rank on a tie
    # one fast rank does not make a pace-setter of the rest
    assert pace_setter([0.02, 0.1, 0.1, 0.1], [0.001] * 4) is None


def test_ranks_without_timings_are_left_out():
    assert pace_setter([math.nan, 0.1, 0.3], [0.0, 0.001, 0.001]) == 2
    assert pace_setter([math.nan, 0.1], [0.0, 0.001]) is None
    assert pace_setter([0.1, 0.3], None) == 1  # no spread known: the gap alone


def test_steps_fold_into_median_spread_mean_wait_and_sizes():
    steps = [(8, 0.1, 0.0), (8, 0.3, 0.2), (8, 0.2, 0.1), (3, 0.05, 0.0), (3, 0.07, 0.0)]
    row = summarize_steps(steps)
    assert row.steps == 5 and row.batch_size == 8
    assert row.compute_s == pytest.approx(0.1)  # median of all five
    assert row.wait_s == pytest.approx(0.06)
    assert row.compute_se > 0
    assert (row.other_batch_size, row.other_compute_s) == (3, pytest.approx(0.06))
    # a second size timed once (an epoch's short last batch) is no point of the curve
    assert summarize_steps(steps[:4]).other_batch_size == 0
    empty = summarize_steps([])
    assert empty.steps == 0 and math.isnan(empty.compute_s)


def test_the_verdict_uses_the_planners_allowed_speedup_and_plan():
    rows = [RankTiming(9, 0.1, 0.001, 0.2, 16), RankTiming(9, 0.3, 0.001, 0.0, 16)]
    decided = verdict(rows)
    assert decided.pace_setter == 1 and decided.slower_by == pytest.approx(3.0)
    # lines through the origin: speeds 3:1, the optimum [24, 8] takes 0.15 s against 0.3 s
    assert decided.allowed_speedup == pytest.approx(2.0)
    assert decided.plan == [24, 8]


def test_a_second_batch_size_fits_the_fixed_cost_into_the_allowed_speedup():
    # rank 1: 0.1 s fixed + 0.0125 s per sample; without the second point the line goes
    # through the origin and overstates what moving samples off rank 1 gains
    with_fixed = RankTiming(9, 0.3, 0.001, 0.0, 16, other_batch_size=8, other_compute_s=0.2)
    rows = [RankTiming(9, 0.1, 0.001, 0.2, 16), with_fixed]
    origin = verdict([rows[0], with_fixed._replace(other_batch_size=0)])
    fixed = verdict(rows)
    assert fixed.allowed_speedup < origin.allowed_speedup
    assert fixed.plan[1] < origin.plan[1]


def test_no_allowed_speedup_without_timings_on_every_rank():
    rows = [RankTiming(9, 0.1, 0.001, 0.2, 16), RankTiming(0, math.nan, math.nan, math.nan, 0)]
    decided = verdict(rows)
    assert decided.pace_setter is None and math.isnan(decided.allowed_speedup)
    assert decided.plan == []


def test_a_rank_moved_to_one_sample_with_a_fixed_cost_is_not_read_as_many_times_slower():
    """Under a hetero strategy the plan moves between reports: the straggler at one sample
    (0.05 s fixed + 0.0125 s per sample on every rank, +0.2 s per 16 samples on rank 1) is
    fitted through its earlier point, so the allowed speedup stays that of the costs."""

    def seconds(rank, b):
        return 0.05 + 0.0125 * b + (0.2 / 16 * b if rank == 1 else 0.0)

    before = [RankTiming(9, seconds(k, 16), 0.001, 0.0, 16) for k in range(4)]
    plan = [21, 1, 21, 21]
    now = [RankTiming(9, seconds(k, b), 0.001, 0.0, b) for k, b in enumerate(plan)]
    alone = verdict(now).allowed_speedup
    fitted = verdict([with_earlier_point(n, b) for n, b in zip(now, before)]).allowed_speedup
    # the costs' optimum in whole samples: [19, 9, 18, 18], the fast ranks' 19 the slowest
    optimum = seconds(0, 19)
    assert alone > 3  # through the origin: 0.26 s for one sample on rank 1
    assert fitted == pytest.approx(seconds(1, 16) / optimum, rel=0.01)  # 1.57x
