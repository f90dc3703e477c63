"""Tests for lightning_hetero/planning/smoothing.py: the per-rank EWMA of step times."""

import math
import random

import pytest

from lightning_hetero.planning.smoothing import TimingSmoother


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
    smoother = TimingSmoother(smoothing=0.5)
    smoother.update(batch_size=8, compute_s=9.0, wait_s=0.9)
    assert (smoother.compute_s, smoother.wait_s, smoother.steps) == (9.0, 0.9, 1)


def test_first_step_is_discarded_once_second_arrives() -> None:
    smoother = TimingSmoother(smoothing=0.5)
    feed(smoother, 8, [9.0, 1.0])
    assert smoother.compute_s == 1.0
    assert smoother.wait_s == pytest.approx(0.1)
    assert smoother.steps == 2


@pytest.mark.parametrize("smoothing", [0.0, 0.3, 0.8, 0.95])
def test_average_follows_ewma_formula_from_second_step(smoothing: float) -> None:
    rng = random.Random(0)
    compute_s = [rng.uniform(0.5, 2.0) for _ in range(25)]
    smoother = TimingSmoother(smoothing=smoothing)
    feed(smoother, 16, compute_s)
    expected = compute_s[1]  # the first step is dropped
    for value in compute_s[2:]:
        expected = smoothing * expected + (1 - smoothing) * value
    assert smoother.compute_s == pytest.approx(expected, rel=1e-12)
    assert smoother.wait_s == pytest.approx(expected / 10, rel=1e-12)
    assert smoother.steps == len(compute_s)


def test_zero_smoothing_keeps_only_latest_step() -> None:
    smoother = TimingSmoother(smoothing=0.0)
    feed(smoother, 4, [5.0, 3.0, 7.0, 2.0])
    assert smoother.compute_s == 2.0


def test_constant_input_gives_constant_average() -> None:
    smoother = TimingSmoother(smoothing=0.8)
    feed(smoother, 4, [1.25] * 30)
    assert smoother.compute_s == pytest.approx(1.25)


def test_batch_size_change_restarts_average() -> None:
    smoother = TimingSmoother(smoothing=0.8)
    feed(smoother, 32, [2.0, 2.0, 2.0, 2.0])
    smoother.update(batch_size=64, compute_s=4.5, wait_s=0.1)
    assert (smoother.batch_size, smoother.compute_s, smoother.wait_s, smoother.steps) == (
        64,
        4.5,
        0.1,
        1,
    )


def test_average_after_restart_ignores_old_batch_size() -> None:
    smoother = TimingSmoother(smoothing=0.8)
    feed(smoother, 32, [100.0] * 10)
    feed(smoother, 64, [1.0, 3.0, 3.0])
    assert smoother.compute_s == pytest.approx(3.0)


@pytest.mark.parametrize(
    ("compute_s", "wait_s"),
    [(math.nan, 0.0), (math.inf, 0.0), (1.0, math.nan), (1.0, -math.inf)],
    ids=["nan-compute", "inf-compute", "nan-wait", "inf-wait"],
)
def test_non_finite_sample_is_ignored(compute_s: float, wait_s: float) -> None:
    smoother = TimingSmoother(smoothing=0.5)
    feed(smoother, 8, [2.0, 2.0, 4.0])
    before = (smoother.compute_s, smoother.wait_s, smoother.steps)
    smoother.update(batch_size=8, compute_s=compute_s, wait_s=wait_s)
    assert (smoother.compute_s, smoother.wait_s, smoother.steps) == before


def test_non_finite_first_sample_does_not_count_as_discarded_step() -> None:
    smoother = TimingSmoother(smoothing=0.5)
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


@pytest.mark.parametrize("smoothing", [-0.1, 1.0, 1.5, math.nan])
def test_smoothing_outside_zero_one_raises(smoothing: float) -> None:
    with pytest.raises(ValueError, match="`smoothing` must be in"):
        TimingSmoother(smoothing=smoothing)


def test_a_fully_timed_step_replaces_partial_ones_and_partial_ones_are_ignored_after():
    s = TimingSmoother(smoothing=0.0)
    s.update(8, 0.5, 0.0, full=False)  # an epoch's first step: its loading not seen
    assert s.compute_s == 0.5 and s.full_steps == 0
    s.update(8, 0.9, 0.1, full=True)
    assert (s.compute_s, s.wait_s, s.full_steps) == (0.9, 0.1, 1)
    s.update(8, 0.4, 0.0, full=False)
    assert s.compute_s == 0.9 and s.steps == 2


def test_the_step_time_is_the_plain_mean_of_compute_plus_wait_with_its_standard_error():
    s = TimingSmoother(smoothing=0.8)
    for compute_s, wait_s in [(5.0, 5.0), (1.0, 0.5), (1.2, 0.3), (0.8, 0.7)]:
        s.update(4, compute_s, wait_s)
    # the first step (one-off costs) is left out; the others all take 1.5 s
    assert s.step_s == 1.5 and s.step_se == 0.0


def test_the_compute_noise_is_near_the_steps_deviation_over_the_root_of_the_steps_held():
    s = TimingSmoother(smoothing=0.8)  # an EWMA of factor 0.8 holds about 9 steps
    for i in range(400):
        s.update(4, 1.0 + (0.1 if i % 2 else -0.1), 0.0)
    assert s.compute_se == pytest.approx(0.1 / 3.0, rel=0.3)
    assert math.isnan(TimingSmoother().compute_se)


def test_the_compute_noise_forgets_a_speed_change_as_fast_as_the_average_does():
    s = TimingSmoother(smoothing=0.8)
    for compute_s in [1.0] * 10 + [2.0] * 60:  # a rank that slowed down, at the same size
        s.update(4, compute_s, 0.0)
    assert s.compute_s == pytest.approx(2.0, rel=1e-4) and s.compute_se < 1e-3


def test_another_plan_restarts_the_step_time_but_not_the_average_of_an_unchanged_batch():
    s = TimingSmoother(smoothing=0.0)
    for _ in range(3):
        s.update(8, 1.0, 1.0, plan=1)
    s.update(8, 1.0, 0.2, plan=2)  # the other ranks' change: shorter waits at the same size
    assert s.step_s == 1.2 and s.steps == 4
