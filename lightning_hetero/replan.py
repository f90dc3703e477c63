"""The re-planner: measure each rank, decide one plan, apply it everywhere, keep the history.

One ``Replanner`` belongs to each strategy. It folds every training step's timings into
robust per-rank statistics ([`TimingSmoother`][lightning_hetero.planning.TimingSmoother]); at a
boundary (an epoch end, every ``adjust_every`` batches, or when a mode calls its
``replan``, e.g. at each local-SGD merge) it all-gathers one ``RankReport`` per
rank, runs the controller (on every rank, or on rank 0, which broadcasts the plan), applies
it through the mode and records a history entry. At boundaries every ``adjust_every``
batches of a lock-step mode the all-gather overlaps training: each boundary decides on the
reports the one before sent. No Lightning here: the callback feeds it Lightning's hooks and
logs what it records.
"""

import math
import socket
import time
import warnings
from collections import deque
from collections.abc import Callable, Sequence
from dataclasses import dataclass, fields
from statistics import fmean
from typing import Any, Literal

from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_warn

from lightning_hetero.context import RunContext
from lightning_hetero.modes.base import Mode
from lightning_hetero.planning import (
    BatchLimits,
    Controller,
    RankStats,
    StepTimeGuard,
    TimingSmoother,
    balance_efficiency,
)
from lightning_hetero.planning.base import Deadband, check_deadband, noise_deadband
from lightning_hetero.planning.faults import RankIdentity, held_at_minimum, weights_for_new_world
from lightning_hetero.planning.split import is_count, plan_checksum, proportional_split
from lightning_hetero.resources import ResourceMeter

__all__ = ["RankReport", "Replanner", "check_replan_options", "held_reason", "waits_unseen"]

#: Batches between two readings of the step timer outside boundaries.
_COLLECT_EVERY = 64
#: Seconds between two readings of the host's (and device's) memory and idle CPU: slow to
#: change, and a reading costs about 0.1 ms, a large part of a boundary every step or two.
_READ_EVERY_S = 1.0
#: The ``smoothing`` option's default: any other value is warned about (it has no effect).
SMOOTHING_DEFAULT = 0.8
#: The ``replan_budget`` option's default: boundaries every ``adjust_every`` batches take at
#: most this share of the training time.
REPLAN_BUDGET_DEFAULT = 0.0025
#: ``first_boundary="auto"``: the first epoch's early boundary comes after this many
#: batches, in an epoch of at least ``_EARLY_EPOCH_FACTOR`` times as many.
EARLY_BOUNDARY_BATCHES = 8
_EARLY_EPOCH_FACTOR = 2
#: A boundary's cost is the mean of a rank's last this many (a mean, so that the odd slow
#: boundary counts as it does in wall time).
_COSTS_KEPT = 8
#: ``replan_budget`` spreads boundaries to at most this many times ``adjust_every`` batches.
_MAX_SPREAD = 32
#: A plan kept at a balance below this is explained, at most every that many boundaries.
_SAY_HELD_BELOW = 0.9
_SAY_HELD_EVERY = 20


@dataclass
class _Sent:
    """A boundary whose report is on its way (``rows`` waits for every rank's)."""

    epoch: int
    step: int
    epoch_batches: int  # the epoch's batches when it was sent
    extra: dict[str, Any]  # the mode's figures (``boundary_stats``)
    rows: Callable[[], list[list[float]]]
    sent_s: float  # seconds spent sending it (the report and the gather or its start)
    gather_s: float  # of those, in the gather
    sent_cpu_s: float = 0.0  # this thread's CPU seconds in sending it


def check_replan_options(
    deadband: Deadband,
    smoothing: float,
    adjust_every: Literal["epoch"] | int,
    replan_budget: float | None = REPLAN_BUDGET_DEFAULT,
    first_boundary: Literal["auto"] | int | None = "auto",
) -> None:
    """Refuse bad re-planning options at construction."""
    check_deadband(deadband)
    if not 0.0 <= smoothing < 1.0:
        raise ValueError(f"`smoothing` must be in [0, 1), got {smoothing}.")
    if smoothing != SMOOTHING_DEFAULT:
        rank_zero_warn(
            f"hetero: `smoothing={smoothing}` has no effect: each rank's step time is now the"
            " median of every step since the plan last changed, and its noise the standard"
            " error of that median (docs: How it works, Statistics). Leave `smoothing` out; it"
            " will be removed.",
            category=FutureWarning,
        )
    if adjust_every != "epoch" and not is_count(adjust_every):
        raise ValueError(
            f"`adjust_every` must be 'epoch' or an integer >= 1, got {adjust_every!r}."
        )
    if first_boundary not in ("auto", None) and not is_count(first_boundary):
        raise ValueError(
            "`first_boundary` must be 'auto', an integer >= 1 (batches into the first epoch)"
            f" or None, got {first_boundary!r}."
        )
    if is_count(first_boundary) and adjust_every != "epoch":
        raise ValueError(
            f"`first_boundary={first_boundary}` adds a boundary to the first epoch under"
            f" `adjust_every='epoch'`; with `adjust_every={adjust_every!r}` boundaries already"
            " come every few batches: leave `first_boundary` out."
        )
    if replan_budget is not None and (
        isinstance(replan_budget, bool)
        or not isinstance(replan_budget, (int, float))
        or not 0.0 < replan_budget < 1.0
    ):
        raise ValueError(
            "`replan_budget` must be a share of the training time in (0, 1), e.g. 0.01, or"
            f" None (a boundary every `adjust_every` batches whatever it costs), got"
            f" {replan_budget!r}."
        )


