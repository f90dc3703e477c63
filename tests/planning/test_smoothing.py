"""Tests for lightning_hetero/planning/smoothing.py: robust per-rank step statistics."""

import math
import random
import statistics

import pytest

from lightning_hetero.planning.smoothing import TimingSmoother, robust_centre


def feed(smoother: TimingSmoother, batch_size: int, compute_s: list[float]) -> None:
    for value in compute_s:
        smoother.update(batch_size=batch_size, compute_s=value, wait_s=value / 10)


def test_new_smoother_holds_no_value() -> None:
    smoother = TimingSmoother()
    assert smoother.steps == 0
    assert smoother.batch_size == 0
    assert math.isnan(smoother.compute_s)
    assert math.isnan(smoother.wait_s)


def test_first_step_is_reported_until_second_arrives() -> None:
    smoother = TimingSmoother()
    smoother.update(batch_size=8, compute_s=9.0, wait_s=0.9)
    assert (smoother.compute_s, smoother.wait_s, smoother.steps) == (9.0, 0.9, 1)


def test_first_step_is_discarded_once_second_arrives() -> None:
    smoother = TimingSmoother()
    feed(smoother, 8, [9.0, 1.0])
    assert smoother.compute_s == 1.0
    assert smoother.wait_s == pytest.approx(0.1)
    assert smoother.steps == 2


def test_the_centre_is_the_median_of_every_step_after_the_first() -> None:
    rng = random.Random(0)
    compute_s = [rng.uniform(0.5, 2.0) for _ in range(25)]
    smoother = TimingSmoother()
    feed(smoother, 16, compute_s)
    assert smoother.compute_s == statistics.median(compute_s[1:])  # the first step is dropped
    assert smoother.wait_s == pytest.approx(statistics.median(compute_s[1:]) / 10, rel=1e-12)
    assert smoother.steps == len(compute_s) and smoother.compute_count == 24


def test_constant_input_gives_constant_average() -> None:
    smoother = TimingSmoother()
    feed(smoother, 4, [1.25] * 30)
    assert smoother.compute_s == pytest.approx(1.25)


def test_batch_size_change_restarts_average() -> None:
    smoother = TimingSmoother()
    feed(smoother, 32, [2.0, 2.0, 2.0, 2.0])
    smoother.update(batch_size=64, compute_s=4.5, wait_s=0.1)
    assert (smoother.batch_size, smoother.compute_s, smoother.wait_s, smoother.steps) == (
        64,
        4.5,
        0.1,
        1,
    )


def test_average_after_restart_ignores_old_batch_size() -> None:
    smoother = TimingSmoother()
    feed(smoother, 32, [100.0] * 10)
    feed(smoother, 64, [1.0, 3.0, 3.0])
    assert smoother.compute_s == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("compute_s", "wait_s"),
    [(math.nan, 0.0), (math.inf, 0.0), (1.0, math.nan), (1.0, -math.inf)],
    ids=["nan-compute", "inf-compute", "nan-wait", "inf-wait"],
)
def test_non_finite_sample_is_ignored(compute_s: float, wait_s: float) -> None:
    smoother = TimingSmoother()
    feed(smoother, 8, [2.0, 2.0, 4.0])
    before = (smoother.compute_s, smoother.wait_s, smoother.steps)
    smoother.update(batch_size=8, compute_s=compute_s, wait_s=wait_s)
    assert (smoother.compute_s, smoother.wait_s, smoother.steps) == before


def test_non_finite_first_sample_does_not_count_as_discarded_step() -> None:
    smoother = TimingSmoother()
    smoother.update(batch_size=8, compute_s=math.nan, wait_s=0.0)
    feed(smoother, 8, [6.0, 2.0])
    assert smoother.compute_s == 2.0
    assert smoother.steps == 2


def test_reset_forgets_all_samples() -> None:
    smoother = TimingSmoother()
    feed(smoother, 8, [1.0, 2.0, 3.0])
    smoother.reset()
    assert smoother.steps == 0 and smoother.batch_size == 0
    assert math.isnan(smoother.compute_s) and math.isnan(smoother.wait_s)


@pytest.mark.parametrize("window", [1, 0, 2.5, True])
def test_a_window_below_two_steps_raises(window) -> None:
    with pytest.raises(ValueError, match="`window` must be an integer >= 2"):
        TimingSmoother(window=window)


def test_a_fully_timed_step_replaces_partial_ones_and_partial_ones_are_ignored_after():
    s = TimingSmoother()
    s.update(8, 0.5, 0.0, full=False)  # an epoch's first step: its loading not seen
    assert s.compute_s == 0.5 and s.full_steps == 0
    s.update(8, 0.9, 0.1, full=True)
    assert (s.compute_s, s.wait_s, s.full_steps) == (0.9, 0.1, 1)
    s.update(8, 0.4, 0.0, full=False)
    assert s.compute_s == 0.9 and s.steps == 2


