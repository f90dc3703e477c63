"""HeteroCallback: the Lightning adapter of the re-planner (hooks, logging, checkpoints)."""

import re
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only
from lightning_utilities.core.rank_zero import rank_zero_warn
from typing_extensions import override

from lightning_hetero._lightning import (
    logging_step,
    logs_step_metrics,
    settle_logged_metrics,
    stash_loader_states,
    unstash_loader_states,
)
from lightning_hetero._logged_means import per_batch_means_message
from lightning_hetero.planning.split import is_count
from lightning_hetero.replan import Replanner
from lightning_hetero.summary import (
    fit_summary,
    quiet,
    summary_line,
    summary_metrics,
    summary_table,
)

__all__ = ["HeteroCallback"]

#: Version of the checkpointed state; bump when its layout changes and migrate the older
#: versions in ``_migrate`` (a checkpoint written by one release must load in the next).
#: 1: plan, controller, history, counters. 2: adds ``ranks`` (host, local rank, batch size
#: and throughput of each rank at the last boundary). 3: adds ``mode`` (what the training
#: mode's parts learned, e.g. local SGD's merge momentum; ``Mode.state_dict``).
STATE_VERSION = 3


def _migrate(state: dict[str, Any]) -> dict[str, Any]:
    """Bring a checkpointed state of any version this release reads to ``STATE_VERSION``.

    Raises:
        ValueError: the state is not a HeteroCallback state, or a newer release wrote it.
    """
    version = state.get("version")
    if not is_count(version):
        raise ValueError(
            f"This checkpoint's HeteroCallback state has no valid version (found {version!r});"
            f" lightning_hetero writes an integer from 1 to {STATE_VERSION}. Was it written by"
            " lightning_hetero?"
        )
    if version > STATE_VERSION:
        raise ValueError(
            f"This checkpoint's HeteroCallback state has version {version}, written by a newer"
            f" lightning_hetero; this release reads versions 1 to {STATE_VERSION}. Upgrade"
            " lightning_hetero to resume from it."
        )
    state = dict(state)
    if version == 1:
        state["ranks"] = []  # not recorded: a new world size falls back to a uniform plan
    if version < 3:
        state["mode"] = {}  # not recorded: the mode's parts start fresh
    state["version"] = STATE_VERSION
    return state


