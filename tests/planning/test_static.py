"""Tests for lightning_hetero/planning/static.py: the controller that keeps its plan."""

from lightning_hetero.planning.base import BatchLimits
from lightning_hetero.planning.simulator import HETEROGENEITY_LEVELS, ClusterSimulator
from lightning_hetero.planning.static import StaticController


def test_static_keeps_plan_however_unequal_the_timings() -> None:
    limits = BatchLimits.build(4, 256)
    plan = [100, 50, 50, 56]
    assert StaticController().update(plan, [9.0, 0.1, 3.0, 1e-6], limits) == plan


def test_static_returns_a_copy_not_the_callers_list() -> None:
    plan = [8, 8]
    result = StaticController().update(plan, [1.0, 3.0], BatchLimits.build(2, 16))
    result[0] = 0
    assert plan == [8, 8]


def test_static_never_adjusts_on_heterogeneous_simulated_cluster() -> None:
    sim = ClusterSimulator.from_speeds(HETEROGENEITY_LEVELS["HL8"], noise=0.03, seed=0)
    result = sim.run(StaticController(), [64] * 4, BatchLimits.build(4, 256), boundaries=10)
    assert result.adjustments == 0
    assert all(plan == [64] * 4 for plan in result.plans)
    assert max(result.balance) < 0.34  # uniform split at HL8 stays unbalanced: E = 1/3


def test_static_state_is_empty_and_round_trips() -> None:
    controller = StaticController()
    assert controller.state_dict() == {}
    controller.load_state_dict({})
    assert controller.update([3, 5], [1.0, 1.0], BatchLimits.build(2, 8)) == [3, 5]


def test_static_is_registered_under_name_static() -> None:
    assert StaticController.name == "static"