def test_the_step_time_is_the_plain_mean_of_compute_plus_wait_with_its_standard_error():
    s = TimingSmoother()
    for compute_s, wait_s in [(5.0, 5.0), (1.0, 0.5), (1.2, 0.3), (0.8, 0.7)]:
        s.update(4, compute_s, wait_s)
    # the first step (one-off costs) is left out; the others all take 1.5 s
    assert s.step_s == 1.5 and s.step_se == 0.0


def test_the_noise_shrinks_as_steps_accumulate_and_a_few_stalls_move_neither_centre_nor_noise():
    rng = random.Random(1)

    def steps(n: int) -> list[float]:  # 2% noise, and a 2 s stall on 15% of steps
        return [rng.gauss(1.0, 0.02) + (2.0 if rng.random() < 0.15 else 0.0) for _ in range(n)]

    s = TimingSmoother()
    feed(s, 4, steps(20))
    early = s.compute_se
    feed(s, 4, steps(380))
    assert s.compute_se < early / 2  # 20 -> 400 steps: about sqrt(20) smaller
    assert s.compute_s == pytest.approx(1.0, rel=0.02)  # the stalls do not move the centre
    assert s.compute_se < 0.005  # about 1.25 * 2% / sqrt(400), stalls or not
    assert math.isnan(TimingSmoother().compute_se)
    # the mean step time keeps the stalls: they are wall time the guard must see
    assert s.step_s == pytest.approx(1.1 * 1.3, rel=0.05)  # feed() waits a tenth of compute


def test_memory_is_bounded_by_the_window():
    s = TimingSmoother(window=64)
    feed(s, 4, [1.0] * 1000)
    assert s.compute_count == 64 and s.steps == 1000


def test_a_speed_change_at_the_same_batch_size_restarts_the_statistics_within_two_blocks():
    s = TimingSmoother()
    feed(s, 4, [1.0] * 200)
    feed(s, 4, [2.0] * 32)  # a rank that slowed down, at the same size
    assert s.compute_s == 2.0 and s.compute_count < 48


def test_stalls_in_a_block_do_not_restart_the_statistics():
    rng = random.Random(2)
    s = TimingSmoother()
    restarts = 0
    for _ in range(2000):
        stall = 0.2 if rng.random() < 0.15 else 0.0
        before = s.compute_count
        s.update(4, rng.gauss(0.3, 0.006) + stall, 0.0)
        restarts += s.compute_count < before
    assert restarts == 0


def test_timings_pool_across_boundaries_while_the_plan_holds():
    s = TimingSmoother()
    for _ in range(4):  # four boundaries of 8 steps at the same plan
        feed(s, 4, [1.0, 1.1, 0.9, 1.0, 1.05, 0.95, 1.0, 1.0])
        s.mark()
    assert s.compute_count == 31  # every step but the very first
    s.update(batch_size=4, compute_s=1.0, wait_s=0.0, plan=7)  # the plan changed: anew
    assert s.compute_count == 1


def test_steps_in_two_clusters_report_the_noise_of_both_not_of_the_median_one():
    # 8 steps, 3 of them stalled by 50 ms: the MAD sees only the 16 ms cluster
    values = [0.016, 0.017, 0.015, 0.016, 0.016, 0.066, 0.067, 0.065]
    centre, se = robust_centre(values)
    assert centre == pytest.approx(0.0165)
    assert se / centre > 0.3  # half the IQR: the median may well be off by a third
    assert robust_centre([1.0, 1.1, 0.9, 1.0, 9.0])[1] == pytest.approx(0.083, abs=1e-3)


def _micro_step(
    rng: random.Random, per_sample: float, sizes: list[int], noise: float, stall: float
) -> tuple[float, tuple[tuple[int, float], ...]]:
    """One step of ``sizes`` micro-batches, each its own noise, a stall (with probability
    0.3) on the first, and 1 ms of rest; returns the step's compute and its micro-batches."""
    parts = [(n, n * per_sample * max(0.05, 1.0 + rng.gauss(0.0, noise))) for n in sizes]
    if rng.random() < 0.3:
        parts[0] = (parts[0][0], parts[0][1] + stall)
    return 0.001 + sum(t for _, t in parts), tuple(parts)


def test_each_micro_batch_is_a_sample_of_the_per_sample_cost() -> None:
    # 4 micro-batches of 4 a step, 8 steps (a short epoch), stalls on 30% of the steps: the
    # micro-batches give the step's time as well as the steps do and a smaller error, since
    # a stall is one micro-batch of four, not one step of eight
    true_s = 16 * 0.001 + 0.001
    errors: dict[bool, list[float]] = {True: [], False: []}
    ses: dict[bool, list[float]] = {True: [], False: []}
    for seed in range(20):
        for micro in (True, False):
            rng, s = random.Random(seed), TimingSmoother()
            for _ in range(9):  # the first is discarded
                compute, parts = _micro_step(rng, 0.001, [4, 4, 4, 4], 0.1, 0.01)
                s.update(16, compute, 0.0, micro=parts if micro else ())
            errors[micro].append(abs(s.compute_s - true_s) / true_s)
            ses[micro].append(s.compute_se / s.compute_s)
    assert statistics.median(errors[True]) < min(0.05, statistics.median(errors[False]))
    assert statistics.median(ses[True]) < 0.5 * statistics.median(ses[False])


