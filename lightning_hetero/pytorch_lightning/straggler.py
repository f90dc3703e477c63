# Generated from lightning_hetero/straggler.py by `make generate`; do not edit.  # ruff: noqa
# fmt: off
"""StragglerReport: which rank is slow, under an unchanged ``strategy="ddp"`` job."""

import math
import warnings
from collections.abc import Callable
from typing import Any

import pytorch_lightning as pl
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.data import extract_batch_size
from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_warn
from typing_extensions import override

from lightning_hetero._comm import CudaStepTimer, HostStepTimer, time_calls
from lightning_hetero.pytorch_lightning._lightning import (
    logging_step,
    settle_logged_metrics,
    time_sigterm_broadcast,
)
from lightning_hetero.collectives import Collectives
from lightning_hetero.modes.bsp import mark_grads_ready
from lightning_hetero.planning.stragglers import (
    MIN_GAP,
    RankTiming,
    Verdict,
    summarize_steps,
    verdict,
    with_latest_other_size,
)

__all__ = ["StragglerReport"]

#: The strategy's collectives a training step may call, timed as waiting by the report.
_STRATEGY_COLLECTIVES = ("reduce", "all_gather", "barrier", "broadcast")


class StragglerReport(Callback):
    """Report which rank sets the pace of the steps, and what ``HeteroStrategy`` would gain.

    Add it to any data-parallel job, ``Trainer(strategy="ddp", callbacks=[StragglerReport()])``;
    it changes nothing in training. Each rank times its own steps the way
    [`HeteroStrategy`][lightning_hetero.HeteroStrategy] does: a step's *compute* is everything
    on its training thread (loading the batch, forward, backward, optimizer) except waiting
    for other ranks; the *wait* runs from the moment its last gradient is ready (a hook after
    each parameter's gradient accumulation) until the backward's gradient all-reduce ends.
    So a rank that is slow in backward only, whose slowness DDP's all-reduce spreads over
    every rank's backward, still shows as the slow one.

    At each report (every epoch's end, or every ``every_n_steps`` training batches), the ranks
    all-gather one small row each (the only collective it adds, outside the steps) and then:

    * log per-rank ``hetero/compute_time/rank{k}``, ``hetero/wait_time/rank{k}`` (median and
      mean seconds per step) and ``hetero/throughput/rank{k}`` (samples per second of
      compute) to every attached logger, the tags ``HeteroStrategy`` logs (under it, the
      strategy logs them itself and the report adds its line only);
    * say in one line (rank 0) which rank sets the pace and by how much, and the step-time
      speedup over the uniform plan that the measured costs allow
      ([`allowed_speedup`][lightning_hetero.planning.model.allowed_speedup], the planner's
      own computation) with the plan that reaches it;
    * append ``{"epoch", "step", "compute_times", "wait_times", "pace_setter",
      "allowed_speedup", "slower_by", "plan", "batch_sizes", "steps"}`` to ``history`` on
      every rank (lists indexed by global rank; ``pace_setter`` is ``None`` when no rank is
      slower than the median of the others by more than the timing noise, three standard
      errors of the steps' spread, and by more than ``min_gap``).

    With one batch size per rank (plain DDP) the curves go through the origin; a second size
    timed in at least two steps (e.g. an epoch's short last batch, reported across epochs
    with ``every_n_steps``) adds a fixed per-step cost to the fit.

    Under FSDP (``ModelParallelStrategy``) gradients are not accumulated through the hook, so
    waits in the reduce-scatter count as compute; the report warns once when it saw no wait
    at all on a multi-rank job.

    Args:
        every_n_steps: report every this many training batches instead of at each epoch end.
        min_gap: how much slower than the median of the others (relative) a rank must be to
            be named the pace-setter, besides beyond the timing noise; ranks of equal speed on
            a shared machine differ by a few percent.
    """

    def __init__(self, every_n_steps: int | None = None, min_gap: float = MIN_GAP) -> None:
        if not 0.0 <= min_gap < 1.0:
            raise ValueError(f"StragglerReport(min_gap={min_gap}) must be in [0, 1).")
        self.min_gap = min_gap
        if every_n_steps is not None and (
            isinstance(every_n_steps, bool) or not isinstance(every_n_steps, int)
        ):
            raise TypeError(
                f"StragglerReport(every_n_steps=...) takes an int or None, got {every_n_steps!r}."
            )
        if every_n_steps is not None and every_n_steps < 1:
            raise ValueError(
                f"StragglerReport(every_n_steps={every_n_steps}) must be at least 1; leave it"
                " out (None) to report at each epoch end."
            )
        self.every_n_steps = every_n_steps
        #: One dict per report, on every rank (see the class docstring).
        self.history: list[dict[str, Any]] = []
        self._timer: HostStepTimer | None = None
        self._handles: list[Any] = []
        self._undo_broadcast: Callable[[], None] = lambda: None
        self._undo_collectives: Callable[[], None] = lambda: None
        self._steps: list[tuple[int, float, float]] = []
        #: this rank's latest report at each batch size, the most recent last
        self._by_size: dict[int, RankTiming] = {}
        self._batches = 0
        self._batch_size = 0
        self._warned_no_wait = False

    # ---------------------------------------------------------------- lifecycle
    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        cuda = pl_module.device.type == "cuda"
        self._timer = CudaStepTimer() if cuda else HostStepTimer()
        self._handles = mark_grads_ready(pl_module, self._timer.grads_ready)
        # Lightning's per-batch broadcast is where a rank waits for the others between the
        # batches of an accumulated step (no all-reduce there)
        self._undo_broadcast = time_sigterm_broadcast(trainer, self._timer.waiting)
        # and the strategy's collectives a step calls (`self.log(..., sync_dist=True)`,
        # `self.all_gather`): a rank waits there for the slower ones too
        self._undo_collectives = time_calls(
            trainer.strategy, _STRATEGY_COLLECTIVES, self._timer.waiting
        )
        self._steps, self._batches, self._by_size = [], 0, {}

    @override
    def on_fit_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._remove_hooks()

    @override
    def on_exception(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", exception: BaseException
    ) -> None:
        self._remove_hooks()

    def _remove_hooks(self) -> None:
        self._undo_broadcast()
        self._undo_collectives()
        self._undo_broadcast = self._undo_collectives = lambda: None
        for handle in self._handles:
            handle.remove()
        self._handles, self._timer = [], None

    # ---------------------------------------------------------------- timing
    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._timer is not None:
            self._timer.break_cycle()  # the time between epochs is no step's

    @override
    def on_validation_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._timer is not None:
            self._timer.break_cycle()  # validation is no training step's cost

    @override
    def on_train_batch_start(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int
    ) -> None:
        if self._timer is None:
            return
        with warnings.catch_warnings():
            warnings.simplefilter("ignore")  # an ambiguous batch: Lightning's logging says so
            try:
                self._batch_size = int(extract_batch_size(batch))
            except Exception:  # no tensor in the batch: throughput unknown
                self._batch_size = 0
        self._timer.start(self._batch_size)

    @override
    def on_after_backward(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._timer is not None:
            self._timer.backward_done()

    @override
    def on_train_batch_end(
        self,
        trainer: "pl.Trainer",
        pl_module: "pl.LightningModule",
        outputs: Any,
        batch: Any,
        batch_idx: int,
    ) -> None:
        timer = self._timer
        if timer is None:
            return
        timer.step_done()
        self._steps.extend((r.batch_size, r.compute_s, r.wait_s) for r in timer.collect() if r.full)
        self._batches += 1
        if self.every_n_steps is not None and self._batches % self.every_n_steps == 0:
            with timer.waiting():  # the next step's cycle holds it: count it as waiting
                self._report(trainer, pl_module, epoch_end=False)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        if self._timer is not None and self.every_n_steps is None:
            settle_logged_metrics(trainer)  # Lightning's metric syncs before our gather
            self._report(trainer, pl_module, epoch_end=True)

    # ---------------------------------------------------------------- the report
    def _report(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", epoch_end: bool
    ) -> None:
        assert self._timer is not None
        # the events of a CUDA step are read once complete; a report waits for the last ones
        self._steps.extend(
            (r.batch_size, r.compute_s, r.wait_s)
            for r in self._timer.collect(synchronize=True)
            if r.full
        )
        mine, self._steps = summarize_steps(self._steps), []
        # the latest report at another batch size, where the plan moved: a second point
        mine = with_latest_other_size(mine, self._by_size)
        rows = self._gather(trainer, pl_module, mine)
        decided = verdict(rows, min_gap=self.min_gap)
        entry = {
            "epoch": trainer.current_epoch,
            "step": trainer.global_step,
            "compute_times": [row.compute_s for row in rows],
            "wait_times": [row.wait_s for row in rows],
            "pace_setter": decided.pace_setter,
            "allowed_speedup": decided.allowed_speedup,
            "slower_by": decided.slower_by,
            "plan": decided.plan,
            "batch_sizes": [row.batch_size for row in rows],
            "steps": [row.steps for row in rows],
        }
        self.history.append(entry)
        if getattr(trainer.strategy, "replanner", None) is None:  # else the strategy logs them
            metrics = _metrics(rows)
            step = logging_step(trainer, epoch_end=epoch_end)
            for logger in trainer.loggers:
                logger.log_metrics(metrics=metrics, step=step)
        rank_zero_info(describe(entry, decided))
        self._check_waits(rows)

    @staticmethod
    def _gather(
        trainer: "pl.Trainer", pl_module: "pl.LightningModule", mine: RankTiming
    ) -> list[RankTiming]:
        comm = Collectives(trainer.global_rank, trainer.world_size, pl_module.device)
        return [_row(values) for values in comm.gather_rows(mine)]

    def _check_waits(self, rows: list[RankTiming]) -> None:
        if self._warned_no_wait or len(rows) < 2:
            return
        if all(row.steps > 0 and row.wait_s == 0.0 for row in rows):
            self._warned_no_wait = True
            rank_zero_warn(
                "StragglerReport: no rank measured any wait for the others, so waits are"
                " counted as compute and every rank looks as slow as the slowest. The strategy"
                " synchronizes gradients without accumulating them through the parameters'"
                " gradient hooks (e.g. FSDP); use HeteroFSDPStrategy, whose collectives are"
                " timed, to see each rank's compute."
            )


def _row(values: list[float]) -> RankTiming:
    steps, compute, se, wait, batch, other, other_compute = values
    return RankTiming(int(steps), compute, se, wait, int(batch), int(other), other_compute)


def _metrics(rows: list[RankTiming]) -> dict[str, float]:
    metrics: dict[str, float] = {}
    for rank, row in enumerate(rows):
        metrics[f"hetero/compute_time/rank{rank}"] = row.compute_s
        metrics[f"hetero/wait_time/rank{rank}"] = row.wait_s
        metrics[f"hetero/throughput/rank{rank}"] = (
            row.batch_size / row.compute_s if row.compute_s > 0 else math.nan
        )
    return metrics


def describe(entry: dict[str, Any], decided: Verdict) -> str:
    """The report's line: who sets the pace, by how much, and what re-planning allows."""
    where = f"StragglerReport (epoch {entry['epoch']}, step {entry['step']})"
    compute = entry["compute_times"]
    if not all(math.isfinite(t) for t in compute):
        untimed = [k for k, t in enumerate(compute) if not math.isfinite(t)]
        return f"{where}: no timed steps on rank(s) {untimed} since the last report."
    times = ", ".join(f"{t:.3g}" for t in compute)
    setter = decided.pace_setter
    if setter is None:
        said = f"no rank sets the pace beyond the timing noise (compute {times} s per step)"
    else:
        said = (
            f"rank {setter} sets the pace: its compute is {decided.slower_by:.2f}x the other"
            f" ranks' median (compute {times} s per step; waits"
            f" {', '.join(f'{w:.3g}' for w in entry['wait_times'])} s)"
        )
    if math.isfinite(decided.allowed_speedup):
        said += (
            f"; on these costs HeteroStrategy would be allowed"
            f" {decided.allowed_speedup:.2f}x faster steps than with the global batch of"
            f" {sum(entry['batch_sizes'])} split evenly,"
            f" with the plan {decided.plan}"
        )
    return f"{where}: {said}."
