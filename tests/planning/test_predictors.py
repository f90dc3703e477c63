"""Tests for lightning_hetero/planning/predictors.py: one-step-ahead speed predictors."""

import io
import json
import math
import random

import pytest
import torch

from lightning_hetero.planning.predictors import (
    PREDICTORS,
    EMAPredictor,
    LastPredictor,
    NARXPredictor,
    SpeedPredictor,
    relative_rmse,
)
from lightning_hetero.planning.traces import resource_trace


def feed(predictor: SpeedPredictor, rows: list[tuple[float, float, float]]) -> list[float]:
    """Observe each ``(speed, cpu, memory)`` row; return the prediction made after each."""
    predictions = []
    for speed, cpu, memory in rows:
        predictor.observe(speed, cpu, memory)
        predictions.append(predictor.predict())
    return predictions


def phases(n: int, seed: int = 0) -> list[tuple[float, float, float]]:
    """Speed ``100 * c`` where the CPU reading ``c`` at a boundary announces the next interval.

    ``c`` holds for 1-5 intervals, then jumps: the reading foretells every jump, the
    speeds alone never do.
    """
    rng = random.Random(seed)
    levels: list[float] = []
    while len(levels) < n + 1:
        levels += [rng.uniform(0.2, 1.0)] * rng.randint(1, 5)
    return [(100.0 * levels[i], levels[i + 1], 0.5) for i in range(n)]


def score(rows: list[tuple[float, float, float]], predictions: list[float], start: int) -> float:
    """Relative RMSE of ``predictions[i]`` against the speed of row ``i + 1``, from ``start``."""
    return relative_rmse(predictions[start:-1], [r[0] for r in rows[start + 1 :]])


# --- Last and EMA ------------------------------------------------------------------------------


def test_last_predicts_the_last_speed() -> None:
    p = LastPredictor()
    assert math.isnan(p.predict())
    assert feed(p, [(100.0, 0.5, 0.5), (50.0, 0.1, 0.1), (80.0, math.nan, math.nan)]) == [
        100.0,
        50.0,
        80.0,
    ]


def test_ema_starts_at_the_first_speed_then_weighs_the_latest_by_alpha() -> None:
    p = EMAPredictor(alpha=0.2)
    assert math.isnan(p.predict())
    predictions = feed(p, [(100.0, 0.5, 0.5), (50.0, 0.5, 0.5), (80.0, 0.5, 0.5)])
    assert predictions == pytest.approx([100.0, 90.0, 88.0])


def test_ema_with_alpha_one_is_the_last_speed() -> None:
    rows = [(s, math.nan, math.nan) for s in (3.0, 9.0, 1.0, 4.0)]
    assert feed(EMAPredictor(alpha=1.0), rows) == feed(LastPredictor(), rows)


@pytest.mark.parametrize("alpha", [0.0, -0.1, 1.5, math.nan])
def test_ema_rejects_alpha_outside_zero_one(alpha: float) -> None:
    with pytest.raises(ValueError, match="alpha"):
        EMAPredictor(alpha=alpha)


@pytest.mark.parametrize("cls", [LastPredictor, EMAPredictor, NARXPredictor])
@pytest.mark.parametrize("speed", [0.0, -1.0, math.nan, math.inf])
def test_predictors_reject_speeds_that_are_not_finite_and_positive(
    cls: type[SpeedPredictor], speed: float
) -> None:
    with pytest.raises(ValueError, match="finite and positive"):
        cls().observe(speed)


def test_registry_names_are_the_predictors_own() -> None:
    assert sorted(PREDICTORS) == ["ema", "last", "narx"]
    assert all(cls.name == name for name, cls in PREDICTORS.items())


@pytest.mark.parametrize("cls", [LastPredictor, EMAPredictor])
def test_simple_predictor_state_round_trip_continues_identically(
    cls: type[SpeedPredictor],
) -> None:
    a = cls()
    feed(a, [(10.0, 0.5, 0.5), (20.0, 0.5, 0.5)])
    b = cls()
    b.load_state_dict(json.loads(json.dumps(a.state_dict())))
    rows = [(15.0, 0.5, 0.5), (5.0, 0.5, 0.5)]
    assert feed(a, rows) == feed(b, rows)


def test_relative_rmse_is_the_rmse_over_the_mean_actual_value() -> None:
    assert relative_rmse([2.0, 30.0], [1.0, 10.0]) == pytest.approx(math.sqrt((1 + 400) / 2) / 5.5)
    with pytest.raises(ValueError):
        relative_rmse([], [])