@dataclass(frozen=True)
class RankReport:
    """What one rank reports at a boundary (all-gathered as one row of floats)."""

    #: The batch size its timings were measured at (0: none yet).
    batch_size: int
    #: Smoothed compute seconds per step, and seconds waiting for other ranks per step.
    compute_s: float
    wait_s: float
    #: Steps in the smoothed timings (0: no finite timings since the last change).
    steps: int
    #: Batches its loader has drawn this epoch (a plan may change only after them).
    drawn: int
    #: Side readings, see [`RankStats`][lightning_hetero.planning.RankStats].
    memory_used: float
    cpu_available: float
    memory_available: float
    #: ``plan_checksum`` of the plan in force on this rank (ranks must agree).
    plan_check: int = 0
    #: Standard error of ``compute_s`` (its noise), seconds.
    compute_se: float = math.nan
    #: Mean wall time of a step (compute plus wait) since the last change, and its standard
    #: error, seconds.
    step_s: float = math.nan
    step_se: float = math.nan
    #: Steps in ``step_s``.
    step_n: int = 0
    #: CPU seconds of its training thread in its latest boundaries (the mean of the last few;
    #: 0: none yet): the boundary's own work, without waits.
    boundary_s: float = 0.0

    @staticmethod
    def columns(rows: Sequence[Sequence[float]]) -> dict[str, list[Any]]:
        """Gathered rows as one typed list per field, in rank order (cheap for many ranks)."""
        return {
            f.name: list(map(kind, column))
            for f, kind, column in zip(fields(RankReport), _FIELD_KINDS, zip(*rows))
        }

    def row(self) -> list[float]:
        """This report as one row of floats."""
        return [float(getattr(self, name)) for name in _FIELD_NAMES]


#: The type of each field of a report, in order (a row holds them all as floats).
_FIELD_KINDS = tuple(int if f.type in (int, "int") else float for f in fields(RankReport))
_FIELD_NAMES = tuple(f.name for f in fields(RankReport))


def early_boundary_batch(first_boundary: Literal["auto"] | int, steps: int) -> int | None:
    """The batch of an epoch of ``steps`` batches after which ``first_boundary`` puts the
    first epoch's early boundary (``None``: none, the epoch is too short).

    Example:
        >>> early_boundary_batch("auto", 64), early_boundary_batch("auto", 15)
        (8, None)
        >>> early_boundary_batch(3, 5), early_boundary_batch(5, 5)
        (3, None)
    """
    if first_boundary == "auto":
        first_boundary = EARLY_BOUNDARY_BATCHES
        if steps < _EARLY_EPOCH_FACTOR * first_boundary:
            return None
    return first_boundary if first_boundary < steps else None


