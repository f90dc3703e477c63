"""Tests for lightning_hetero/planning/traces.py: shared hosts and the predictor report."""

import math
from statistics import correlation
from typing import Any

import pytest

from lightning_hetero.planning.lbbsp import LBBSPController
from lightning_hetero.planning.scenarios import SCENARIOS, run_scenario
from lightning_hetero.planning.simulator import HETEROGENEITY_LEVELS
from lightning_hetero.planning.static import StaticController
from lightning_hetero.planning.traces import predictor_report, resource_simulator, resource_trace

# --- resource_trace ----------------------------------------------------------------------------


def test_trace_has_one_speed_and_reading_per_worker_and_interval_within_range() -> None:
    trace = resource_trace(workers=3, boundaries=50, seed=0)
    assert len(trace.speeds) == len(trace.availability) == 50
    for speeds, readings in zip(trace.speeds, trace.availability):
        assert len(speeds) == len(readings) == 3
        assert all(0.0 < s <= 1.0 for s in speeds)
        assert all(0.0 <= r <= 1.0 for reading in readings for r in reading)


def test_trace_is_a_function_of_its_seed() -> None:
    assert resource_trace(seed=3) == resource_trace(seed=3)
    assert resource_trace(seed=3) != resource_trace(seed=4)


def test_workers_of_one_trace_differ() -> None:
    trace = resource_trace(workers=2, boundaries=100, seed=0)
    assert [s[0] for s in trace.speeds] != [s[1] for s in trace.speeds]


def test_speed_follows_the_cpu_reading() -> None:
    trace = resource_trace(workers=1, boundaries=300, seed=0, hiccup_probability=0.0)
    speeds = [s[0] for s in trace.speeds]
    cpu = [r[0][0] for r in trace.availability]
    assert correlation(speeds, cpu) > 0.8


def test_speeds_vary_with_both_spikes_and_lasting_phases() -> None:
    speeds = [s[0] for s in resource_trace(workers=1, boundaries=300, seed=1).speeds]
    changes = [abs(math.log(b / a)) for a, b in zip(speeds, speeds[1:])]
    assert sum(c < 0.01 for c in changes) > 0.3 * len(changes)  # calm stretches
    assert sum(c > 0.2 for c in changes) > 0.05 * len(changes)  # and large moves
    assert min(speeds) < 0.6


def test_hiccups_slow_intervals_without_touching_the_readings() -> None:
    calm = resource_trace(boundaries=80, seed=2, hiccup_probability=0.0)
    hiccups = resource_trace(boundaries=80, seed=2, hiccup_probability=1.0)
    assert hiccups.availability == calm.availability
    for slow, normal in zip(hiccups.speeds, calm.speeds):
        for s, n in zip(slow, normal):
            assert 0.5 * n <= s <= 0.8 * n + 1e-12


def test_without_reading_noise_the_cpu_reading_is_the_interval_mean_of_free_cpu() -> None:
    # With no hiccups and memory to spare, speed is free CPU ** 0.8 step by step, and the
    # interval's speed (harmonic mean) cannot exceed its mean free CPU ** 0.8 (Jensen).
    trace = resource_trace(workers=1, boundaries=100, seed=5, hiccup_probability=0.0)
    noiseless = resource_trace(
        workers=1, boundaries=100, seed=5, hiccup_probability=0.0, reading_noise=0.0
    )
    assert noiseless.speeds == trace.speeds
    for speed, reading in zip(noiseless.speeds, noiseless.availability):
        cpu, memory = reading[0]
        if memory >= 0.15:
            assert speed[0] <= cpu**0.8 + 1e-9


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"workers": 0}, "workers"),
        ({"boundaries": 0}, "boundaries"),
        ({"steps_per_boundary": 2}, "steps_per_boundary"),
        ({"jobs_per_boundary": 0.0}, "jobs_per_boundary"),
        ({"short_fraction": 1.5}, "short_fraction"),
        ({"hiccup_probability": -0.1}, "hiccup_probability"),
        ({"reading_noise": -0.01}, "reading_noise"),
    ],
)
def test_trace_rejects_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        resource_trace(**options)


# --- resource_simulator and the "resources" scenario -------------------------------------------


def test_simulator_plays_the_trace_on_heterogeneous_hosts() -> None:
    trace = resource_trace(workers=4, boundaries=20, seed=7)
    sim = resource_simulator(seed=7, boundaries=20)
    base = HETEROGENEITY_LEVELS["HL2"]
    for i in (0, 5, 19):
        assert sim.speeds_at(i) == trace.speeds[i]
        stats = sim.stats_at([64] * 4, i)
        assert [(s.cpu_available, s.memory_available) for s in stats] == trace.availability[i]
        step_s = sim.true_step_s([64] * 4, i)
        relative = [b * s for b, s in zip(base, trace.speeds[i])]
        assert [64 / t for t in step_s] == pytest.approx([r / (0.01 * 16) for r in relative])


def test_resources_scenario_is_four_workers_uniform_start_with_readings() -> None:
    scenario = SCENARIOS["resources"]
    assert scenario.batch_sizes == [64] * 4
    assert scenario.limits.global_batch_size == 256
    report = run_scenario(scenario, LBBSPController(predictor="last"))
    stats = report.result.history[10]["stats"]
    assert all(0.0 <= s.cpu_available <= 1.0 for s in stats)
    uniform = run_scenario(scenario, StaticController())
    assert report.mean_step_s < 0.8 * uniform.mean_step_s


# --- predictor_report --------------------------------------------------------------------------


def test_report_has_a_row_per_predictor_and_the_oracle_last() -> None:
    rows = predictor_report(seeds=[0, 1], predictors=["last", "ema"], boundaries=30, score_from=5)
    assert [row["predictor"] for row in rows] == ["last", "ema", "oracle"]
    for row in rows:
        for metric in ("rmse", "step_s"):
            assert row[f"{metric}_min"] <= row[f"{metric}_median"] <= row[f"{metric}_max"]
            assert row[f"{metric}_min"] <= row[metric] <= row[f"{metric}_max"]


def test_every_predictor_lands_between_the_oracle_and_the_uniform_plan() -> None:
    rows = predictor_report(seeds=[0, 1], predictors=["last", "ema"], boundaries=40, score_from=5)
    oracle = rows[-1]
    assert oracle["rmse"] < 0.02  # only timing noise is left
    for row in rows[:-1]:
        assert oracle["step_s"] < row["step_s"]
        assert oracle["rmse"] < row["rmse"]
        assert row["vs_uniform"] < 1.0


def test_narx_beats_ema_on_step_time_inside_lbbsp() -> None:
    rows = predictor_report(
        seeds=[0, 1], predictors=["ema", "narx"], boundaries=60, score_from=20, warmup=10
    )
    ema, narx = rows[0], rows[1]
    assert narx["step_s"] < ema["step_s"]
    assert narx["step_s_max"] < ema["step_s_max"]


@pytest.mark.parametrize(
    ("options", "match"),
    [({"seeds": []}, "seeds"), ({"score_from": 30, "boundaries": 30}, "score_from")],
)
def test_report_rejects_bad_options(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        predictor_report(**options)
