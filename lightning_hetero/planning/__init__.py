"""The planning layer: pure functions and objects, numbers in and plans out.

Nothing here imports torch.distributed or Lightning, so every controller is
tested in milliseconds against the [`ClusterSimulator`][lightning_hetero.planning.ClusterSimulator].
"""

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats
from lightning_hetero.planning.dual import (
    DualBatchController,
    DualBatchError,
    DualBatchPlan,
    TimeModel,
    plan_dual_batch,
    plan_dual_batch_by_speed,
)
from lightning_hetero.planning.guard import StepTimeGuard, damped_plan
from lightning_hetero.planning.lbbsp import LBBSPController
from lightning_hetero.planning.memory import MemoryModel, probe_sizes
from lightning_hetero.planning.merge import (
    MergeWeights,
    check_merge_options,
    merge_weights,
    momentum_merge,
)
from lightning_hetero.planning.model import (
    ModelController,
    StepTimeCurve,
    allowed_speedup,
    optimal_step_time,
    solve_plan,
)
from lightning_hetero.planning.predictors import (
    PREDICTORS,
    EMAPredictor,
    LastPredictor,
    NARXPredictor,
    SpeedPredictor,
)
from lightning_hetero.planning.proportional import ProportionalController
from lightning_hetero.planning.registry import CONTROLLERS, make_controller
from lightning_hetero.planning.simulator import (
    HETEROGENEITY_LEVELS,
    ClusterSimulator,
    SimulatedWorker,
    SimulationResult,
)
from lightning_hetero.planning.smoothing import TimingSmoother
from lightning_hetero.planning.split import (
    PlanError,
    balance_efficiency,
    check_plan,
    ideal_speedup,
    proportional_split,
)
from lightning_hetero.planning.static import StaticController
from lightning_hetero.planning.stepwise import StepwiseController
from lightning_hetero.planning.updates import UpdatesController

__all__ = [
    "CONTROLLERS",
    "HETEROGENEITY_LEVELS",
    "PREDICTORS",
    "BatchLimits",
    "ClusterSimulator",
    "Controller",
    "DualBatchController",
    "DualBatchError",
    "DualBatchPlan",
    "EMAPredictor",
    "LBBSPController",
    "LastPredictor",
    "MemoryModel",
    "MergeWeights",
    "ModelController",
    "NARXPredictor",
    "PlanError",
    "ProportionalController",
    "RankStats",
    "SimulatedWorker",
    "SimulationResult",
    "SpeedPredictor",
    "StaticController",
    "StepTimeCurve",
    "StepTimeGuard",
    "StepwiseController",
    "TimeModel",
    "TimingSmoother",
    "UpdatesController",
    "allowed_speedup",
    "balance_efficiency",
    "check_merge_options",
    "check_plan",
    "damped_plan",
    "ideal_speedup",
    "make_controller",
    "merge_weights",
    "momentum_merge",
    "optimal_step_time",
    "plan_dual_batch",
    "plan_dual_batch_by_speed",
    "probe_sizes",
    "proportional_split",
    "solve_plan",
]