def test_micro_batches_that_vary_together_keep_the_steps_error() -> None:
    # each step's micro-batches share one factor (a slow stretch spans the step): they are
    # one sample a step, not four, and the error must not shrink as if they were four
    ratios = []
    for seed in range(20):
        rng, together, steps_only = random.Random(seed), TimingSmoother(), TimingSmoother()
        for _ in range(17):
            factor = max(0.05, 1.0 + rng.gauss(0.0, 0.1))
            parts = tuple((4, 0.004 * factor) for _ in range(4))
            compute = 0.001 + 0.016 * factor
            together.update(16, compute, 0.0, micro=parts)
            steps_only.update(16, compute, 0.0)
        ratios.append(together.compute_se / steps_only.compute_se)
    assert statistics.median(ratios) > 0.9


def test_micro_batch_samples_pool_across_boundaries_while_the_plan_holds() -> None:
    rng, s = random.Random(1), TimingSmoother()
    seen = []
    for _ in range(3):  # three boundaries of 8 steps at the same plan
        for _ in range(8):
            compute, parts = _micro_step(rng, 0.001, [4, 4, 4, 4], 0.1, 0.01)
            s.update(16, compute, 0.0, plan=7, micro=parts)
        s.mark()
        seen.append((s.compute_count, s.compute_se))
    assert [n for n, _ in seen] == [7, 15, 23]
    assert seen[0][1] > seen[1][1] > seen[2][1]
    s.update(16, 0.02, 0.0, plan=8, micro=((8, 0.01), (8, 0.01)))  # a new plan: afresh
    assert s.compute_count == 1


def test_steps_without_micro_batches_keep_the_median_of_the_steps() -> None:
    s = TimingSmoother()
    s.update(16, 0.03, 0.0, micro=((8, 0.01), (8, 0.01)))
    s.update(16, 0.02, 0.0, micro=((8, 0.01), (8, 0.01)))
    s.update(16, 0.05, 0.0)  # one step as a whole batch: the micro-batches no longer describe all
    s.update(16, 0.04, 0.0, micro=((16, 0.02),))  # a single part is no micro-batching
    assert s.compute_s == pytest.approx(0.04)


def test_medians_kept_sorted_equal_statistics_median_as_the_window_slides() -> None:
    """The smoother keeps its steps sorted as they arrive and leave the window (a boundary
    at every step reads medians without sorting); every figure equals the plain
    computation over the steps held, through evictions and a speed-change restart."""
    rng = random.Random(3)
    smoother = TimingSmoother(window=50)
    times = [rng.uniform(0.9, 1.1) * (2.0 if k > 150 else 1.0) for k in range(300)]
    lengths = []
    for k, t in enumerate(times):
        smoother.update(batch_size=8, compute_s=t, wait_s=t / 7)
        if k % 7 == 0:
            smoother.mark()
        held = list(smoother._compute)
        lengths.append(len(held))
        assert held == times[k + 1 - len(held) : k + 1]  # the latest steps, in order
        assert smoother.compute_s == statistics.median(held)
        assert smoother.wait_s == statistics.median(t / 7 for t in held)
    assert min(lengths[100:]) < 50 == lengths[-1]  # restarted at the speed change, refilled


@pytest.mark.parametrize("n", [2, 3, 10, 11, 256])
def test_robust_centre_equals_its_definition(n: int) -> None:
    rng = random.Random(n)
    values = [rng.lognormvariate(0, 0.3) for _ in range(n)]
    centre = statistics.median(values)
    mad = statistics.median(abs(v - centre) for v in values)
    ordered = sorted(values)
    half_iqr = 0.5 * (ordered[(3 * n) // 4] - ordered[n // 4])
    expected = 1.8582 * max(mad, half_iqr) / math.sqrt(n)
    assert robust_centre(values) == (centre, pytest.approx(expected, rel=1e-12))


def test_a_sorted_windows_centre_equals_robust_centre_ties_and_odd_sizes_included() -> None:
    """``compute_se`` reads the spread of a sorted window by a binary search; it must equal
    ``robust_centre``'s sort, for every size and with repeated values."""
    from lightning_hetero.planning.smoothing import _Window

    rng = random.Random(0)
    for _ in range(2000):
        values = [
            round(rng.uniform(0, 5), rng.choice([0, 1, 3])) for _ in range(rng.randint(1, 40))
        ]
        window = _Window(1000)
        window.extend(values)
        centre, se = window.centre()
        expected_centre, expected_se = robust_centre(values)
        assert centre == expected_centre
        assert se == pytest.approx(expected_se, rel=1e-12, nan_ok=True)