class Replanner:
    """Boundaries: gather reports, decide (every rank, or rank 0 and broadcast), apply, record.

    The strategy builds it with its training mode and binds it to the run's
    [`RunContext`][lightning_hetero.context.RunContext] at set-up (``bind``); the re-planner
    then applies each plan itself (``apply_plan``) and calls the mode's hooks, never the
    strategy.

    Args:
        training_mode: the training mode; its ``controller`` decides the next plan from the
            reports.
        smoothing: the strategy's ``smoothing`` option (no effect: timings are medians of
            every step since the last change, see
            [`TimingSmoother`][lightning_hetero.replan.TimingSmoother]).
        adjust_every: re-plan at each ``"epoch"`` end or every N training batches.
        guard: checks each plan change against the measured step time and reverts one that
            made steps slower (lock-step modes; ``None``: changes are kept unchecked).
        replan_budget: with ``adjust_every`` a number, the largest share of the training time
            that boundaries may take: where a boundary costs more than that share of the
            ``adjust_every`` steps before it (short steps), boundaries come every multiple of
            ``adjust_every`` batches that keeps them within it (every rank decides the same,
            on the gathered reports). ``None``: every ``adjust_every`` batches.
        first_boundary: with ``adjust_every="epoch"``, one boundary this many batches into
            the first epoch of a fit that has measured nothing yet, so that epoch's rest
            already runs a measured plan (modes that take it: ``Mode.early_boundary``);
            ``"auto"``: after ``EARLY_BOUNDARY_BATCHES`` batches, in an epoch of at least
            twice as many; ``None``: none.
    """

    def __init__(
        self,
        training_mode: Mode,
        smoothing: float,
        adjust_every: Literal["epoch"] | int,
        guard: StepTimeGuard | None = None,
        replan_budget: float | None = None,
        first_boundary: Literal["auto"] | int | None = None,
    ) -> None:
        self.training_mode = training_mode
        self.first_boundary = first_boundary
        #: The batch of this epoch after which the early boundary comes (``None``: none).
        self._early_at: int | None = None
        self.context: RunContext | None = None
        self.smoothing = smoothing
        self.adjust_every = adjust_every
        self.guard = guard
        self.replan_budget = replan_budget
        #: Batches between two boundaries now: ``adjust_every``, or a multiple of it that keeps
        #: boundaries within ``replan_budget``.
        self.interval: int | None = None if adjust_every == "epoch" else adjust_every
        self._boundary_costs: deque[float] = deque(maxlen=_COSTS_KEPT)  # this rank's latest
        self._said_spread = False
        #: One entry per boundary (see [Logging and plots](../logging.md) for its keys).
        self.history: list[dict[str, Any]] = []
        #: Called with each new history entry (the callback logs it).
        self.on_record: Callable[[dict[str, Any]], None] | None = None
        self.adjustments = 0
        self.batches = 0
        #: Training batches since the epoch started, or this fit resumed inside it: Lightning
        #: runs the same batches on every rank, so every rank holds the same count.
        self._epoch_batches = 0
        self._smoother = TimingSmoother()
        self._meter: ResourceMeter | None = None
        self._identities: list[RankIdentity] = []
        self._samples_per_s: list[float] = []  # per rank, at the last boundary
        self._measured_batch_sizes: list[int] = []  # the batches those were measured on
        self._warned_minimum: set[int] = set()
        self._warned_unseen = False
        self._model_key: tuple[int, ...] | None = None  # see `_model_changed`
        self._params_of: tuple[Any, list[Any]] | None = None  # the module, its parameters
        self._held_said_at: int | None = None  # the boundary `_say_held` last spoke at
        self._in_flight: _Sent | None = None  # see `_overlaps`
        self._said_unmeasured = False

    @property
    def controller(self) -> Controller:
        """The controller that decides each plan (the mode's)."""
        return self.training_mode.controller

    @property
    def ctx(self) -> RunContext:
        """The run this re-planner is bound to."""
        if self.context is None:
            raise RuntimeError("hetero: the re-planner is not bound to a run yet (see `bind`).")
        return self.context

    def bind(self, context: RunContext) -> None:
        """Work in ``context`` (a run's set-up), and let the mode re-plan through
        ``merge_boundary``."""
        self.context = context
        self.training_mode.bind(context, self.merge_boundary)

    def apply_plan(self, batch_sizes: Sequence[int], from_step: int | None = None) -> None:
        """Switch every rank to ``batch_sizes`` from training step ``from_step`` of this epoch
        (``None``: from the next epoch). Call on every rank with the same arguments."""
        ctx = self.ctx
        plan = ctx.plan_state.checked(batch_sizes, ctx.world_size)
        self.training_mode.apply_plan(plan, from_step)
        ctx.plan_state.plan = plan

    def merge_boundary(self, updates: list[int] | None) -> None:
        """A boundary the mode calls (local SGD's merge), where training is now."""
        epoch, global_step = self.ctx.position()
        self.boundary(epoch, global_step, updates)

    # ---------------------------------------------------------------- the run
    def start(self) -> None:
        """A fit starts: fresh smoothing and meter, every rank's host and local rank."""
        ctx = self.ctx
        self._smoother = TimingSmoother()
        self._meter = ResourceMeter(ctx.device, min_interval_s=_READ_EVERY_S)
        self._epoch_batches = 0  # a resume inside an epoch gets no `epoch_started`
        self._in_flight = None
        self._said_unmeasured = False
        self.interval = None if self.adjust_every == "epoch" else self.adjust_every
        self._boundary_costs.clear()
        self._said_spread = False
        with ctx.comm.guarded("the gather of host names"):
            rows = ctx.comm.gather_objects((socket.gethostname(), ctx.local_rank))
        self._identities = [RankIdentity(str(name), int(local)) for name, local in rows]

    def _collect(self, synchronize: bool = False) -> None:
        for record in self.ctx.timer.collect(synchronize=synchronize):
            self._smoother.update(*record)

    def epoch_started(self) -> None:
        """An epoch of training starts."""
        self._epoch_batches = 0
        self._early_at = self._early_boundary()
        self._params_of = None  # listed again at the next boundary
        self.ctx.timer.break_cycle()  # the time between epochs is no step's
        self.training_mode.on_train_epoch_start()

    def _early_boundary(self) -> int | None:
        """The batch after which this epoch has its early boundary (``first_boundary``): the
        first epoch of a fit with nothing measured yet (no boundary so far, none restored),
        under ``adjust_every="epoch"``, in a mode that takes one (``Mode.early_boundary``).
        Every rank decides the same: the epoch's length and the history are the same
        everywhere."""
        first, mode = self.first_boundary, self.training_mode
        if first is None or self.adjust_every != "epoch" or self.history:
            return None
        if not mode.early_boundary() or mode.sampler is None:
            return None
        return early_boundary_batch(first, len(mode.sampler))

    def batch_finished(self, epoch: int, global_step: int) -> None:
        """A training batch ended: a boundary every ``interval`` batches (``adjust_every``, or
        a multiple of it within ``replan_budget``).

        Timings are folded in at boundaries (``report``) and every
        ``_COLLECT_EVERY`` batches, which keeps the timer's pending steps few without
        per-step work."""
        self.batches += 1
        self._epoch_batches += 1
        if self.batches % _COLLECT_EVERY == 0:
            self._collect()
        if self._early_at is not None and self._epoch_batches == self._early_at:
            self._early_at = None
            with self.ctx.timer.waiting():
                self._collect(synchronize=True)
                self.boundary(epoch, global_step)
            return
        if self.interval is not None and self.batches % self.interval == 0:
            with self.ctx.timer.waiting():  # the same on every rank: not the next step's cost
                if self._overlaps:
                    self._overlapped_boundary(epoch, global_step)
                else:
                    self.boundary(epoch, global_step)

    @property
    def _overlaps(self) -> bool:
        """Whether boundaries every ``adjust_every`` batches overlap their all-gather with
        training: several ranks that step together (so every rank draws one batch per
        batch trained, and the step no rank has drawn yet is known one boundary later) and
        a controller every rank runs (no broadcast to wait for)."""
        return (
            self.ctx.world_size > 1
            and self.training_mode.steps_together
            and self.controller.replicable
        )

    def _overlapped_boundary(self, epoch: int, global_step: int) -> None:
        """Decide on the previous boundary's reports (their all-gather has had
        ``adjust_every`` batches to arrive), then send this one's: a blocking gather per
        boundary would cost a large part of a short step (issue 42)."""
        if self.training_mode.sampler is None or self.ctx.plan_state.limits is None:
            return
        self.land()
        self._in_flight = self._send(epoch, global_step, overlap=True)

    def land(self, next_epoch: bool = False) -> None:
        """Decide on the boundary whose all-gather is in flight, if any (every rank
        together). ``next_epoch``: the epoch's batches are over, so its plan applies from
        the next epoch."""
        sent, self._in_flight = self._in_flight, None
        if sent is not None:
            self._settle(sent, None, next_epoch)

    def epoch_finished(self, epoch: int, global_step: int) -> None:
        """The epoch's batches are over: the mode's epoch end, then an epoch boundary.

        No boundary when this fit trained no batch of the epoch: a resume from a checkpoint
        written by validation after the epoch's last batch ends that epoch at once, with
        nothing measured (every rank alike: the count is Lightning's, not a timing)."""
        self.land(next_epoch=True)
        if (
            self.training_mode.on_train_epoch_end()
            and self.adjust_every == "epoch"
            and self._epoch_batches > 0
        ):
            self._collect(synchronize=True)
            self.boundary(epoch, global_step)

    # ---------------------------------------------------------------- the boundary
    def report(self) -> RankReport:
        """This rank's report for the boundary now, on the timings folded in so far (``_send``
        folds the pending ones first, outside the boundary's measured cost)."""
        s = self._smoother
        s.mark()
        readings = self._meter.read() if self._meter is not None else (math.nan,) * 3
        drawn = self.training_mode.drawn_steps()
        check = plan_checksum(self.ctx.plan_state.batch_sizes)
        return RankReport(
            s.batch_size, s.compute_s, s.wait_s, s.steps, drawn, *readings, check,
            s.compute_se, s.step_s, s.step_se, s.step_count,
            fmean(self._boundary_costs) if self._boundary_costs else 0.0,
        )  # fmt: skip

    def boundary(self, epoch: int, global_step: int, updates: list[int] | None = None) -> None:
        """Gather every rank's report, re-plan on rank 0, apply the plan everywhere.

        ``global_step``: the trainer's optimizer steps so far (the history's ``step``).

        ``updates``: each rank's model-update count since the last boundary, where ranks
        make different numbers of updates (local mode); the controller's ``RankStats`` get
        them. Must be called on every rank together.
        """
        if self.training_mode.sampler is None or self.ctx.plan_state.limits is None:
            return
        self._settle(self._send(epoch, global_step), updates)

    def _send(self, epoch: int, global_step: int, overlap: bool = False) -> _Sent:
        """This rank's report, gathered from every rank (``overlap``: on its way)."""
        # the steps' timings are folded in every few batches whatever the boundaries: that
        # is the steps' cost, not the boundary's (`boundary_s`, which `replan_budget` bounds)
        self._collect()
        started, cpu_started = time.perf_counter(), time.thread_time()
        report = self.report()
        extra = self.training_mode.boundary_stats()  # before the gather (see the mode)
        comm = self.ctx.comm
        with comm.guarded("the boundary's all-gather"):
            gather_started = time.perf_counter()
            if overlap:
                rows = comm.start_gather_rows(report.row())
            else:
                gathered = comm.gather_rows(report.row())  # waiting for the last rank too
                rows = lambda: gathered  # noqa: E731
            ended = time.perf_counter()
        return _Sent(
            epoch, global_step, self._epoch_batches, extra, rows, ended - started,
            ended - gather_started, time.thread_time() - cpu_started,
        )  # fmt: skip

    def _settle(
        self, sent: _Sent, updates: list[int] | None = None, next_epoch: bool = False
    ) -> None:
        """Wait for ``sent``'s reports, decide, apply the plan from a step no rank has drawn
        (``next_epoch``: from the next epoch) and record the boundary."""
        ctx, state = self.ctx, self.ctx.plan_state
        started, cpu_started = time.perf_counter(), time.thread_time()
        with ctx.comm.guarded("the boundary's all-gather"):
            rows = sent.rows()
        gather_s = sent.gather_s + time.perf_counter() - started
        epoch, global_step, extra = sent.epoch, sent.step, sent.extra
        got = RankReport.columns(rows)
        self._check_same_plan(got["plan_check"])
        measured, compute_s = got["batch_size"], got["compute_s"]
        # each rank has drawn one batch per batch trained since it sent its report
        drawn = max(got["drawn"]) + self._epoch_batches - sent.epoch_batches
        first_undrawn_step = None if next_epoch else drawn
        counts = updates or [None] * len(measured)
        self._samples_per_s = [
            b / t if math.isfinite(t) and t > 0 else math.nan for b, t in zip(measured, compute_s)
        ]
        self._measured_batch_sizes = measured
        readings = (got["memory_used"], got["cpu_available"], got["memory_available"])
        stats = list(map(RankStats, *readings, counts, got["compute_se"]))
        plan = state.batch_sizes
        entry: dict[str, Any] = {
            "epoch": epoch,
            "step": global_step,
            "batch_sizes": plan,
            "compute_times": compute_s,
            "wait_times": got["wait_s"],
            "memory_used": got["memory_used"],
            "updates": updates,
            "balance": float("nan"),
            "changed": False,
            "step_time": _mean_finite(got["step_s"]),
            "reverted": False,
        }
        no_timings = [rank for rank, steps in enumerate(got["steps"]) if steps < 1]
        if no_timings:
            rank_zero_warn(
                f"hetero: ranks {no_timings} have no finite step timings since the last change;"
                f" keeping the plan {plan}."
            )
        elif measured != plan:
            if not self._said_unmeasured:  # after every change at short intervals: once
                self._said_unmeasured = True
                rank_zero_info(
                    "hetero: no timings at the current plan yet (the last change has not reached"
                    " every rank's loader); keeping the plan until a boundary has measured it."
                    " (Said once per fit; the fit summary counts these holds.)"
                )
        elif not all(math.isfinite(t) and t > 0 for t in compute_s):
            rank_zero_warn(
                f"hetero: compute times {compute_s} are not all finite and positive; keeping the"
                f" plan {plan}."
            )
        else:
            self._check_waits_seen(got["step_s"], got["wait_s"])
            entry["balance"] = balance_efficiency(plan, compute_s)
            if self._model_changed() and self._guard_in_force is not None:
                self._guard_in_force.restart()
                rank_zero_info(
                    "hetero: the trainable parameters or the optimizer's parameter groups"
                    f" changed (steps now take {entry['step_time']:.4g} s under {plan}): that"
                    " step time is the new reference, and no plan is judged against the times"
                    " before."
                )
            back = self._review(plan, got["step_s"], got["step_se"], min(got["step_n"]), compute_s)
            if self.controller.replicable:  # every rank decides: no broadcast
                new_plan = self._checked(self._decide(plan, compute_s, stats))
            else:
                decided = self._decide(plan, compute_s, stats) if ctx.rank == 0 else plan
                with ctx.comm.guarded("the plan broadcast"):
                    decided = ctx.comm.broadcast_ints(decided)
                new_plan = self._checked(decided)  # not in the guard: the broadcast worked
            wanted = new_plan
            deadband = getattr(self.controller, "deadband", None)
            if deadband is not None:
                entry["deadband"] = noise_deadband(deadband, compute_s, stats)
            if back is not None:
                new_plan, entry["reverted"] = back, True
                self.controller.plan_imposed(back)  # its bounds must not force `plan` again
                before = self.guard.baseline if self.guard is not None else None
                was = f", {before.step_s:.4g} s under {back} before" if before else ""
                rank_zero_info(
                    f"hetero: steps took {entry['step_time']:.4g} s under {plan}{was}; going"
                    f" back to {back}. (The step-time guard, `revert_slower`, reverts a"
                    " change measured slower unless every rank's time per sample rose as"
                    " much, which the load, not the plan, explains.)"
                )
            elif self._guard_in_force is not None:
                new_plan = self._guard_in_force.propose(plan, new_plan)
            if new_plan != plan:
                self.apply_plan(new_plan, from_step=first_undrawn_step)
                self.adjustments += 1
                entry["changed"] = True
            elif entry["balance"] < _SAY_HELD_BELOW and self.controller.adapts:
                self._say_held(plan, wanted, entry)
            entry["held_at_minimum"] = self._check_minimum()
        entry["next_batch_sizes"] = state.batch_sizes
        entry.update(extra)
        entry["boundary_s"] = sent.sent_s + time.perf_counter() - started
        entry["gather_s"] = gather_s
        self.history.append(entry)
        if self.on_record is not None:
            self.on_record(entry)
        # what `replan_budget` bounds: the boundary's own work, logging included, in this
        # thread's CPU time: not the wait for the last rank (a blocking gather's would be
        # spent in the next step anyway), nor time other processes had the core (ranks that
        # share cores, as emulated clusters do)
        self._boundary_costs.append(sent.sent_cpu_s + time.thread_time() - cpu_started)
        self._spread(got["boundary_s"], got["step_s"])
        entry["interval"] = self.interval

    def charge(self, cpu_s: float) -> None:
        """Add ``cpu_s`` seconds of this rank's training-thread CPU time to its latest
        boundary's cost: work the boundary causes later (the callback logs its entry on the
        next row Lightning logs), which ``replan_budget`` bounds as well."""
        if self._boundary_costs:
            self._boundary_costs[-1] += cpu_s

    def _spread(self, boundary_s: Sequence[float], step_s: Sequence[float]) -> None:
        """Set ``interval`` from the gathered costs: the fewest multiples of ``adjust_every``
        batches whose steps make the costliest rank's boundary (the mean of its last few)
        at most ``replan_budget`` of their time. Every rank computes it from the same rows, so
        boundaries stay collective."""
        every, budget = self.adjust_every, self.replan_budget
        if every == "epoch" or budget is None:
            return
        cost, step = max(boundary_s), _mean_finite(step_s)
        if not (math.isfinite(step) and step > 0 and math.isfinite(cost) and cost > 0):
            return
        spread = min(_MAX_SPREAD, max(1, math.ceil(cost / (budget * step * every))))
        if spread > 1 and not self._said_spread:
            self._said_spread = True
            rank_zero_info(
                f"hetero: a boundary takes {cost * 1e3:.3g} ms of CPU,"
                f" {cost / (step * every):.1%} of the"
                f" {'step' if every == 1 else f'{every} steps'} of {step * 1e3:.3g} ms"
                " between boundaries; re-planning every"
                f" {spread * every} batches instead keeps it within `replan_budget`"
                f" ({budget:.2%} of the training time). `replan_budget=None` re-plans every"
                f" {'batch' if every == 1 else f'{every} batches'} whatever it costs. (Said"
                " once per fit.)"
            )
        self.interval = spread * every

    def _check_waits_seen(self, step_s: Sequence[float], wait_s: Sequence[float]) -> None:
        """Warn once when lock-step ranks' timings show waits the timer cannot see."""
        if self._warned_unseen or not self.training_mode.steps_together:
            return
        if waits_unseen(step_s, wait_s):
            self._warned_unseen = True
            steps = ", ".join(f"{t:.3g}" for t in step_s)
            waits = ", ".join(f"{t:.2g}" for t in wait_s)
            rank_zero_warn(
                f"hetero: the ranks step together, yet their step times differ ({steps} s)"
                f" while none measured any wait for the others ({waits} s): a faster rank's"
                " wait is being counted as its compute, so the controller cannot see which"
                " rank is slow. A collective the strategy does not time runs inside the step"
                " (e.g. a `sync_dist` or all-reduce of your own in `training_step`, or a model"
                " hook that communicates): move it out of the training step, or report it."
            )

    def _refresh_params(self) -> None:
        """List the module's parameters now (walking the module tree costs more than the
        rest of a boundary on a deep model: it is done at each epoch's start, not at each
        boundary)."""
        module = self.ctx.module
        self._params_of = (module, [] if module is None else list(module.parameters()))

    def _model_changed(self) -> bool:
        """Whether the trainable parameters or the optimizer's parameter groups changed since
        the last boundary (``BaseFinetuning`` unfreezing a backbone, a new param group): a
        new per-step cost, not the plan's doing. Every rank holds the same model, so every
        rank decides alike."""
        ctx = self.ctx
        if self._params_of is None or self._params_of[0] is not ctx.module:
            self._refresh_params()
        assert self._params_of is not None
        trainable = sum(p.numel() for p in self._params_of[1] if p.requires_grad)
        groups = [
            sum(p.numel() for p in group["params"])
            for optimizer in ctx.optimizers
            for group in optimizer.param_groups
        ]
        previous, self._model_key = self._model_key, (trainable, *groups)
        return previous is not None and previous != self._model_key

    def _say_held(self, plan: list[int], wanted: list[int], entry: dict[str, Any]) -> None:
        """Say why an unbalanced plan is kept (at most every ``_SAY_HELD_EVERY`` boundaries):
        the balance, what holds the plan, and what would release it."""
        if self._held_said_at is not None and len(self.history) - self._held_said_at < (
            _SAY_HELD_EVERY
        ):
            return
        self._held_said_at = len(self.history)
        limits = self.ctx.plan_state.limits
        assert limits is not None
        why = held_reason(
            plan,
            wanted,
            entry["compute_times"],
            limits,
            self.controller,
            self._guard_in_force,
            entry.get("deadband"),
            entry["balance"],
        )
        rank_zero_info(f"hetero: keeping the plan {plan} at balance {entry['balance']:.2f}: {why}.")

    def _review(
        self,
        plan: list[int],
        step_s: Sequence[float],
        step_se: Sequence[float],
        steps: int,
        compute_s: Sequence[float],
    ) -> list[int] | None:
        """The guard's verdict on the plan in force (every rank alike, from gathered
        numbers): the plan to go back to, or ``None``. Each rank's compute time lets it tell
        a slowdown every rank saw from the plan's."""
        guard = self._guard_in_force
        mean_s = _mean_finite(step_s)
        if guard is None or not (math.isfinite(mean_s) and mean_s > 0):
            return None
        return guard.review(plan, mean_s, _mean_finite(step_se), steps, compute_s)

    @property
    def _guard_in_force(self) -> StepTimeGuard | None:
        """The guard, unless the mode fixes the plan on purpose (the dual plan)."""
        return None if self.training_mode.fixed_plan else self.guard

    def _decide(self, plan: list[int], compute_s: list[float], stats: list[RankStats]) -> list[int]:
        """Run the controller (on every rank if it is ``replicable``, else on rank 0); its
        warnings are re-emitted once, and a failure becomes the all-zero plan, so that
        every rank raises (``_checked``) instead of waiting."""
        limits = self.ctx.plan_state.limits
        assert limits is not None
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            try:
                new_plan = self.controller.update(plan, compute_s, limits, stats)
            except Exception as err:
                rank_zero_warn(f"hetero: the controller failed: {type(err).__name__}: {err}")
                new_plan = [0] * len(plan)
        for warning in caught:
            rank_zero_warn(str(warning.message))
        return new_plan

    def _checked(self, plan: list[int]) -> list[int]:
        """``plan``, unless it is the all-zero plan that marks a controller failure.

        Raises:
            RuntimeError: the controller failed.
        """
        if not any(plan):
            raise RuntimeError(
                f"hetero: the {type(self.controller).__name__} controller failed (see its"
                " warning above); stopping every rank."
            )
        return plan

    def _check_same_plan(self, checks: Sequence[int]) -> None:
        """Stop every rank if they hold different plans (their ``plan_checksum``
        differ: a controller marked ``replicable`` that decided differently on some rank)."""
        if len(set(checks)) > 1:
            raise RuntimeError(
                f"hetero: the ranks hold different plans (checksums {checks}): the"
                f" {type(self.controller).__name__} controller is marked `replicable` but did not"
                " decide alike on every rank. Set `replicable = False` on it, so that rank 0"
                " decides and broadcasts, and resume from the last checkpoint."
            )

    def _check_minimum(self) -> list[int]:
        """Ranks the new plan holds at their minimum though slower; warns once per rank."""
        ctx = self.ctx
        limits = ctx.plan_state.limits
        assert limits is not None
        if self.training_mode.fixed_plan:
            return []  # e.g. the dual plan fixes every rank's batch on purpose
        lower = limits.min_batch_size
        held = held_at_minimum(ctx.plan_state.batch_sizes, self._samples_per_s, lower)
        for rank in held:
            if rank in self._warned_minimum:
                continue
            self._warned_minimum.add(rank)
            total = limits.global_batch_size
            speed, all_speed = self._samples_per_s[rank], sum(self._samples_per_s)
            origin = ""
            if ctx.plan_state.min_batch_size is None:  # not the user's: say where it is from
                origin = (
                    " (the default for a model with BatchNorm layers)"
                    if lower[rank] == 2
                    else " (the default)"
                )
            rank_zero_warn(
                f"hetero: rank {rank} is held at min_batch_size={lower[rank]}{origin}, but at its"
                " measured"
                f" speed ({speed:.1f} of all ranks' {all_speed:.1f} samples/s) its share of the"
                f" global batch of {total} would be {total * speed / all_speed:.1f} samples. It"
                " slows every step whatever the plan: consider removing it from the job"
                " (paper 001)."
            )
        return held

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        """The plan, the controller, the history, counters and each rank's last reading."""
        ctx = self.ctx
        plan = ctx.plan_state.batch_sizes
        if not plan:
            return {}
        return {
            "batch_sizes": plan,
            "world_size": ctx.world_size,
            "controller_class": type(self.controller).__name__,
            "controller": self.controller.state_dict(),
            "guard": None if self.guard is None else self.guard.state_dict(),
            "history": [dict(entry) for entry in self.history],
            "adjustments": self.adjustments,
            "batches": self.batches,
            "mode": self.training_mode.state_dict(),
            "ranks": [
                {
                    "host": identity.host,
                    "local_rank": identity.local_rank,
                    "batch_size": batch_size,
                    "samples_per_s": speed,
                }
                for identity, batch_size, speed in zip(
                    self._identities,
                    self._measured_batch_sizes or plan,
                    self._samples_per_s or [math.nan] * ctx.world_size,
                )
            ],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (of ``state_dict``; call after ``start``).

        The same world size continues the saved plan and controller; another world size makes
        the plan anew in proportion to the saved throughputs of the ranks that come back on
        the same host and local rank.
        """
        ctx = self.ctx
        if state["world_size"] == ctx.world_size:
            ctx.plan_state.restore(state["batch_sizes"])
            self._keep_saved_throughputs(state["ranks"])
            if state["controller_class"] == type(self.controller).__name__:
                self.controller.load_state_dict(state["controller"])
            else:
                rank_zero_warn(
                    f"The checkpoint was written with the {state['controller_class']}"
                    f" controller, this run uses {type(self.controller).__name__}: its"
                    " state starts fresh."
                )
            if self.guard is not None and state.get("guard") is not None:
                self.guard.load_state_dict(state["guard"])
        else:
            self._restore_for_new_world(state)
        self.history[:] = state["history"]
        self.adjustments = state["adjustments"]
        self.batches = state.get("batches", 0)
        self.training_mode.load_state_dict(state["mode"])

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

    def _restore_for_new_world(self, state: dict[str, Any]) -> None:
        """Re-plan a checkpoint of another world size from its per-rank throughputs."""
        saved = state["ranks"]
        restored = weights_for_new_world(
            [RankIdentity(r["host"], r["local_rank"]) for r in saved],
            [r["samples_per_s"] for r in saved],
            self._identities,
        )
        self.ctx.plan_state.restore(state["batch_sizes"], weights=restored.weights)

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
            f" {self.ctx.world_size}: {how}. The controller's state"
            f" ({state['controller_class']}) starts fresh."
        )


def waits_unseen(
    step_s: Sequence[float], wait_s: Sequence[float], spread: float = 0.1, floor: float = 0.01
) -> bool:
    """Whether ranks that step together measured step times (compute plus wait) that differ
    by more than ``spread`` of the longest while every wait is below ``floor`` of the
    shortest step: impossible when the waits are measured, since a lock-step step lasts as
    long on every rank and only the waits make up the difference.

    Example:
        >>> waits_unseen([1.0, 1.3], [0.0, 0.001]), waits_unseen([1.0, 1.3], [0.3, 0.0])
        (True, False)
        >>> waits_unseen([1.0, 1.02], [0.0, 0.0])  # equal ranks wait for nobody
        False
    """
    steps = [t for t in step_s if math.isfinite(t) and t > 0]
    if len(steps) != len(step_s) or len(steps) < 2 or len(wait_s) != len(steps):
        return False
    if max(steps) - min(steps) <= spread * max(steps):
        return False
    return all(math.isfinite(w) and w < floor * min(steps) for w in wait_s)


def held_reason(
    plan: Sequence[int],
    wanted: Sequence[int],
    compute_s: Sequence[float],
    limits: BatchLimits,
    controller: Controller,
    guard: StepTimeGuard | None,
    deadband: float | None,
    balance: float,
) -> str:
    """What holds ``plan`` (measured at ``compute_s``) though it is unbalanced, and what would
    release it: the step-time guard (``wanted``, the controller's plan, differs), else a bound
    that stops a rank's batch where its measured speed wants it to go (a learned maximum or
    floor, the memory bound ``max_batch_size``, ``min_batch_size``), else the dead-band.

    Example:
        >>> from lightning_hetero.planning import ProportionalController
        >>> held_reason([8, 8], [8, 8], [1.0, 2.0], BatchLimits.build(2, 16, max_batch_size=8),
        ...             ProportionalController(), None, 0.05, 0.75)  # doctest: +ELLIPSIS
        'rank 0 is at `max_batch_size`=8 (its memory bound), below the 11 its speed asks...'
    """
    if list(wanted) != list(plan) and guard is not None:
        if guard.holding:
            return "the step-time guard waits for enough steps to judge the last change"
        return (
            f"the step-time guard undid {guard.reverts} change(s) that measured slower"
            f" ({guard.reverts_in_row} in a row from this plan) and tries no more until the"
            " cluster changes beyond the drift it has seen or the controller asks for another"
            " plan (`revert_slower=False` keeps every change)"
        )
    speeds = [b / t for b, t in zip(plan, compute_s)]
    total = limits.global_batch_size
    free = proportional_split(speeds, total, [1] * len(plan), [total] * len(plan))
    learned_max = getattr(controller, "learned_max", None) or [None] * len(plan)
    learned_min = getattr(controller, "learned_min", None) or [None] * len(plan)
    expires = getattr(controller, "learned_expires_in", None) or [None] * len(plan)
    floor_expires = getattr(controller, "floor_expires_in", None) or [None] * len(plan)
    for k, (size, share) in enumerate(zip(plan, free)):
        if share > size and learned_max[k] is not None and size >= learned_max[k]:
            left = expires[k]
            when = f" in {left} boundaries" if left is not None else ""
            return (
                f"rank {k} is at its learned maximum {learned_max[k]} (its throughput fell"
                f" above that size), below the {share} its speed asks; the maximum is lifted"
                f"{when} (`relearn_after`), or never learned with `learn_max_batch_size=False`"
            )
        if share > size and size >= limits.max_batch_size[k]:
            return (
                f"rank {k} is at `max_batch_size`={limits.max_batch_size[k]} (its memory"
                f" bound), below the {share} its speed asks; a larger `max_batch_size`, or"
                " `micro_batch_size` so that memory bounds the micro-batch, not the share,"
                " would move it"
            )
        if share < size and learned_min[k] is not None and size <= learned_min[k]:
            left = floor_expires[k]
            when = f" in {left} boundaries" if left is not None else ""
            return (
                f"rank {k} is at its learned floor {learned_min[k]} (fewer samples did not"
                f" make its steps shorter), above the {share} its speed asks; the floor is"
                f" lifted{when} (`relearn_after`), or never learned with `learn_floor=False`"
            )
        if share < size and size <= limits.min_batch_size[k]:
            return (
                f"rank {k} is at `min_batch_size`={limits.min_batch_size[k]}, above the"
                f" {share} its speed asks; a smaller `min_batch_size` would move it (or"
                " remove the rank from the job)"
            )
    if deadband is not None:
        option = getattr(controller, "deadband", None)
        source = "the measured timing noise" if option == "auto" else "`deadband`"
        return (
            f"the dead-band is {deadband:.1%} ({source}, deadband={option!r}): a gain smaller"
            f" than that is not acted on; deadband={max(0.0, 0.5 * (1 - balance)):.2f}"
            " would move it"
        )
    return f"the {type(controller).__name__} controller keeps it"


def _mean_finite(values: Sequence[float]) -> float:
    """Mean of the finite values (``nan`` when none is)."""
    finite = [v for v in values if math.isfinite(v)]
    return fmean(finite) if finite else math.nan
