"""Tests for lightning_hetero/planning/lbbsp.py: batch sizes proportional to predicted speed."""

import io
import math
import random
from typing import Any

import pytest
import torch

from lightning_hetero.planning.base import BatchLimits, RankStats
from lightning_hetero.planning.lbbsp import LBBSPController
from lightning_hetero.planning.predictors import SpeedPredictor
from lightning_hetero.planning.registry import make_controller
from lightning_hetero.planning.scenarios import SCENARIOS, run_scenario
from lightning_hetero.planning.split import proportional_split

LIMITS = BatchLimits.build(4, 256)


class FixedPredictor(SpeedPredictor):
    """Ignores what it observes and predicts ``value``."""

    name = "fixed"

    def __init__(self, value: float) -> None:
        self.value = value

    def observe(self, speed: float, cpu_available: float = math.nan, memory_available=math.nan):  # type: ignore[no-untyped-def]
        pass

    def predict(self) -> float:
        return self.value


def random_case(rng: random.Random) -> tuple[list[int], list[float], BatchLimits]:
    """A feasible plan, positive compute times and limits for 1-8 ranks."""
    world_size = rng.randint(1, 8)
    lower = [rng.randint(1, 8) for _ in range(world_size)]
    upper = [lo + rng.randint(0, 200) for lo in lower]
    total = rng.randint(sum(lower), sum(upper))
    limits = BatchLimits(total, lower, upper)
    plan = proportional_split(
        [rng.uniform(0.1, 1.0) for _ in range(world_size)], total, lower, upper
    )
    compute_s = [rng.uniform(0.01, 5.0) for _ in range(world_size)]
    return plan, compute_s, limits


def predicted_step_s(plan: list[int], speeds: list[float]) -> float:
    return max(b / v for b, v in zip(plan, speeds))


# --- planning ----------------------------------------------------------------------------------


def test_plan_is_proportional_to_the_predicted_speeds() -> None:
    ctl = LBBSPController(predictor="last")
    plan = ctl.update([64, 64, 64, 64], [4.0, 4.0, 6.0, 1.5], LIMITS)
    assert ctl.predicted_speeds == pytest.approx([16.0, 16.0, 64 / 6, 64 / 1.5])
    assert plan == [48, 48, 32, 128]


def test_ema_predictor_plans_from_the_average_speed() -> None:
    ctl = LBBSPController(predictor="ema", alpha=0.5, deadband=0.0)
    ctl.update([64, 64, 64, 64], [1.0, 1.0, 1.0, 1.0], LIMITS)  # 64 samples/s each
    plan = ctl.update([64, 64, 64, 64], [1.0, 1.0, 1.0, 0.5], LIMITS)  # rank 3 now 128
    assert ctl.predicted_speeds == pytest.approx([64.0, 64.0, 64.0, 96.0])
    assert plan == proportional_split([64.0, 64.0, 64.0, 96.0], 256)


def test_random_inputs_give_exact_sums_bounds_and_never_a_worse_predicted_step() -> None:
    rng = random.Random(0)
    for _ in range(300):
        plan, compute_s, limits = random_case(rng)
        ctl = LBBSPController(predictor="last", deadband=rng.choice([0.0, 0.05, 0.3]))
        new = ctl.update(plan, compute_s, limits)
        assert sum(new) == limits.global_batch_size
        assert all(
            lo <= b <= hi for b, lo, hi in zip(new, limits.min_batch_size, limits.max_batch_size)
        )
        speeds = ctl.predicted_speeds
        assert predicted_step_s(new, speeds) <= predicted_step_s(plan, speeds) + 1e-12
        target = proportional_split(
            speeds, limits.global_batch_size, limits.min_batch_size, limits.max_batch_size
        )
        assert new in (plan, target)


def test_without_deadband_every_predicted_gain_is_taken() -> None:
    rng = random.Random(1)
    for _ in range(200):
        plan, compute_s, limits = random_case(rng)
        ctl = LBBSPController(predictor="last", deadband=0.0)
        new = ctl.update(plan, compute_s, limits)
        speeds = ctl.predicted_speeds
        target = proportional_split(
            speeds, limits.global_batch_size, limits.min_batch_size, limits.max_batch_size
        )
        if predicted_step_s(target, speeds) < predicted_step_s(plan, speeds):
            assert new == target


def test_deadband_keeps_the_plan_unless_the_predicted_step_gain_exceeds_it() -> None:
    # rank 0 predicted 4% slower than the others: the balanced split gains about 3%
    small = [1.04, 1.0, 1.0, 1.0]
    assert LBBSPController("last", deadband=0.05).update([64] * 4, small, LIMITS) == [64] * 4
    assert LBBSPController("last", deadband=0.0).update([64] * 4, small, LIMITS) != [64] * 4
    # 20% slower: a 15% gain
    large = [1.2, 1.0, 1.0, 1.0]
    assert LBBSPController("last", deadband=0.05).update([64] * 4, large, LIMITS) != [64] * 4