class HeteroCallback(Callback):
    """The Lightning face of ``Replanner``.

    It hands Lightning's training hooks to the strategy's re-planner (after every training
    batch the step timings are folded into an EWMA; at each boundary, an epoch end or every
    ``adjust_every`` batches, every rank's report is all-gathered, every rank runs the
    controller (a ``replicable`` one; otherwise rank 0 runs it and broadcasts the plan),
    applies the plan and appends a record to ``strategy.history``), logs records to every
    attached logger at Lightning's own step (an epoch boundary at the step of that epoch's
    ``on_epoch`` values; a boundary every N batches at once when it changed the plan,
    otherwise on the next batch whose values Lightning logs, ``Trainer(log_every_n_steps=...)``):
    ``hetero/batch_size/rank{k}``, ``hetero/compute_time/rank{k}``,
    ``hetero/wait_time/rank{k}``, ``hetero/throughput/rank{k}``,
    ``hetero/memory_used/rank{k}``, ``hetero/balance``, ``hetero/adjustments`` and, where
    plan changes are checked against the step time (``revert_slower``), ``hetero/step_time``
    (the measured wall time of a step) and ``hetero/reverts`` (changes undone), and saves
    the re-planner's state in checkpoints (plan, rank 0's controller, history, and each
    rank's host, local rank and throughput at the last boundary). A resume with the same
    world size continues the saved plan and controller; with another world size the plan is
    made anew, in proportion to the saved throughputs of the ranks that come back on the
    same host and local rank (see
    ``weights_for_new_world``).

    Every record's metrics also go into ``trainer.callback_metrics`` (on every rank, the
    boundaries not logged included), so Lightning's ``ModelCheckpoint(monitor=...)`` and
    ``EarlyStopping(monitor=...)`` can watch any of them, e.g. ``monitor="hetero/balance",
    mode="max"``. From the first epoch on: the epoch boundary runs in this callback's
    ``on_train_epoch_end``, and Lightning calls the monitoring callbacks' hooks after every
    other callback's (whatever the order of ``Trainer(callbacks=...)``), so where they check
    at the training epoch end, their default with validation once per epoch or none, they
    read that epoch's values. Where they check at validation end instead
    (``val_check_interval < 1``, ``check_val_every_n_epoch > 1``,
    ``ModelCheckpoint(save_on_train_epoch_end=False)``,
    ``EarlyStopping(check_on_train_epoch_end=False)``), they read the last boundary's values,
    the previous epoch's, and before the first boundary none: a validation then makes
    ModelCheckpoint and a strict EarlyStopping raise (the monitored key is missing). An
    ``adjust_every`` below the batches before the first validation puts a boundary first.

    A rank held at ``min_batch_size`` although its speed asks for less slows every step;
    the first boundary that finds one warns once (per rank) and suggests removing it
    (paper 001). ``history`` entries list such ranks under ``held_at_minimum``.

    The strategy attaches one automatically; pass your own instance in
    ``Trainer(callbacks=...)`` to change its options. It works with any strategy that has
    a ``replanner`` ([`HeteroStrategy`][lightning_hetero.HeteroStrategy]).

    Args:
        tensorboard_layout: add a TensorBoard custom-scalars layout that draws batch size,
            compute time, wait time and throughput of all ranks as one chart each.
    """

    def __init__(self, tensorboard_layout: bool = True) -> None:
        self.tensorboard_layout = tensorboard_layout
        self._layout_added = not tensorboard_layout
        self._restored: dict[str, Any] | None = None
        self._replanner: Replanner | None = None
        self._started = False  # this fit's `on_fit_start` ran
        self._epoch_end = False  # in `on_train_epoch_end`: Lightning logs there one step lower
        self._pending: dict[str, float] | None = None  # a record not logged yet (see `_log`)
        #: The last fit's summary (``lightning_hetero.summary.fit_summary``), on every rank.
        self.summary: dict[str, Any] | None = None
        self._means_said = False  # this fit told about per-batch means (`_say_per_batch_means`)

    @property
    @override
    def state_key(self) -> str:
        return "HeteroCallback"

    # ---------------------------------------------------------------- lifecycle
    @staticmethod
    def _replanner_of(trainer: "pl.Trainer") -> Replanner:
        replanner = getattr(trainer.strategy, "replanner", None)
        if not isinstance(replanner, Replanner):
            raise TypeError(
                "HeteroCallback needs Trainer(strategy=HeteroStrategy(...)),"
                f" got {type(trainer.strategy).__name__}."
            )
        return replanner

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        replanner = self._replanner_of(trainer)
        replanner.start()
        self._replanner, self._started = replanner, True
        self._pending = None
        self._means_said = False
        replanner.on_record = lambda entry: self._log(trainer, entry)
        if self._restored is not None:
            state, self._restored = self._restored, None
            replanner.load_state_dict(state)
        self._layout_added = not self.tensorboard_layout

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        self._started = False

    @override
    def on_train_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        """Say in one line (rank 0; nothing for a quiet run) and log what the re-planner did
        (``summary``). At the training's end, not the fit's: Lightning tears the strategy
        down before ``on_fit_end``, and the strategy then removes the callback it added."""
        replanner = self._replanner
        if replanner is None or not self._started:
            return
        replanner.land(next_epoch=True)  # a boundary whose all-gather is still in flight
        if not replanner.history:
            return
        history = replanner.history
        plan = list(getattr(trainer.strategy, "batch_sizes", None) or history[-1]["batch_sizes"])
        csv = next((lg for lg in trainer.loggers if isinstance(lg, CSVLogger)), None)
        where = csv.experiment.metrics_file_path if csv is not None else None
        self.summary = fit_summary(history, plan, where, adapts=replanner.controller.adapts)
        if not quiet(self.summary):
            rank_zero_info(summary_line(self.summary))
        # at the last boundary's epoch (after the loop, `current_epoch` is one past it)
        metrics = {**summary_metrics(self.summary), "epoch": history[-1]["epoch"]}
        for logger in trainer.loggers:
            logger.log_metrics(metrics=metrics, step=logging_step(trainer))
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_text("hetero/summary", summary_table(self.summary))

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._replanner_of(trainer).epoch_started()
        self._say_per_batch_means(trainer, getattr(trainer.strategy, "batch_sizes", None))

    @override
    def on_train_batch_end(
        self,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        replanner = self._replanner_of(trainer)
        replanner.batch_finished(trainer.current_epoch, trainer.global_step)
        if self._pending is not None and logs_step_metrics(trainer):
            started = time.thread_time()
            metrics, self._pending = self._pending, None
            self._send(trainer, metrics, logging_step(trainer))
            # the boundary's logging, deferred to this row: part of its cost
            replanner.charge(time.thread_time() - started)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        replanner = self._replanner_of(trainer)
        settle_logged_metrics(trainer)  # Lightning's metric syncs before any collective of ours
        self._epoch_end = True
        try:
            replanner.epoch_finished(trainer.current_epoch, trainer.global_step)
        finally:
            self._epoch_end = False

    # ---------------------------------------------------------------- logging
    def _say_per_batch_means(self, trainer: "pl.Trainer", plan: list[int] | None) -> None:
        """Once per fit, when ``plan`` first gives the ranks unequal batches: warn about the
        module's logged per-batch means (torchmetrics ``MeanMetric`` fed without a weight),
        which then differ from DDP's values (``lightning_hetero._logged_means``)."""
        if self._means_said or not plan or len(set(plan)) < 2:
            return
        self._means_said = True
        message = per_batch_means_message(trainer.lightning_module, list(plan))
        if message is not None:
            rank_zero_warn(message)

    def _log(self, trainer: "pl.Trainer", entry: dict[str, Any]) -> None:
        self._say_per_batch_means(trainer, entry.get("next_batch_sizes"))
        metrics = self._metrics(trainer, entry)
        # monitorable by ModelCheckpoint, EarlyStopping, ... like anything `self.log` logs
        trainer.callback_metrics.update({k: torch.tensor(v) for k, v in metrics.items()})
        if self._epoch_end or entry["changed"]:
            self._pending = None  # these values are newer
            self._send(trainer, metrics, logging_step(trainer, epoch_end=self._epoch_end))
        else:  # a boundary every N batches: on the next row Lightning logs, with its values
            self._pending = metrics

    def _send(self, trainer: "pl.Trainer", metrics: dict[str, float], step: int) -> None:
        # with the epoch, as Lightning's own rows: a CSV row without it drops out of a
        # `groupby("epoch")`
        metrics = {**metrics, "epoch": trainer.current_epoch}
        for logger in trainer.loggers:
            logger.log_metrics(metrics=metrics, step=step)
        if not self._layout_added:  # with the first metrics: it charts only what is logged
            self._layout_added = True
            self._add_tensorboard_layout(trainer, list(metrics))

    def _metrics(self, trainer: "pl.Trainer", entry: dict[str, Any]) -> dict[str, float]:
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
        if "deadband" in entry:
            metrics["hetero/deadband"] = entry["deadband"]
        replanner = self._replanner_of(trainer)
        metrics["hetero/adjustments"] = float(replanner.adjustments)
        if replanner.guard is not None:
            metrics["hetero/step_time"] = entry["step_time"]
            metrics["hetero/reverts"] = float(replanner.guard.reverts)
        return metrics

    @rank_zero_only
    def _add_tensorboard_layout(self, trainer: "pl.Trainer", names: list[str]) -> None:
        charts = {
            "batch size per rank": ["Multiline", [r"hetero/batch_size/rank\d+"]],
            "compute time per rank (s)": ["Multiline", [r"hetero/compute_time/rank\d+"]],
            "wait time per rank (s)": ["Multiline", [r"hetero/wait_time/rank\d+"]],
            "throughput per rank (samples/s)": ["Multiline", [r"hetero/throughput/rank\d+"]],
            "memory in use per rank (fraction)": ["Multiline", [r"hetero/memory_used/rank\d+"]],
            "balance efficiency": ["Multiline", [r"hetero/balance"]],
            "step time (s)": ["Multiline", [r"hetero/step_time"]],
            "plan changes and reverts": ["Multiline", [r"hetero/adjustments", r"hetero/reverts"]],
            "updates per rank": ["Multiline", [r"hetero/updates/rank\d+"]],
            "staleness per rank (server versions)": ["Multiline", [r"hetero/staleness/rank\d+"]],
        }
        charts = {
            title: chart
            for title, chart in charts.items()
            if any(re.fullmatch(pattern, name) for pattern in chart[1] for name in names)
        }
        for logger in trainer.loggers:
            if isinstance(logger, TensorBoardLogger):
                logger.experiment.add_custom_scalars({"hetero": charts})

    # ---------------------------------------------------------------- checkpoints
    @override
    def on_save_checkpoint(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", checkpoint: dict[str, Any]
    ) -> None:
        # the training loader's position under a key of its own: the checkpoint resumes
        # under "ddp", "auto" or one device too, whose loops would refuse it
        stash_loader_states(checkpoint)

    @override
    def on_load_checkpoint(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", checkpoint: dict[str, Any]
    ) -> None:
        unstash_loader_states(checkpoint)  # before Lightning restores the loops

    @override
    def state_dict(self) -> dict[str, Any]:
        state = self._replanner.state_dict() if self._replanner is not None else {}
        return {"version": STATE_VERSION, **state} if state else {}

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        if self._replanner is not None and self._started:
            # strategies that restore after set-up (FSDP's) do it after `on_fit_start`
            self._replanner.load_state_dict(_migrate(state_dict))
        else:
            self._restored = _migrate(state_dict)
