"""HeteroCallback: measures, re-plans at boundaries, logs, checkpoints the controller."""

import math
import time
import warnings
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn
from typing_extensions import override

from lightning_hetero.planning import RankStats, TimingSmoother, balance_efficiency
from lightning_hetero.resources import ResourceMeter
from lightning_hetero.sampler import GlobalBatchSampler

if TYPE_CHECKING:
    from lightning_hetero.strategy import HeteroStrategy

__all__ = ["HeteroCallback"]

#: Version of the checkpointed state; bump when its layout changes.
STATE_VERSION = 1


class HeteroCallback(Callback):
    """The measuring and deciding half of :class:`~lightning_hetero.HeteroStrategy`.

    After every training batch it folds this rank's step timings into an EWMA; at each
    boundary (epoch end, or every ``adjust_every`` batches) it all-gathers
    ``(b_k, compute_s, wait_s)`` and each rank's resource readings
    (:class:`~lightning_hetero.resources.ResourceMeter`) from every rank; rank 0 runs the
    strategy's controller and broadcasts the plan (so controllers need not be bit-for-bit
    deterministic across ranks), every rank applies it, appends a record to
    ``strategy.history`` and logs it to every attached logger:
    ``hetero/batch_size/rank{k}``, ``hetero/compute_time/rank{k}``,
    ``hetero/wait_time/rank{k}``, ``hetero/throughput/rank{k}``,
    ``hetero/memory_used/rank{k}``, ``hetero/balance`` and ``hetero/adjustments``. Its
    state (plan, rank 0's controller, history) is saved in checkpoints.

    The strategy attaches one automatically; pass your own instance in
    ``Trainer(callbacks=...)`` to change its options.

    Args:
        tensorboard_layout: add a TensorBoard custom-scalars layout that draws batch size,
            compute time, wait time and throughput of all ranks as one chart each.
    """

    def __init__(self, tensorboard_layout: bool = True) -> None:
        self.tensorboard_layout = tensorboard_layout
        self._smoother = TimingSmoother()
        self._batches = 0
        self._adjustments = 0
        self._restored: dict[str, Any] | None = None
        self._hetero: HeteroStrategy | None = None
        self._meter: ResourceMeter | None = None

    @property
    @override
    def state_key(self) -> str:
        return "HeteroCallback"

    # ---------------------------------------------------------------- lifecycle
    @staticmethod
    def _strategy(trainer: "pl.Trainer") -> "HeteroStrategy":
        from lightning_hetero.strategy import HeteroStrategy

        strategy = trainer.strategy
        if not isinstance(strategy, HeteroStrategy):
            raise TypeError(
                "HeteroCallback needs Trainer(strategy=HeteroStrategy(...)),"
                f" got {type(strategy).__name__}."
            )
        return strategy

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        strategy = self._hetero = self._strategy(trainer)
        self._smoother = TimingSmoother(strategy.smoothing)
        self._meter = ResourceMeter(strategy.root_device)
        if self._restored is not None:
            state, self._restored = self._restored, None
            strategy.restore_plan(state["batch_sizes"])
            if state["controller_class"] == type(strategy.controller).__name__:
                strategy.controller.load_state_dict(state["controller"])
            else:
                rank_zero_warn(
                    f"The checkpoint was written with the {state['controller_class']} controller,"
                    f" this run uses {type(strategy.controller).__name__}: its state starts fresh."
                )
            strategy.history[:] = state["history"]
            self._adjustments = state["adjustments"]
            self._batches = state.get("batches", 0)
        if self.tensorboard_layout:
            self._add_tensorboard_layout(trainer)

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._strategy(trainer).start_epoch()

    @override
    def on_train_batch_end(
        self,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        strategy = self._strategy(trainer)
        for batch_size, compute_s, wait_s in strategy._timer.collect():
            self._smoother.update(batch_size, compute_s, wait_s)
        self._batches += 1
        if strategy.adjust_every != "epoch" and self._batches % strategy.adjust_every == 0:
            self.boundary(trainer, strategy)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        strategy = self._strategy(trainer)
        if strategy.mode == "local":
            strategy.finish_epoch()  # local mode re-plans at each merge
            return
        if strategy.mode == "async":
            strategy.synchronize("the end of the epoch")  # every rank on the server's model
        if strategy.adjust_every == "epoch":
            for batch_size, compute_s, wait_s in strategy._timer.collect(synchronize=True):
                self._smoother.update(batch_size, compute_s, wait_s)
            self.boundary(trainer, strategy)

    # ---------------------------------------------------------------- the boundary
    def boundary(
        self,
        trainer: "pl.Trainer",
        strategy: "HeteroStrategy",
        updates: list[int] | None = None,
    ) -> None:
        """Gather every rank's measurements, re-plan on rank 0, apply the plan everywhere.

        ``updates``: each rank's model-update count since the last boundary, where ranks
        make different numbers of updates (local mode); the controller's ``RankStats`` get
        them. Must be called on every rank together.
        """
        sampler = strategy.sampler
        if sampler is None or strategy.limits is None:
            return
        started = time.perf_counter()
        s = self._smoother
        readings = self._meter.read() if self._meter is not None else (math.nan,) * 3
        # batches this rank's loader has drawn this epoch (local mode claims no fixed steps)
        drawn = sampler.cursor if isinstance(sampler, GlobalBatchSampler) else 0
        with strategy.guarded("the boundary's all-gather"):
            rows = strategy.gather_rows(
                [s.batch_size, s.compute_s, s.wait_s, s.steps, drawn] + list(readings)
            )
        measured = [int(row[0]) for row in rows]
        compute_s = [row[1] for row in rows]
        wait_s = [row[2] for row in rows]
        first_undrawn_step = int(max(row[4] for row in rows))
        counts = updates or [None] * len(rows)
        stats = [RankStats(row[5], row[6], row[7], counts[k]) for k, row in enumerate(rows)]
        plan = strategy.batch_sizes

        entry: dict[str, Any] = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "batch_sizes": plan,
            "compute_times": compute_s,
            "wait_times": wait_s,
            "memory_used": [r.memory_used for r in stats],
            "updates": updates,
            "balance": float("nan"),
            "changed": False,
        }
        no_timings = [rank for rank, row in enumerate(rows) if row[3] < 1]
        if no_timings:
            rank_zero_warn(
                f"hetero: ranks {no_timings} have no finite step timings since the last change;"
                f" keeping the plan {plan}."
            )
        elif measured != plan:
            rank_zero_info(
                "hetero: no timings at the current plan yet (the last change has not reached every"
                " rank's loader); keeping the plan until the next boundary."
            )
        elif not all(math.isfinite(t) and t > 0 for t in compute_s):
            rank_zero_warn(
                f"hetero: compute times {compute_s} are not all finite and positive; keeping the"
                f" plan {plan}."
            )
        else:
            entry["balance"] = balance_efficiency(plan, compute_s)
            decided = plan
            if strategy.global_rank == 0:
                decided = self._decide(strategy, plan, compute_s, stats)
            with strategy.guarded("the plan broadcast"):
                new_plan = strategy.broadcast_plan(decided)
            if new_plan != plan:
                strategy.apply_plan(new_plan, from_step=first_undrawn_step)
                self._adjustments += 1
                entry["changed"] = True
        entry["next_batch_sizes"] = strategy.batch_sizes
        if strategy.server is not None:  # async mode, rank 0: the server's view of the epoch
            entry.update(strategy.server.take_epoch_stats())
        entry["boundary_s"] = time.perf_counter() - started
        strategy.history.append(entry)
        self._log(trainer, entry)

    @staticmethod
    def _decide(
        strategy: "HeteroStrategy", plan: list[int], compute_s: list[float], stats: list[RankStats]
    ) -> list[int]:
        """Rank 0 runs the controller; its warnings are re-emitted once, and a failure
        becomes an all-zero plan so that every rank raises instead of waiting."""
        assert strategy.limits is not None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                new_plan = strategy.controller.update(plan, compute_s, strategy.limits, stats)
            except Exception as err:
                rank_zero_warn(f"hetero: the controller failed: {type(err).__name__}: {err}")
                new_plan = [0] * len(plan)
        for warning in caught:
            rank_zero_warn(str(warning.message))
        return new_plan

    def _log(self, trainer: "pl.Trainer", entry: dict[str, Any]) -> None:
        metrics: dict[str, float] = {}
        for rank, (b, t, w) in enumerate(
            zip(entry["batch_sizes"], entry["compute_times"], entry["wait_times"])
        ):
            metrics[f"hetero/batch_size/rank{rank}"] = float(b)
            metrics[f"hetero/compute_time/rank{rank}"] = t
            metrics[f"hetero/wait_time/rank{rank}"] = w
            metrics[f"hetero/throughput/rank{rank}"] = b / t if t > 0 else float("nan")
        for rank, used in enumerate(entry["memory_used"]):
            metrics[f"hetero/memory_used/rank{rank}"] = used
        for name in ("updates", "staleness", "staleness_max"):
            for rank, value in enumerate(entry.get(name) or []):
                metrics[f"hetero/{name}/rank{rank}"] = float(value)
        metrics["hetero/balance"] = entry["balance"]
        metrics["hetero/adjustments"] = float(self._adjustments)
        for logger in trainer.loggers:
            logger.log_metrics(metrics, step=trainer.global_step)

    @rank_zero_only
    def _add_tensorboard_layout(self, trainer: "pl.Trainer") -> None:
        charts = {
            "batch size per rank": ["Multiline", [r"hetero/batch_size/rank\d+"]],
            "compute time per rank (s)": ["Multiline", [r"hetero/compute_time/rank\d+"]],
            "wait time per rank (s)": ["Multiline", [r"hetero/wait_time/rank\d+"]],
            "throughput per rank (samples/s)": ["Multiline", [r"hetero/throughput/rank\d+"]],
            "memory in use per rank (fraction)": ["Multiline", [r"hetero/memory_used/rank\d+"]],
            "balance efficiency": ["Multiline", [r"hetero/balance"]],
            "updates per rank": ["Multiline", [r"hetero/updates/rank\d+"]],
            "staleness per rank (server versions)": ["Multiline", [r"hetero/staleness/rank\d+"]],
        }
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars({"hetero": charts})

    # ---------------------------------------------------------------- checkpoints
    @override
    def state_dict(self) -> dict[str, Any]:
        strategy = self._hetero
        if strategy is None or not strategy.batch_sizes:
            return {}
        return {
            "version": STATE_VERSION,
            "batch_sizes": strategy.batch_sizes,
            "world_size": strategy.world_size,
            "controller_class": type(strategy.controller).__name__,
            "controller": strategy.controller.state_dict(),
            "history": [dict(entry) for entry in strategy.history],
            "adjustments": self._adjustments,
            "batches": self._batches,
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        version = state_dict.get("version")
        if version != STATE_VERSION:
            raise ValueError(
                f"This checkpoint's HeteroCallback state has version {version}; this version of"
                f" lightning_hetero reads version {STATE_VERSION}. Upgrade lightning_hetero."
            )
        self._restored = dict(state_dict)