def test_a_plan_outside_the_limits_is_always_replaced() -> None:
    limits = BatchLimits.build(4, 256, max_batch_size=80)
    ctl = LBBSPController(predictor="last", deadband=0.9)
    plan = ctl.update([100, 52, 52, 52], [1.0, 1.0, 1.0, 1.0], limits)
    assert plan != [100, 52, 52, 52]
    assert sum(plan) == 256 and max(plan) <= 80


def test_plan_follows_the_bounds_when_the_prediction_asks_for_more() -> None:
    limits = BatchLimits.build(4, 256, max_batch_size=100)
    plan = LBBSPController("last").update([64] * 4, [1.0, 1.0, 1.0, 0.1], limits)
    assert plan[3] == 100 and sum(plan) == 256


def test_readings_reach_the_predictor() -> None:
    seen: list[tuple[float, float, float]] = []

    class Recording(FixedPredictor):
        def observe(self, speed, cpu_available=math.nan, memory_available=math.nan):  # type: ignore[no-untyped-def]
            seen.append((speed, cpu_available, memory_available))

    ctl = LBBSPController(predictor=lambda: Recording(1.0))
    stats = [RankStats(cpu_available=0.1 * k, memory_available=0.2) for k in range(4)]
    ctl.update([64] * 4, [2.0] * 4, LIMITS, stats)
    assert seen == [(32.0, 0.1 * k, 0.2) for k in range(4)]


@pytest.mark.parametrize("bad", [math.nan, 0.0, -5.0, math.inf])
def test_a_bad_prediction_falls_back_to_the_ema_with_a_warning(bad: float) -> None:
    ctl = LBBSPController(predictor=lambda: FixedPredictor(10.0), alpha=0.5)
    ctl.update([64] * 4, [1.0, 1.0, 1.0, 1.0], LIMITS)  # 64 samples/s each
    ctl.predictors[1] = FixedPredictor(bad)
    with pytest.warns(UserWarning, match=r"Rank 1: the 'fixed' predictor gave .*EMA"):
        ctl.update([64] * 4, [1.0, 2.0, 1.0, 1.0], LIMITS)  # rank 1 now 32
    assert ctl.predicted_speeds == [10.0, 48.0, 10.0, 10.0]


def test_a_narx_that_returns_nan_falls_back_to_the_ema(monkeypatch: pytest.MonkeyPatch) -> None:
    from lightning_hetero.planning.predictors import NARXPredictor

    monkeypatch.setattr(NARXPredictor, "predict", lambda self: math.nan)
    ctl = LBBSPController(predictor="narx")
    with pytest.warns(UserWarning) as record:
        plan = ctl.update([64] * 4, [4.0, 4.0, 6.0, 1.5], LIMITS)
    messages = [str(w.message) for w in record]
    assert len(messages) == 4
    for rank, message in enumerate(messages):
        assert message.startswith(f"Rank {rank}: the 'narx' predictor gave nan"), message
    assert plan == [48, 48, 32, 128]


# --- validation --------------------------------------------------------------------------------


def test_unknown_predictor_lists_the_valid_names() -> None:
    with pytest.raises(ValueError, match=r"Unknown predictor 'arima'.*'ema', 'last', 'narx'"):
        LBBSPController(predictor="arima")


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"predictor": 3}, "predictor"),
        ({"predictor": lambda: "not a predictor"}, "SpeedPredictor"),
        ({"alpha": 0.0}, "alpha"),
        ({"alpha": 1.5}, "alpha"),
        ({"deadband": 1.0}, "deadband"),
        ({"deadband": -0.1}, "deadband"),
        ({"predictor": "narx", "warmup": 0}, "warmup"),
        ({"predictor": "narx", "window": 0}, "window"),
        ({"predictor": "narx", "hidden_size": 0}, "hidden_size"),
        ({"predictor": "narx", "max_epochs": 0}, "max_epochs"),
    ],
)
def test_bad_options_raise_value_error_at_construction(options: dict[str, Any], match: str) -> None:
    with pytest.raises(ValueError, match=match):
        LBBSPController(**options)


@pytest.mark.parametrize("compute_s", [[1.0, math.nan, 1.0, 1.0], [1.0, 0.0, 1.0, 1.0]])
def test_bad_compute_times_raise(compute_s: list[float]) -> None:
    with pytest.raises(ValueError, match="finite and positive"):
        LBBSPController().update([64] * 4, compute_s, LIMITS)


def test_mismatched_lengths_raise() -> None:
    with pytest.raises(ValueError, match="per rank"):
        LBBSPController().update([64] * 4, [1.0] * 3, LIMITS)
    with pytest.raises(ValueError, match="RankStats"):
        LBBSPController().update([64] * 4, [1.0] * 4, LIMITS, [RankStats()] * 3)


