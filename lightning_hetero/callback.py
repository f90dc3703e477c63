"""HeteroCallback: measures, re-plans at boundaries, logs, checkpoints the controller."""

import math
import socket
import time
import warnings
from typing import TYPE_CHECKING, Any

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.loggers import TensorBoardLogger
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_only, rank_zero_warn
from typing_extensions import override

from lightning_hetero._lightning import settle_logged_metrics
from lightning_hetero.planning import RankStats, TimingSmoother, balance_efficiency
from lightning_hetero.planning.faults import RankIdentity, held_at_minimum, weights_for_new_world
from lightning_hetero.planning.split import is_count
from lightning_hetero.resources import ResourceMeter
from lightning_hetero.sampler import GlobalBatchSampler

if TYPE_CHECKING:
    from lightning_hetero.strategy import HeteroStrategy

__all__ = ["HeteroCallback"]

#: Version of the checkpointed state; bump when its layout changes and migrate the older
#: versions in ``_migrate`` (a checkpoint written by one release must load in the next).
#: 1: plan, controller, history, counters. 2: adds ``ranks`` (host, local rank, batch size
#: and throughput of each rank at the last boundary).
STATE_VERSION = 2


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
    state["version"] = STATE_VERSION
    return state


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
    state (plan, rank 0's controller, history, and each rank's host, local rank and
    throughput at the last boundary) is saved in checkpoints. A resume with the same world
    size continues the saved plan and controller; with another world size the plan is made
    anew, in proportion to the saved throughputs of the ranks that come back on the same
    host and local rank (see :func:`~lightning_hetero.planning.faults.weights_for_new_world`).

    A rank held at ``min_batch_size`` although its speed asks for less slows every step;
    the first boundary that finds one warns once (per rank) and suggests removing it
    (paper 001). ``history`` entries list such ranks under ``held_at_minimum``.

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
        self._identities: list[RankIdentity] = []
        self._samples_per_s: list[float] = []  # per rank, at the last boundary
        self._measured_batch_sizes: list[int] = []  # the batches those were measured on
        self._warned_minimum: set[int] = set()

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
        self._identities = self._gather_identities(strategy)
        if self._restored is not None:
            state, self._restored = self._restored, None
            if state["world_size"] == strategy.world_size:
                strategy.restore_plan(state["batch_sizes"])
                self._keep_saved_throughputs(state["ranks"])
                if state["controller_class"] == type(strategy.controller).__name__:
                    strategy.controller.load_state_dict(state["controller"])
                else:
                    rank_zero_warn(
                        f"The checkpoint was written with the {state['controller_class']}"
                        f" controller, this run uses {type(strategy.controller).__name__}: its"
                        " state starts fresh."
                    )
            else:
                self._restore_for_new_world(strategy, state)
            strategy.history[:] = state["history"]
            self._adjustments = state["adjustments"]
            self._batches = state.get("batches", 0)
        if self.tensorboard_layout:
            self._add_tensorboard_layout(trainer)

    @staticmethod
    def _gather_identities(strategy: "HeteroStrategy") -> list[RankIdentity]:
        """Every rank's host name and local rank, in global-rank order."""
        with strategy.guarded("the gather of host names"):
            rows = strategy.gather_objects((socket.gethostname(), strategy.local_rank))
        return [RankIdentity(str(host), int(local)) for host, local in rows]

    def _keep_saved_throughputs(self, saved: list[dict[str, Any]]) -> None:
        """Carry the saved measurements of ranks that run where they ran before, so that a
        checkpoint written before this run's first boundary still holds them."""
        if len(saved) != len(self._identities):
            return  # a version-1 state: nothing recorded
        same = [
            RankIdentity(r["host"], r["local_rank"]) == identity
            for r, identity in zip(saved, self._identities)
        ]
        self._samples_per_s = [
            float(r["samples_per_s"]) if kept else math.nan for r, kept in zip(saved, same)
        ]
        self._measured_batch_sizes = [int(r["batch_size"]) for r in saved]

    def _restore_for_new_world(self, strategy: "HeteroStrategy", state: dict[str, Any]) -> None:
        """Re-plan a checkpoint of another world size from its per-rank throughputs."""
        saved = state["ranks"]
        restored = weights_for_new_world(
            [RankIdentity(r["host"], r["local_rank"]) for r in saved],
            [r["samples_per_s"] for r in saved],
            self._identities,
        )
        strategy.restore_plan(state["batch_sizes"], weights=restored.weights)

        def where(rank: int) -> str:
            identity = self._identities[rank]
            return f"{rank} ({identity.host}:{identity.local_rank})"

        matched = ", ".join(
            f"{where(new)} <- saved rank {old}" for new, old in restored.matched.items()
        )
        if restored.uniform:
            how = (
                "no rank could be matched with a saved throughput (by host and local rank), so"
                " every rank starts with an equal share"
            )
        else:
            how = f"ranks matched by host and local rank: {matched}; the plan follows their saved"
            how += " throughputs"
            if restored.fallback:
                fallback = ", ".join(where(rank) for rank in restored.fallback)
                how += f", and ranks {fallback} without one get their mean"
        rank_zero_warn(
            f"hetero: the checkpoint was written by {state['world_size']} ranks, this run has"
            f" {strategy.world_size}: {how}. The controller's state ({state['controller_class']})"
            " starts fresh."
        )

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
        settle_logged_metrics(trainer)  # Lightning's metric syncs before any collective of ours
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
        # Async mode, rank 0: the server's view of the epoch, taken before the all-gather;
        # once that completes, the other ranks may push the next epoch's first updates.
        server_stats = strategy.server.take_epoch_stats() if strategy.server is not None else {}
        with strategy.guarded("the boundary's all-gather"):
            rows = strategy.gather_rows(
                [s.batch_size, s.compute_s, s.wait_s, s.steps, drawn] + list(readings)
            )
        measured = [int(row[0]) for row in rows]
        compute_s = [row[1] for row in rows]
        wait_s = [row[2] for row in rows]
        first_undrawn_step = int(max(row[4] for row in rows))
        counts = updates or [None] * len(rows)
        self._samples_per_s = [
            b / t if math.isfinite(t) and t > 0 else math.nan for b, t in zip(measured, compute_s)
        ]
        self._measured_batch_sizes = measured
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
            entry["held_at_minimum"] = self._check_minimum(strategy)
        entry["next_batch_sizes"] = strategy.batch_sizes
        entry.update(server_stats)
        entry["boundary_s"] = time.perf_counter() - started
        strategy.history.append(entry)
        self._log(trainer, entry)

    def _check_minimum(self, strategy: "HeteroStrategy") -> list[int]:
        """Ranks the new plan holds at their minimum though slower; warns once per rank."""
        assert strategy.limits is not None
        if strategy.dual_plan is not None:
            return []  # the dual plan fixes every rank's batch on purpose
        lower = strategy.limits.min_batch_size
        held = held_at_minimum(strategy.batch_sizes, self._samples_per_s, lower)
        for rank in held:
            if rank in self._warned_minimum:
                continue
            self._warned_minimum.add(rank)
            total = strategy.limits.global_batch_size
            speed, all_speed = self._samples_per_s[rank], sum(self._samples_per_s)
            rank_zero_warn(
                f"hetero: rank {rank} is held at min_batch_size={lower[rank]}, but at its measured"
                f" speed ({speed:.1f} of all ranks' {all_speed:.1f} samples/s) its share of the"
                f" global batch of {total} would be {total * speed / all_speed:.1f} samples. It"
                " slows every step whatever the plan: consider removing it from the job"
                " (paper 001)."
            )
        return held

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
            "ranks": [
                {
                    "host": identity.host,
                    "local_rank": identity.local_rank,
                    "batch_size": batch_size,
                    "samples_per_s": speed,
                }
                for identity, batch_size, speed in zip(
                    self._identities,
                    self._measured_batch_sizes or strategy.batch_sizes,
                    self._samples_per_s or [math.nan] * strategy.world_size,
                )
            ],
        }

    @override
    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        if not state_dict:
            return
        self._restored = _migrate(state_dict)
