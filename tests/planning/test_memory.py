import random

import pytest

from lightning_hetero.planning import MemoryModel, PlanError, probe_sizes

MIB = 2**20


def test_fit_recovers_an_exact_line():
    samples = [(b, 300 * MIB + 2 * MIB * b) for b in (16, 32, 64, 128)]
    model = MemoryModel.fit(samples)
    assert model.fixed_bytes == pytest.approx(300 * MIB)
    assert model.per_sample_bytes == pytest.approx(2 * MIB)
    assert model.relative_error == pytest.approx(0.0, abs=1e-12)


def test_fit_recovers_a_noisy_line_within_ten_percent():
    rng = random.Random(0)
    fixed, per_sample = 500 * MIB, 3 * MIB
    samples = [
        (b, (fixed + per_sample * b) * (1 + rng.uniform(-0.02, 0.02)))
        for b in (8, 16, 32, 64, 128, 256)
        for _ in range(2)
    ]
    model = MemoryModel.fit(samples)
    assert model.per_sample_bytes == pytest.approx(per_sample, rel=0.1)
    assert model.fixed_bytes == pytest.approx(fixed, rel=0.1)
    assert 0.0 < model.relative_error < 0.05


def test_fit_reports_the_worst_residual_relative_to_the_largest_measurement():
    # Least squares through (1, 0), (2, 10), (3, 0) is flat at 10/3; the worst residual
    # is 20/3 at b=2, and the largest measurement is 10.
    model = MemoryModel.fit([(1, 0.0), (2, 10.0), (3, 0.0)])
    assert model.per_sample_bytes == pytest.approx(0.0)
    assert model.relative_error == pytest.approx(2 / 3)


def test_fit_needs_two_distinct_batch_sizes():
    with pytest.raises(PlanError, match="two distinct batch sizes"):
        MemoryModel.fit([(32, 1e9), (32, 1.1e9)])
    with pytest.raises(PlanError, match="two distinct batch sizes"):
        MemoryModel.fit([])


def test_fit_rejects_bad_samples():
    with pytest.raises(PlanError, match=">= 1"):
        MemoryModel.fit([(0, 1.0), (4, 2.0)])
    with pytest.raises(PlanError, match="finite"):
        MemoryModel.fit([(2, float("nan")), (4, 2.0)])


def test_max_batch_size_is_the_largest_size_within_the_safe_budget():
    model = MemoryModel(fixed_bytes=100.0, per_sample_bytes=10.0)
    # 0.9 * 1000 = 900 -> (900 - 100) / 10 = 80 exactly: the boundary is included.
    assert model.max_batch_size(1000, safety=0.9) == 80
    assert model.predict(80) <= 900 < model.predict(81)
    assert model.max_batch_size(1009, safety=1.0) == 90
    assert model.max_batch_size(110, safety=1.0) == 1


def test_max_batch_size_is_exact_where_floating_point_division_is_not():
    # 0.1 * 3 > 0.3 in floating point: the bound must not trust the division blindly.
    model = MemoryModel(fixed_bytes=0.0, per_sample_bytes=0.1)
    bound = model.max_batch_size(0.3, safety=1.0)
    assert model.predict(bound) <= 0.3 < model.predict(bound + 1)


def test_max_batch_size_never_exceeds_the_cap():
    model = MemoryModel(fixed_bytes=100.0, per_sample_bytes=10.0)
    assert model.max_batch_size(1000, safety=0.9, cap=50) == 50
    assert model.max_batch_size(1000, safety=0.9, cap=500) == 80


@pytest.mark.parametrize("per_sample", [0.0, -5.0])
def test_flat_or_falling_memory_does_not_bound_the_batch(per_sample):
    model = MemoryModel(fixed_bytes=100.0, per_sample_bytes=per_sample)
    assert model.max_batch_size(1000) is None
    assert model.max_batch_size(1000, cap=256) == 256


def test_a_negligible_slope_does_not_bound_the_batch():
    model = MemoryModel(fixed_bytes=0.0, per_sample_bytes=1e-320)
    assert model.max_batch_size(1e300, cap=64) == 64


def test_max_batch_size_raises_when_not_even_one_sample_fits():
    model = MemoryModel(fixed_bytes=950 * MIB, per_sample_bytes=MIB)
    with pytest.raises(PlanError, match=r"fixed cost is about 950\.0 MiB.*1000\.0 MiB"):
        model.max_batch_size(1000 * MIB, safety=0.9)
    with pytest.raises(PlanError, match="Not even a batch of 1"):
        MemoryModel(fixed_bytes=2000.0, per_sample_bytes=0.0).max_batch_size(1000, cap=8)


@pytest.mark.parametrize("safety", [0.0, -0.1, 1.01, float("nan")])
def test_safety_outside_zero_one_is_rejected(safety):
    with pytest.raises(ValueError, match="safety"):
        MemoryModel(100.0, 1.0).max_batch_size(1000, safety=safety)


@pytest.mark.parametrize("budget", [-1.0, float("inf"), float("nan")])
def test_bad_budgets_are_rejected(budget):
    with pytest.raises(ValueError, match="budget_bytes"):
        MemoryModel(100.0, 1.0).max_batch_size(budget)


def test_a_zero_budget_fits_nothing():
    with pytest.raises(PlanError):
        MemoryModel(1.0, 1.0).max_batch_size(0.0)


def test_bad_caps_and_coefficients_are_rejected():
    with pytest.raises(ValueError, match="cap"):
        MemoryModel(100.0, 1.0).max_batch_size(1000, cap=0)
    with pytest.raises(ValueError, match="finite"):
        MemoryModel(float("inf"), 1.0)


def test_plan_error_is_a_value_error():
    with pytest.raises(ValueError):
        MemoryModel.fit([(1, 1.0)])


def test_probe_sizes_are_geometric_ascending_and_end_at_the_largest():
    assert probe_sizes(256) == [32, 64, 128, 256]
    assert probe_sizes(1000, count=3, ratio=10) == [10, 100, 1000]
    assert probe_sizes(2, count=5) == [1, 2]


@pytest.mark.parametrize(
    ("largest", "count", "ratio"), [(1, 4, 2.0), (64, 1, 2.0), (64, 4, 1.0), (64, 4, float("inf"))]
)
def test_probe_sizes_rejects_requests_that_cannot_give_a_line(largest, count, ratio):
    with pytest.raises(ValueError):
        probe_sizes(largest, count=count, ratio=ratio)