# --- NARX: construction ------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"alpha": 0.0}, "alpha"),
        ({"hidden_size": 0}, "hidden_size"),
        ({"hidden_size": 2.5}, "hidden_size"),
        ({"warmup": 3}, "warmup"),
        ({"warmup": 30, "window": 20}, "window"),
        ({"validation_fraction": 0.0}, "validation_fraction"),
        ({"validation_fraction": 1.0}, "validation_fraction"),
        ({"max_epochs": 0}, "max_epochs"),
        ({"patience": True}, "patience"),
        ({"learning_rate": 0.0}, "learning_rate"),
        ({"weight_decay": -1.0}, "weight_decay"),
        ({"huber_delta": -0.1}, "huber_delta"),
    ],
)
def test_narx_rejects_bad_options_by_name(options: dict, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        NARXPredictor(**options)


# --- NARX: behaviour ---------------------------------------------------------------------------


def test_narx_predicts_the_ema_until_warmup_samples_exist() -> None:
    rows = phases(25)
    narx, ema = NARXPredictor(warmup=20), EMAPredictor()
    # A sample needs three earlier observations (the reading lags), so the first training
    # comes with observation warmup + 3.
    for i, (speed, cpu, memory) in enumerate(rows[:22]):
        narx.observe(speed, cpu, memory)
        ema.observe(speed)
        assert not narx.trained, i
        assert narx.predict() == ema.predict()
    narx.observe(*rows[22])
    assert narx.trained


def test_narx_without_readings_is_the_ema_and_never_trains() -> None:
    rows = [(speed, math.nan, math.nan) for speed, _, _ in phases(40)]
    ema_rows = [(speed, 0.5, 0.5) for speed, _, _ in rows]
    narx = NARXPredictor(warmup=5)
    assert feed(narx, rows) == feed(EMAPredictor(), ema_rows)
    assert not narx.trained


def test_narx_falls_back_to_the_ema_when_the_current_reading_is_missing() -> None:
    narx = NARXPredictor(warmup=8)
    feed(narx, phases(30))
    assert narx.trained
    narx.observe(50.0, math.nan, 0.5)
    assert narx.predict() == narx.fallback.predict()
    # the gap stays in the inputs for three boundaries, then the network is back
    feed(narx, [(50.0, 0.5, 0.5)] * 2)
    assert narx.predict() == narx.fallback.predict()
    narx.observe(50.0, 0.5, 0.5)
    assert narx.predict() != narx.fallback.predict()


def test_narx_learns_speed_from_a_reading_that_announces_it() -> None:
    rows = phases(100)
    narx = score(rows, feed(NARXPredictor(), rows), start=40)
    ema = score(rows, feed(EMAPredictor(), rows), start=40)
    last = score(rows, feed(LastPredictor(), rows), start=40)
    assert narx < 0.5 * min(ema, last), (narx, ema, last)


def test_narx_beats_ema_on_resource_traces_over_several_seeds() -> None:
    narx_scores, ema_scores = [], []
    for seed in range(4):
        trace = resource_trace(workers=1, boundaries=200, seed=seed)
        rows = [(s[0], *r[0]) for s, r in zip(trace.speeds, trace.availability)]
        narx_scores.append(score(rows, feed(NARXPredictor(), rows), start=40))
        ema_scores.append(score(rows, feed(EMAPredictor(), rows), start=40))
    assert sum(narx_scores) < 0.95 * sum(ema_scores), (narx_scores, ema_scores)
    assert sum(n < e for n, e in zip(narx_scores, ema_scores)) >= 3, (narx_scores, ema_scores)


def test_narx_predictions_scale_with_the_unit_of_speed() -> None:
    rows = phases(40)
    scaled = [(1e4 * s, c, m) for s, c, m in rows]
    small = feed(NARXPredictor(warmup=8), rows)
    large = feed(NARXPredictor(warmup=8), scaled)
    assert [x * 1e4 for x in small] == pytest.approx(large, rel=1e-9)


def test_narx_is_deterministic() -> None:
    rows = phases(40)
    assert feed(NARXPredictor(warmup=8), rows) == feed(NARXPredictor(warmup=8), rows)


def test_narx_seed_changes_the_initial_weights() -> None:
    rows = phases(30)
    assert feed(NARXPredictor(warmup=8, seed=0), rows) != feed(
        NARXPredictor(warmup=8, seed=1), rows
    )


def test_narx_state_is_plain_data_and_restores_exactly_through_torch_save() -> None:
    rows = phases(60)
    a = NARXPredictor(warmup=8)
    feed(a, rows[:40])
    state = a.state_dict()
    json.dumps(state)  # plain lists and floats only
    buffer = io.BytesIO()
    torch.save(state, buffer)
    buffer.seek(0)
    b = NARXPredictor(warmup=8)
    b.load_state_dict(torch.load(buffer, weights_only=True))
    assert b.predict() == a.predict()
    assert feed(b, rows[40:]) == feed(a, rows[40:])


def test_narx_keeps_only_the_window_it_trains_on() -> None:
    narx = NARXPredictor(warmup=4, window=10)
    feed(narx, phases(30))
    assert len(narx.speeds) == len(narx.cpu) == len(narx.memory) == 10 + 3


def test_narx_turns_an_overflowing_network_output_into_inf() -> None:
    narx = NARXPredictor(warmup=4)
    feed(narx, phases(10))
    assert narx.weights is not None
    narx.weights["output_bias"] = [1e6]
    assert narx.predict() == math.inf
