"""The level benchmark's figures, from a synthetic pair of runs with known curves."""

import math

import pytest

from lightning_hetero.bench.__main__ import (
    _emulated_optimum,
    cluster_costs,
    measured_curves,
    ratios,
    report,
)
from lightning_hetero.planning import HETEROGENEITY_LEVELS


def _entry(sizes: list[int], changed: bool) -> dict:
    # rank 0: t = 0.01 + 0.01 b; rank 1: t = 0.01 + 0.02 b (a fixed cost of 10 ms each)
    times = [0.01 + 0.01 * sizes[0], 0.01 + 0.02 * sizes[1]]
    return {
        "batch_sizes": sizes,
        "compute_times": times,
        "balance": sum(times) / (len(times) * max(times)),
        "changed": changed,
        "boundary_s": 0.01,
        "gather_s": 0.005,
    }


def _pair(hetero_epoch_s: float) -> dict:
    history = [_entry([15, 15], True), _entry([20, 10], False), _entry([20, 10], False)]
    return {
        "ddp": {"epoch_s": [3.1, 3.1, 3.1]},
        "hetero": {"epoch_s": [3.1, hetero_epoch_s, hetero_epoch_s], "history": history},
    }


def test_measured_curves_are_per_rank_sizes_with_median_times():
    history = [_entry([15, 15], True), _entry([20, 10], False), _entry([20, 10], False)]
    history[2]["compute_times"] = [0.5, 0.5]  # an outlier at one size: the median of three
    history.append(_entry([20, 10], False))
    curves = measured_curves(history)
    assert [b for b, _ in curves[0]] == [15, 20] and [b for b, _ in curves[1]] == [10, 15]
    assert curves[0][1][1] == pytest.approx(0.21) and curves[1][0][1] == pytest.approx(0.21)


def test_allowed_speedup_uses_the_fitted_curves_not_the_nominal_speeds():
    # uniform: slowest 0.31 s; best split [20, 10]: 0.21 s each. A step time through the
    # origin would allow 0.31 / (30 / (1/0.0107 + 1/0.0207)) ~ 1.46, the curves 0.31/0.21.
    figures = ratios("HL2", _pair(3.1 * 0.21 / 0.31), skip=1)
    assert figures["allowed"] == pytest.approx(0.31 / 0.21, rel=1e-6)
    assert figures["fraction_allowed"] == pytest.approx(1.0, rel=1e-6)
    assert figures["plan_fraction"] == pytest.approx(1.0, rel=1e-6)
    slower = ratios("HL2", _pair(3.1 * 0.21 / 0.31 * 1.05), skip=1)
    assert slower["fraction_allowed"] == pytest.approx(1 / 1.05, rel=1e-6)


def test_the_step_bound_adds_the_time_outside_compute_to_both_plans():
    # uniform: the slowest rank computes 0.31 s of a 0.35 s step, so 0.04 s of every step is
    # the all-reduce and the loop, which no plan shrinks: (0.31 + 0.04) / (0.21 + 0.04)
    pair = _pair(3.1 * 0.25 / 0.35)
    pair["hetero"]["history"][0]["step_time"] = 0.35
    figures = ratios("HL2", pair, skip=1)
    assert figures["allowed"] == pytest.approx(0.31 / 0.21, rel=1e-6)
    assert figures["allowed_step"] == pytest.approx(0.35 / 0.25, rel=1e-6)
    assert figures["fraction_step"] == pytest.approx(1.0, rel=1e-6)
    assert figures["fraction_allowed"] == pytest.approx(0.35 / 0.25 / (0.31 / 0.21), rel=1e-6)
    assert figures["gain_capture"] == pytest.approx((1.4 - 1) / (0.31 / 0.21 - 1), rel=1e-6)
    # without a step time (older runs) the bound is the compute-only one
    plain = ratios("HL2", _pair(3.1 * 0.21 / 0.31), skip=1)
    assert plain["allowed_step"] == pytest.approx(plain["allowed"], rel=1e-9)


def test_the_report_has_the_allowed_columns():
    table = report({"HL2": [_pair(2.5), _pair(2.6)]}, skip=1)
    header = table.splitlines()[0]
    assert "| allowed |" in header and "| fraction_allowed |" in header
    assert "| gain_capture |" in header and "| fraction_step |" in header
    assert "plan_fraction" in header and "`fraction_allowed`: speedup / allowed" in table


def test_cluster_costs_add_loading_fixed_costs_and_floors_to_the_device_costs():
    cores = HETEROGENEITY_LEVELS["HL4"]
    devices = cluster_costs("devices", cores, 0.048, 32)
    assert devices == {"sample_cost": [0.048 / c for c in cores]}
    loader = cluster_costs("loader", cores, 0.048, 32)
    assert loader["load_cost"] == 0.048 / 24 and loader["step_cost"] == 0.1 * 0.008 * 32
    floor = cluster_costs("floor", cores, 0.048, 32)
    assert floor["floor"][3] == 0.0 and floor["floor"][2] == 0.008 * 32
    # equal loading and a fixed cost leave less to gain than the devices alone; a floor less
    assert _emulated_optimum(devices) < _emulated_optimum(loader) < _emulated_optimum(floor) < 1
    assert math.isnan(_emulated_optimum(None))