def test_registry_builds_it_by_name_with_the_strategy_deadband() -> None:
    ctl = make_controller("lbbsp", deadband=0.2)
    assert isinstance(ctl, LBBSPController)
    assert ctl.deadband == 0.2


# --- state and determinism ---------------------------------------------------------------------


def inputs(n: int, seed: int = 0) -> list[tuple[list[float], list[RankStats]]]:
    """Compute times and readings of four ranks whose speed follows their CPU reading."""
    rng = random.Random(seed)
    cpu = [0.5] * 4
    rows = []
    for _ in range(n):
        cpu = [c if rng.random() < 0.8 else rng.uniform(0.2, 1.0) for c in cpu]
        rows.append(
            (
                [1.0 / (c * (1.0 + rng.gauss(0.0, 0.02))) for c in cpu],
                [RankStats(cpu_available=c, memory_available=0.5) for c in cpu],
            )
        )
    return rows


def drive(ctl: LBBSPController, plan: list[int], rows: list[Any]) -> list[list[int]]:
    """Feed each row's times (measured at the plan in force) and return every plan."""
    plans = []
    for compute_s, stats in rows:
        times = [t * b / 64 for t, b in zip(compute_s, plan)]
        plan = ctl.update(plan, times, LIMITS, stats)
        plans.append(plan)
    return plans


NARX_FAST = {"predictor": "narx", "warmup": 8, "deadband": 0.0}


@pytest.mark.parametrize(
    "options", [{"predictor": "last"}, {"predictor": "ema"}, NARX_FAST], ids=["last", "ema", "narx"]
)
def test_state_dict_round_trip_gives_identical_next_plans(options: dict[str, Any]) -> None:
    rows = inputs(40)
    a = LBBSPController(**options)
    plan = drive(a, [64] * 4, rows[:25])[-1]
    buffer = io.BytesIO()
    torch.save(a.state_dict(), buffer)
    buffer.seek(0)
    b = LBBSPController(**options)
    b.load_state_dict(torch.load(buffer, weights_only=True))
    assert b.predicted_speeds == a.predicted_speeds
    assert drive(b, plan, rows[25:]) == drive(a, plan, rows[25:])
    assert b.predicted_speeds == a.predicted_speeds


def test_narx_controller_is_deterministic_and_uses_its_network() -> None:
    rows = inputs(30)
    a, b = LBBSPController(**NARX_FAST), LBBSPController(**NARX_FAST)
    assert drive(a, [64] * 4, rows) == drive(b, [64] * 4, rows)
    assert a.predicted_speeds == b.predicted_speeds
    assert all(p.trained for p in a.predictors)  # type: ignore[attr-defined]


def test_narx_without_readings_plans_like_the_ema() -> None:
    narx = run_scenario("HL4", LBBSPController(predictor="narx", warmup=4))
    ema = run_scenario("HL4", LBBSPController(predictor="ema"))
    assert narx.result.plans == ema.result.plans


# --- simulated clusters ------------------------------------------------------------------------


@pytest.mark.parametrize("level", ["HL2", "HL4", "HL8"])
@pytest.mark.parametrize("predictor", ["last", "ema", "narx"])
def test_reaches_balance_from_a_uniform_start_in_one_boundary(level: str, predictor: str) -> None:
    report = run_scenario(level, LBBSPController(predictor=predictor))
    assert report.boundaries_to_balance == 1
    assert report.steady_efficiency >= 0.95
    assert report.plan_changes <= 2


def test_last_predictor_recovers_within_one_boundary_after_every_speed_change() -> None:
    report = run_scenario("steps", LBBSPController(predictor="last"))
    assert report.boundaries_to_balance == 1
    assert report.steady_efficiency >= 0.97


def test_ema_predictor_recovers_from_every_speed_change_but_lags() -> None:
    # alpha = 0.2 closes 20% of the gap per boundary: after the drastic HL8 -> HL1 change
    # it needs more than the 15 boundaries of a phase to reach 0.95 (paper 001's case
    # against the EMA). Every phase still ends far better than it starts.
    scenario = SCENARIOS["steps"]
    report = run_scenario(scenario, LBBSPController(predictor="ema"))
    efficiency = report.result.balance
    for start in scenario.changes[1:]:
        end = start + 14
        assert efficiency[end] >= 0.85, (start, efficiency[start : end + 1])
        assert efficiency[end] > efficiency[start] + 0.1
    assert report.boundaries_to_balance is None


def test_deadband_keeps_noisy_timings_from_moving_the_plan() -> None:
    calm = run_scenario("noisy", LBBSPController(predictor="last"))
    eager = run_scenario("noisy", LBBSPController(predictor="last", deadband=0.0))
    assert calm.plan_changes <= 12
    assert eager.plan_changes >= 2 * calm.plan_changes
    assert calm.steady_efficiency >= 0.94
    ema = run_scenario("noisy", LBBSPController(predictor="ema"))
    assert ema.plan_changes <= 3
