# Generated from lightning_hetero/engine.py by `make generate`; do not edit.  # ruff: noqa
# fmt: off
"""The hetero half of a strategy, mixed into a Lightning parallel strategy.

``HeteroEngine`` is everything ``HeteroStrategy`` (DDP) and ``HeteroFSDPStrategy``
(FSDP2) share: the plan state, the re-planner, the training mode the Lightning hooks are
handed to, the training loader of each rank and the weighted reduction of logged values.
Each strategy adds its constructor and how it wraps the model.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from pytorch_lightning.callbacks import GradientAccumulationScheduler
from pytorch_lightning.trainer.states import RunningStage, TrainerFn
from lightning_utilities.core.rank_zero import rank_zero_info
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader
from typing_extensions import override

from lightning_hetero._comm import CudaStepTimer, HostStepTimer
from lightning_hetero.pytorch_lightning._data import (
    check_training_loader,
    epoch_order,
    refuse_several_training_loaders,
    refuse_step_counting,
    refuse_unequal_steps,
    with_batch_sampler,
)
from lightning_hetero.pytorch_lightning._lightning import (
    LOOP_COUNTS,
    check_own_sigterm_only,
    in_training_batch,
    name_unused_parameters_fix,
    request_train_reload,
    running_hook,
    set_logged_batch,
    set_loop_counts,
    set_validation_steps,
)
from lightning_hetero._probes import StepProbe, check_probe_options
from lightning_hetero.pytorch_lightning.callback import HeteroCallback
from lightning_hetero.collectives import Collectives, destroy_at_exit, is_mean, weighted_mean_
from lightning_hetero.context import RunContext
from lightning_hetero.pytorch_lightning.emulate import Throttle
from lightning_hetero.microbatch import (
    FirstSamples,
    check_micro_batch_size,
    converted_accumulation,
    ddp_loader_batches,
    limited_batches,
    local_metric_syncs,
    micro_bounds,
    micro_sizes,
    note_collective_in_micro_batch,
    split_batch,
    step_loss,
    validates_after,
)
from lightning_hetero.modes import Mode, ModeOptions, build_mode
from lightning_hetero.plan_state import PlanState, check_plan_options
from lightning_hetero.planning import BatchLimits, Controller, StepTimeGuard
from lightning_hetero.planning.dual import DualBatchPlan
from lightning_hetero.replan import Replanner, check_replan_options
from lightning_hetero.resources import gather_capacities
from lightning_hetero.streaming import set_rank_variables, unset_rank_variables

__all__ = ["HeteroEngine", "HeteroOptions", "hetero_parts"]


@dataclass(frozen=True)
class HeteroOptions:
    """The options every hetero strategy takes, in one place.

    Each strategy lists them as keyword arguments of its constructor (so that LightningCLI and
    editors see them), with these defaults and types; a test holds both strategies to this
    list. What each means is documented once, on
    [`HeteroStrategy`][lightning_hetero.HeteroStrategy].
    """

    controller: str | Controller | None = None
    batch_sizes: str | list[int] = "uniform"
    global_batch_size: int | None = None
    min_batch_size: int | None = None
    max_batch_size: int | list[int] | Literal["auto"] | None = None
    micro_batch_size: int | list[int] | Literal["auto"] | None = None
    memory_safety: float = 0.9
    probe_batch_sizes: list[int] | None = None
    deadband: float | Literal["auto"] = "auto"
    revert_slower: bool = True
    smoothing: float = 0.8
    adjust_every: Literal["epoch"] | int = "epoch"
    shuffle: bool = True

    @classmethod
    def pick(cls, arguments: dict[str, Any]) -> "HeteroOptions":
        """These options out of a constructor's ``locals()``."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls)})


def hetero_parts(
    mode: str,
    options: ModeOptions,
    shared: HeteroOptions,
    modes: dict[str, type[Mode]] | None = None,
) -> tuple[Mode, PlanState]:
    """Check a strategy's hetero options and build its mode and plan state (before the
    Lightning strategy is built, so that bad input fails first). ``modes``: the engine's
    registry (default: DDP's)."""
    check_replan_options(shared.deadband, shared.smoothing, options.adjust_every)
    check_probe_options(shared.memory_safety, shared.probe_batch_sizes)
    check_micro_batch_size(shared.micro_batch_size)
    training_mode = build_mode(mode, shared.controller, shared.deadband, options, modes=modes)
    if shared.micro_batch_size is not None and not training_mode.micro_batches:
        raise ValueError(
            "`micro_batch_size` runs under HeteroStrategy(mode='bsp') and HeteroFSDPStrategy"
            f" only (not the modes 'async' and 'local'), got {training_mode.option_text()}:"
            " remove `micro_batch_size` (`max_batch_size` bounds each rank's batch), or train"
            " with HeteroStrategy(mode='bsp')."
        )
    total = options.global_batch_size
    lower, upper = shared.min_batch_size, shared.max_batch_size
    initial = check_plan_options(shared.batch_sizes, total, lower, upper)
    return training_mode, PlanState(initial, total, lower, upper)


def _remove(items: list[Any], item: Any) -> None:
    """Remove ``item`` (this very object) from ``items`` where it still is."""
    items[:] = [other for other in items if other is not item]


class HeteroEngine:
    """Per-rank batch sizes for a Lightning ``ParallelStrategy`` (mix in before it).

    The strategy's constructor checks its options with ``hetero_parts`` and, once the
    Lightning strategy is built, calls ``_start_hetero`` with the shared
    ``HeteroOptions``.
    """

    #: The running training mode, which every lifecycle hook is handed to.
    training_mode: Mode
    plan_state: PlanState
    replanner: Replanner
    #: What ``max_batch_size="auto"`` found on this rank: the bound and the fitted model.
    memory_probe: dict[str, Any] | None
    #: Whether a step's micro-batches hold more memory than one ordinary step (FSDP2: every
    #: unit gathered for the whole step): ``micro_batch_size="auto"`` then probes held
    #: micro-batches (DDP's hold what an ordinary step holds: it probes ordinary steps).
    micro_batches_hold_more: ClassVar[bool] = False

    def _start_hetero(
        self, training_mode: Mode, plan_state: PlanState, shared: HeteroOptions
    ) -> None:
        """Keep the options as given and build the objects that hold what a run learns."""
        self.shuffle, self.smoothing = shared.shuffle, shared.smoothing
        self.adjust_every, self.deadband = shared.adjust_every, shared.deadband
        self.memory_safety, self.probe_batch_sizes = shared.memory_safety, shared.probe_batch_sizes
        self.revert_slower = shared.revert_slower
        self.training_mode = training_mode
        self.plan_state = plan_state
        # the objective it checks, one step time for every rank, exists in lock-step modes
        steps_together = training_mode.steps_together
        guard = StepTimeGuard() if shared.revert_slower and steps_together else None
        self.replanner = Replanner(
            training_mode, shared.smoothing, shared.adjust_every, guard=guard
        )
        self.memory_probe = None
        #: The most samples a rank puts through the model at once, as given.
        self.micro_batch_size = shared.micro_batch_size
        #: Each rank's micro-batch bound, once known (set-up; ``"auto"``: the memory probe).
        self.micro_bounds: list[int] | None = None
        #: Samples of the micro-batch running now (``None`` outside micro-batched steps).
        self.micro_batch_samples: int | None = None
        # the step's micro-batches after its first: ``(batch, samples, other args, kwargs)``
        self._micro_rest: list[tuple[Any, int, tuple[Any, ...], dict[str, Any]]] = []
        # the step's whole batch and share, put back once its micro-batches ran
        self._micro_whole: tuple[Any, tuple[int, int]] | None = None
        # a micro-batch before this rank's last of the step runs (its training step and its
        # backward): step-level syncs stay local, as the ranks run different counts of them
        self._micro_local = False
        #: The run the re-planner, the mode and the probes work in (made at set-up).
        self.context: RunContext | None = None
        self._optimizers_ready = False  # set-up has built the optimizers
        # what set-up changed outside the strategy (environment variables, the Trainer's
        # callbacks), undone at teardown: the process is left as it was found
        self._undo: list[Callable[[], None]] = []
        # the Trainer whose loop counts this run set, and the user's values, put back at teardown
        self._user_loop_counts: tuple[Any, dict[str, int | float]] | None = None
        self._reload_after_setup = False  # the training data was loaded before that
        # accumulation taken over: the user's `val_check_interval` and
        # `limit_train_batches`, and DDP's loader batches per epoch and validation interval
        self._ddp_counts: tuple[Any, Any] = (1.0, 1.0)
        self._ddp_batches, self._ddp_every = 0, None
        self._undo_validation: Callable[[], None] | None = None

    # ---------------------------------------------------------------- public state
    @property
    def controller(self) -> Controller:
        """The controller that re-plans at each boundary."""
        return self.training_mode.controller

    @property
    def batch_sizes(self) -> list[int]:
        """The current plan, one batch size per global rank (empty until it is known)."""
        return self.plan_state.batch_sizes

    @property
    def limits(self) -> BatchLimits | None:
        """The global batch and per-rank bounds, once the training loader has been seen."""
        return self.plan_state.limits

    @property
    def history(self) -> list[dict[str, Any]]:
        """One record per boundary: plan, timings, balance, whether the plan changed."""
        return self.replanner.history

    @property
    def merges(self) -> list[dict[str, Any]]:
        """Local mode: one record per merge (weights, update counts, perturbation)."""
        return getattr(self.training_mode, "merges", [])

    @property
    def server(self) -> Any:
        """The parameter server (async mode, rank 0 only, while training)."""
        return getattr(self.training_mode, "server", None)

    @property
    def dual_plan(self) -> DualBatchPlan | None:
        """Dual batch size learning: the plan being run (``None`` for other controllers)."""
        return getattr(self.training_mode, "dual_plan", None)

    @property
    def sampler(self) -> Any:
        """This rank's training batch sampler (``None`` before the first training loader)."""
        return self.training_mode.sampler

    @property
    def timer(self) -> HostStepTimer:
        """Times this rank's training steps and the waiting inside them."""
        return self._context().timer

    @property
    def comm(self) -> Collectives:
        """The plugin's own collectives on the default process group (the run's)."""
        return self._context().comm

    def _context(self) -> RunContext:
        if self.context is None:
            raise RuntimeError(
                f"{type(self).__name__} has no run yet: its collectives and step timer exist"
                " once `setup_environment` has run (the Trainer calls it)."
            )
        return self.context

    def _check_process_group(self) -> None:
        """Refuse a process group that another launcher made with another number of ranks
        (e.g. Ray Train's, around a strategy that Ray's ``prepare_trainer`` did not set up):
        the plan would have a batch size for the wrong ranks."""
        if not (dist.is_available() and dist.is_initialized()):
            return
        ranks = dist.get_world_size()
        if ranks != self.world_size:
            raise RuntimeError(
                f"{type(self).__name__} counts {self.world_size} rank(s) (num_nodes x devices),"
                f" but the process group that was already set up has {ranks}: another launcher"
                " made it. Under Ray Train use"
                " `lightning_hetero.integrations.ray.RayHeteroStrategy` (or"
                " `RayHeteroFSDPStrategy`) with `lightning_hetero.integrations.ray."
                "prepare_trainer`; elsewhere set the Trainer's `num_nodes` and `devices` to"
                " match the job."
            )

    def _make_context(self) -> RunContext:
        """This rank's run, once the process group is up (see
        [`RunContext`][lightning_hetero.pytorch_lightning.engine.RunContext])."""
        comm = self._bare_comm()
        device = comm.device
        environment = self.cluster_environment
        module = self.lightning_module
        trainer = None if module is None else module.trainer

        def position() -> tuple[int, int]:
            return (0, 0) if trainer is None else (trainer.current_epoch, trainer.global_step)

        return RunContext(
            rank=self.global_rank,
            world_size=self.world_size,
            local_rank=self.local_rank,
            device=device,
            comm=comm,
            timer=CudaStepTimer() if device.type == "cuda" else HostStepTimer(),
            plan_state=self.plan_state,
            main_address=environment.main_address if environment else "127.0.0.1",
            main_port=environment.main_port if environment else 29500,
            devices=list(self.parallel_devices or [device]),
            module=module,
            position=position,
        )

    def gather_rows(self, values: Sequence[float]) -> list[list[float]]:
        """All-gather one row of floats per rank; returns the rows in rank order."""
        return self.comm.gather_rows(values)

    def gather_objects(self, value: Any) -> list[Any]:
        """All-gather one picklable object per rank; returns them in rank order."""
        return self.comm.gather_objects(value)

    @contextmanager
    def guarded(self, operation: str) -> Iterator[None]:
        """Run a collective; if it fails, the error names the operation, this rank and, for a
        timeout, the ``timeout`` option (also before set-up: it communicates nothing)."""
        comm = self.context.comm if self.context is not None else self._bare_comm()
        with comm.guarded(operation):
            yield

    def _bare_comm(self) -> Collectives:
        """A new collectives object for this rank (it communicates only when used)."""
        device = self.root_device if self.parallel_devices else torch.device("cpu")  # bare
        return Collectives(self.global_rank, self.world_size, device, self._timeout)

    # ---------------------------------------------------------------- set-up
    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if self.world_size > 1:  # what data libraries read (MosaicML's streaming): see there
            added = set_rank_variables(
                self.global_rank, self.world_size, self.local_rank, self.num_processes
            )
            self._undo.append(lambda: unset_rank_variables(added))
        destroy_at_exit()
        self._check_process_group()
        self.context = self._make_context()
        self.replanner.bind(self.context)  # and the mode, which re-plans through it
        self._note_batch_norm()
        self.plan_state.check_world(self.world_size)
        if self.micro_batch_size not in (None, "auto"):
            self.micro_bounds = micro_bounds(self.micro_batch_size, self.world_size)
        if self.lightning_module is None:
            return  # a bare strategy, e.g. for its collectives, as DDPStrategy allows
        trainer = self.lightning_module.trainer
        if not any(isinstance(cb, HeteroCallback) for cb in trainer.callbacks):
            callback = HeteroCallback()
            trainer.callbacks.append(callback)
            self._undo.append(lambda: _remove(trainer.callbacks, callback))
        if trainer.state.fn != TrainerFn.FITTING:
            return
        if not self.training_mode.steps_together and self._layer_sync is not None:
            raise ValueError(
                f"{self.training_mode.option_text()} does not synchronize ranks at every step;"
                " SyncBatchNorm (`sync_batchnorm=True`) needs mode='bsp'."
            )
        self._take_over_accumulation(trainer)
        self.training_mode.setup_environment()

    def _take_over_accumulation(self, trainer: "pl.Trainer") -> None:
        """Run Lightning's ``accumulate_grad_batches=N`` as one global batch per optimizer step.

        Where the mode takes accumulation over (``Mode.takes_over_accumulation``: DDP's
        ``"bsp"``), the ``N * b * K`` samples of a step are planned together and each rank's
        share runs as micro-batches of at most the loader batch ``b`` (set once the loader is
        seen), so the share follows the speeds; Lightning runs with accumulation 1 and its
        batch counts become optimizer steps (see docs/memory.md, "the accumulation story").
        Elsewhere each accumulated batch is planned on its own, as before, and
        ``micro_batch_size`` beside accumulation is refused. Beside a
        ``GradientAccumulationScheduler`` nothing is taken over: Lightning refuses
        ``accumulate_grad_batches`` with it itself (at the start of training).
        """
        state = self.plan_state
        state.accumulation = 1
        if self.micro_batch_size is None:
            self.micro_bounds = None  # a previous fit's, from its loader batch
        accumulate = trainer.accumulate_grad_batches
        mode = self.training_mode
        if not self.lightning_module.automatic_optimization:
            return  # Lightning refuses accumulation with manual optimization itself
        if any(isinstance(cb, GradientAccumulationScheduler) for cb in trainer.callbacks):
            return  # Lightning refuses it beside `accumulate_grad_batches` (on_train_start)
        if not mode.takes_over_accumulation:
            if self.micro_batch_size is not None and accumulate != 1:
                raise ValueError(
                    f"{type(self).__name__}(micro_batch_size={self.micro_batch_size!r}) plans"
                    " the samples of each optimizer step as micro-batches, and the Trainer's"
                    f" `accumulate_grad_batches={accumulate}` would accumulate {accumulate}"
                    " such steps again. Set global_batch_size=<samples per optimizer step>"
                    " with `accumulate_grad_batches=1`."
                )
            return
        accumulate = converted_accumulation(
            accumulate, self.micro_batch_size, state.global_batch_size, state.initial
        )
        if accumulate == 1:
            return
        # counted in loader batches as under DDP: each epoch's are set once its loader is
        # known (`_loop_counts_in_steps`); validation at DDP's optimizer steps
        self._ddp_counts = (trainer.val_check_interval, trainer.limit_train_batches)
        counts = {name: getattr(trainer, name) for name in LOOP_COUNTS}
        self._user_loop_counts = (trainer, set_loop_counts(trainer, counts))
        trainer.accumulate_grad_batches = 1
        self._undo_validation = set_validation_steps(trainer, self._validates_after)
        state.accumulation = accumulate
        rank_zero_info(
            f"hetero: `accumulate_grad_batches={accumulate}` runs as one global batch of"
            f" loader batch x {accumulate} x {self.world_size} ranks per optimizer step, each"
            " rank's share in micro-batches of at most the loader batch (the loop counts"
            " optimizer steps: one batch each)."
        )

    @override
    def setup(self, trainer: "pl.Trainer") -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING
        state = self.plan_state
        self._note_batch_norm()  # `configure_model` may have added layers since
        if fitting and state.initial in ("cores", "flops") and state.capacities is None:
            state.capacities = gather_capacities(state.initial, self.root_device, self.comm)
        # Wraps the model, registers the hooks and builds the optimizers; a
        # `configure_optimizers` that reads `trainer.estimated_stepping_batches` makes Lightning
        # load the training data in here, before the optimizers exist.
        self._optimizers_ready = False
        self._lightning_setup(trainer)
        self._optimizers_ready = True
        self._context().optimizers = self.optimizers
        if not fitting:
            return
        if self._reload_after_setup:
            # that early loader served for its length; the plan is made when Lightning loads
            # the data again at its usual point, as in any other run
            self._reload_after_setup = False
            request_train_reload(trainer)
        if not self.training_mode.even_steps:
            refuse_step_counting(trainer, self.training_mode.option_text())
        if not self.training_mode.steps_together:
            check_own_sigterm_only(trainer)  # a per-step broadcast would tie the ranks again
        if self.micro_batch_size is not None or state.accumulation > 1:
            self._check_micro_batching(trainer)

    def _check_micro_batching(self, trainer: "pl.Trainer") -> None:
        """Refuse what micro-batches cannot run exactly (at set-up, before any step)."""
        if self._layer_sync is not None:
            # SyncBatchNorm all-reduces in every forward: once per micro-batch, whose counts
            # differ between ranks
            raise ValueError(
                f"{type(self).__name__} runs each rank's share of a step as its own number of"
                " micro-batches (`micro_batch_size`, or the Trainer's `accumulate_grad_batches`"
                " taken over), and SyncBatchNorm (`sync_batchnorm=True`) communicates in every"
                " forward, so the ranks' collectives would not pair. Remove `sync_batchnorm`"
                " (each rank's BatchNorm then normalizes its own micro-batch), or train without"
                " micro-batches (`accumulate_grad_batches=1`, no `micro_batch_size`)."
            )
        if not self.lightning_module.automatic_optimization:
            raise ValueError(
                f"`micro_batch_size` runs a rank's share of each step as micro-batches inside"
                f" Lightning's automatic optimization; {type(self.lightning_module).__name__}"
                " uses manual optimization. Remove `micro_batch_size` and cut the batch in your"
                " `training_step`: scale each `manual_backward` loss by its samples / batch"
                " size, and run all but the last in"
                " `self.trainer.strategy.block_backward_sync()`."
            )
        schedulers = [
            cb for cb in trainer.callbacks if isinstance(cb, GradientAccumulationScheduler)
        ]
        if schedulers:
            # it sets the Trainer's accumulation per epoch, which micro-batches would multiply
            raise ValueError(
                f"{type(self).__name__}(micro_batch_size={self.micro_batch_size!r}) plans the"
                " samples of each optimizer step, and the Trainer's"
                f" `{type(schedulers[0]).__name__}` would accumulate several such steps again,"
                " by epoch. Remove the callback and plan each epoch's optimizer step as one"
                " global batch: HeteroStrategy(global_batch_size=<samples per optimizer step>,"
                " micro_batch_size=<samples a rank holds at once>); or remove"
                " `micro_batch_size` (each accumulated batch is then planned on its own)."
            )

    def _lightning_setup(self, trainer: "pl.Trainer") -> None:
        """The Lightning strategy's own ``setup`` (a strategy replaces it where Lightning's
        would refuse what the strategy supports: ``HeteroFSDPStrategy``)."""
        super().setup(trainer)

    def _note_batch_norm(self) -> None:
        # a batch of one has no variance: BatchNorm refuses to train on it
        module = self.lightning_module
        batch_norm = module is not None and any(isinstance(m, _BatchNorm) for m in module.modules())
        self.plan_state.default_min = 2 if batch_norm else 1

    # ---------------------------------------------------------------- data
    @override
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer
        if trainer.state.stage != RunningStage.TRAINING:
            return dataloader  # validation, test and predict keep Lightning's sharding
        seed = check_training_loader(dataloader)
        assert isinstance(dataloader, DataLoader)
        state = self.plan_state
        cut = None  # the epoch's samples, where `limit_train_batches` cuts it (taken over)
        if state.accumulation > 1:  # the loader batch is what a rank held under DDP
            self.micro_bounds = [dataloader.batch_size or 1] * self.world_size
            cut = self._loop_counts_in_steps(trainer, dataloader)
        if state.plan is None and not self._optimizers_ready:
            # Loaded inside `setup` (see there): Lightning needs only the number of steps,
            # which an even split of the same global batch already has.
            plan = state.provisional(dataloader.batch_size, self.world_size)
            self._reload_after_setup = True
        elif state.plan is None:
            plan = state.plan = self._first_plan(dataloader)
        else:
            if state.rescale_pending:
                state.rescale_pending = False
                state.plan = self.training_mode.rescaled_plan() or state.rescaled(self.world_size)
            plan = state.plan
        epochs = epoch_order(dataloader.dataset, self.shuffle, seed, sum(plan))
        if cut is not None:
            epochs = FirstSamples(epochs, cut)
        # every batch, the last of an epoch or mega-batch too, has at least the lower bound
        sampler = self.training_mode.batch_sampler(
            epochs, plan, dataloader.drop_last, state.lower()
        )
        if self.training_mode.even_steps:
            refuse_unequal_steps([int(row[0]) for row in self.gather_rows([len(sampler)])])
        return with_batch_sampler(dataloader, sampler)

    def _loop_counts_in_steps(self, trainer: "pl.Trainer", loader: DataLoader) -> int | None:
        """Lightning's loop counts for an epoch of ``loader`` with accumulation taken over
        (one loop batch per optimizer step), from the user's counts of loader batches as DDP
        applies them; returns the samples of an epoch that ``limit_train_batches`` cuts.

        DDP's epoch has ``n`` loader batches per rank (after ``limit_train_batches``, an int
        or a fraction), ``ceil(n / N)`` optimizer steps, the last a partial window where
        ``N`` does not divide ``n``: the strategy's epoch is its first ``n * b * K`` samples,
        whose last global batch is that window. Validation follows DDP's loader-batch count
        (``_validates_after``); Lightning's own counts are left at the whole epoch.
        """
        batch = loader.batch_size or 1
        full = ddp_loader_batches(len(loader.dataset), self.world_size, batch, loader.drop_last)
        every, limit = self._ddp_counts
        batches = limited_batches(full, limit)
        self._ddp_batches, self._ddp_every = batches, None
        if isinstance(every, float) and batches:
            self._ddp_every = max(1, int(batches * every))
        elif isinstance(every, int) and not isinstance(every, bool):
            self._ddp_every = every
            if every > batches and trainer.check_val_every_n_epoch is not None:
                trainer.val_check_interval = every  # Lightning refuses it, as under DDP
                every = None
        if self._ddp_every is not None and every is not None:
            trainer.val_check_interval = 1.0  # the decision is `_validates_after`'s
        if not batches:
            return None  # Lightning's own rules for an empty epoch (refused, or skipped)
        trainer.limit_train_batches = 1.0
        return batches * batch * self.world_size if batches < full else None

    def _validates_after(self, batch_idx: int) -> bool | None:
        """Whether DDP, with the accumulation taken over, validates after the optimizer step
        of loop batch ``batch_idx`` (``None``: Lightning's own rule applies)."""
        trainer = self.lightning_module.trainer
        if self.plan_state.accumulation == 1 or self._ddp_every is None:
            return None
        batches = self._ddp_batches
        offset = trainer.current_epoch * batches if trainer.check_val_every_n_epoch is None else 0
        accumulate = self.plan_state.accumulation
        return validates_after(batch_idx + 1, batches, accumulate, self._ddp_every, offset)

    def _first_plan(self, loader: DataLoader) -> list[int]:
        """Probe (``max_batch_size="auto"``, the mode's own) and make the first plan."""
        trainer = self.lightning_module.trainer
        emulation = [
            lambda batch, samples, cb=cb: cb.emulate_step(trainer, batch, samples)
            for cb in trainer.callbacks
            if isinstance(cb, Throttle)
        ]
        mode = self.training_mode
        # a sharded model's steps communicate: every rank probes the same sizes, and each
        # step runs as in training (inside the sharded root's forward)
        sharded = mode.probe_steps_communicate
        module = self.lightning_module
        micro_auto = self.micro_batch_size == "auto"
        # where micro-batches hold more than a step, the probe runs them (the same hooks
        # as training's `_micro_step`), so that its bound is a micro-batch's
        held = micro_auto and self.micro_batches_hold_more

        def training_step(batch: Any, batch_idx: int) -> Any:
            if sharded:  # the probe's own batch (held: around it, `_micro_forward`)
                return self._training_step(batch, batch_idx)
            with self.precision_plugin.train_step_context():
                return module.training_step(batch, batch_idx)

        probe = StepProbe(
            self._context(),
            loader,
            training_step,
            self.batch_to_device,
            schedulers=[config.scheduler for config in self.lr_scheduler_configs],
            emulation=emulation,
            extra=mode.timed_step_extra,
            agree=self.comm.any if sharded else None,
            micro=self._micro_forward if held else None,
            micro_failed=self._micro_failed if held else None,
        )
        state = self.plan_state
        if (state.max_batch_size == "auto" or micro_auto) and self.memory_probe is None:
            total = state.global_batch_size or (loader.batch_size or 1) * self.world_size
            self.memory_probe = probe.memory(
                total,
                self.probe_batch_sizes,
                self.memory_safety,
                max_auto=state.max_batch_size == "auto",
                micro_auto=micro_auto,
            )
        if state.max_batch_size == "auto":
            state.measured_max = self.memory_probe["max_batch_sizes"]
        if micro_auto:  # memory bounds the micro-batch, not the share
            self.micro_bounds = list(self.memory_probe["max_batch_sizes"])
        own = self.training_mode.first_plan(loader, probe.time)
        return own or state.resolve(loader.batch_size, self.world_size)

    def set_input_scale(self, scale: float, global_batch_size: int | None = None) -> None:
        """Inputs are now ``scale`` times as large per sample as those the plan was made for.

        Progressive learning calls this when the image resolution changes (``scale``: the
        ratio of pixel counts). From the next epoch the global batch is ``global_batch_size``
        or the planned-for one divided by ``scale`` and capped by what fits, and the plan is
        rescaled in proportion (see ``PlanState.set_input_scale``; with ``controller="dual"``
        ``B_S`` is planned again). Call it on every rank with the same arguments.
        """
        if self.plan_state.set_input_scale(scale, global_batch_size):
            request_train_reload(self.lightning_module.trainer)

    # ---------------------------------------------------------------- plan changes
    def apply_plan(self, batch_sizes: Sequence[int], from_step: int | None = None) -> None:
        """Switch every rank to ``batch_sizes`` from training step ``from_step`` of this epoch.

        Must be called on every rank with the same arguments. ``None`` means from the next
        epoch; the step must not have been drawn by any rank's loader yet.
        """
        assert self.sampler is not None
        self.replanner.apply_plan(batch_sizes, from_step)

    def restore_plan(
        self, batch_sizes: Sequence[int], weights: Sequence[float] | None = None
    ) -> None:
        """Start (or continue) from ``batch_sizes``, e.g. a plan saved in a checkpoint.

        ``weights``: one split weight per rank of this run, for when ``batch_sizes`` does not
        fit it (another world size): the initial plan is then proportional to them.
        """
        self.plan_state.restore(batch_sizes, weights)

    # ---------------------------------------------------------------- the loop
    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        refuse_several_training_loaders(self.lightning_module.trainer)
        self._context().optimizers = self.optimizers  # as Lightning holds them now
        self.training_mode.on_train_start()

    def step_samples(self, batch_idx: int) -> int | None:
        """The samples the plan gives this rank in step ``batch_idx`` of the epoch (``b_k``);
        ``None`` where the mode cannot tell before the step."""
        return self.training_mode.step_samples(batch_idx)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        self.training_mode.on_train_batch_start(batch_idx)

    @override
    def backward(
        self,
        closure_loss: torch.Tensor,
        optimizer: torch.optim.Optimizer | None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        """The mode's backward; after a micro-batched step's first backward, each of the
        step's other micro-batches (see ``_run_micro_rest``)."""
        run = super().backward
        try:
            result = self.training_mode.backward(
                closure_loss, lambda loss: run(loss, optimizer, *args, **kwargs)
            )
            self._run_micro_rest(optimizer)
        except BaseException as error:
            self._micro_abort(error)
            raise
        return result

    @override
    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        # Every backward of a step is timed (manual optimization may run several); the step
        # ends at its last backward or optimizer step, see `HostStepTimer`.
        self.training_mode.post_backward()

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's training step; with micro-batches, that of the step's first micro-batch
        (the others run after its backward, see ``_run_micro_rest``)."""
        sizes = self._step_micro_sizes()
        if sizes is None:
            return self._training_step(*args, **kwargs)
        batch, other = args[0], args[1:]
        first, *rest = split_batch(batch, sum(sizes), sizes)
        self._micro_whole = (batch, self.training_mode.share)
        self._micro_rest = [(part, n, other, kwargs) for part, n in zip(rest, sizes[1:])]
        try:
            return self._micro_step(first, sizes[0], other, kwargs, last=False)
        except BaseException as error:
            self._micro_abort(error)
            raise

    def _training_step(self, *args: Any, **kwargs: Any) -> Any:
        """One Lightning training step on the batch given (a strategy replaces it where the
        step runs otherwise: ``HeteroFSDPStrategy``)."""
        return super().training_step(*args, **kwargs)

    def _micro_forward(self, last: bool) -> AbstractContextManager[Any]:
        """Around a micro-batch's forward: all but the step's ``last`` run without DDP's
        gradient synchronization (DDP decides in the forward whether the backward reduces;
        ``HeteroFSDPStrategy`` holds its switches across the micro-batches instead)."""
        return nullcontext() if last else self.block_backward_sync()

    def _micro_failed(self) -> None:
        """A step's micro-batches stopped before their last (an error): undo what
        ``_micro_forward`` left set across them (DDP: nothing)."""

    def _step_micro_sizes(self) -> list[int] | None:
        """The sizes of this step's micro-batches; ``None``: the step runs as one batch."""
        bounds = self.micro_bounds
        module = self.lightning_module
        if bounds is None or not (module.trainer.training and module.automatic_optimization):
            return None
        share, lower = self.training_mode.share[0], self.plan_state.lower()
        sizes = micro_sizes(share, bounds[self.global_rank], lower)
        return sizes if len(sizes) > 1 else None

    def _micro_step(
        self, batch: Any, samples: int, other: tuple[Any, ...], kwargs: dict[str, Any], last: bool
    ) -> Any:
        """The training step of one micro-batch of ``samples``: its loss will weigh
        ``samples / B``; only the step's last backward communicates (``_micro_forward``)."""
        assert self._micro_whole is not None
        self.training_mode.share = (samples, self._micro_whole[1][1])
        self.micro_batch_samples = samples
        module = self.lightning_module
        set_logged_batch(module.trainer, batch)  # self.log weighs its samples
        self._micro_local = not last  # until the next micro-batch starts (backward too)
        with self._micro_forward(last), local_metric_syncs(module, not last):
            return self._training_step(batch, *other, **kwargs)

    def _run_micro_rest(self, optimizer: Any) -> None:
        """The forward and backward of each of the step's micro-batches after its first, once
        the first's backward ran: wherever Lightning's closure runs (in the optimizer step, or
        called by a user's ``optimizer_step`` that steps later, or not at all), no micro-batch
        is left out. Then the step's share and whole batch are put back."""
        rest, self._micro_rest = self._micro_rest, []
        if not rest or self._micro_whole is None:
            return  # a step run as one batch, or a backward of the rest itself
        module = self.lightning_module
        for index, (batch, samples, other, kwargs) in enumerate(rest):
            last = index == len(rest) - 1
            with running_hook(module, "training_step"):
                output = self._micro_step(batch, samples, other, kwargs, last=last)
            with running_hook(module, "backward"):
                self.backward(step_loss(output), optimizer)
        # as the step's start left them: its share, and the whole batch for logging
        whole, self.training_mode.share = self._micro_whole
        self._micro_whole = self.micro_batch_samples = None
        set_logged_batch(module.trainer, whole)

    def _micro_abort(self, error: BaseException) -> None:
        """A micro-batched step failed: undo what its micro-batches left set (once)."""
        if self._micro_whole is None:
            return
        self._micro_whole = self.micro_batch_samples = None
        self._micro_rest, self._micro_local = [], False
        self._micro_failed()
        note_collective_in_micro_batch(error)

    def _rest_after(self, closure: Callable[[], Any], optimizer: Any) -> Callable[[], Any]:
        """``closure`` (the first micro-batch's step, zero-grad and backward, which runs the
        others), then any micro-batches still to run (a first step that returned no loss)."""

        def run() -> Any:
            result = closure()
            try:
                self._run_micro_rest(optimizer)
            except BaseException as error:
                self._micro_abort(error)
                raise
            return result

        return run

    @override
    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Any,
        model: "pl.LightningModule | torch.nn.Module | None" = None,
        **kwargs: Any,
    ) -> Any:
        run = super().optimizer_step
        closure = self._rest_after(closure, optimizer)
        return self.training_mode.optimizer_step(
            optimizer, lambda: run(optimizer, closure, model, **kwargs)
        )

    @override
    def reduce(self, tensor: Any, group: Any | None = None, reduce_op: Any | None = "mean") -> Any:
        """``DDPStrategy.reduce``, with a training step's means weighted by batch size.

        Inside the training loop's batches (where Lightning reduces the step-level values of
        ``self.log(..., sync_dist=True)``), a mean weights rank ``k`` by the samples of its
        current batch, ``b_k``: the per-sample mean over the global batch, which is what
        DDP's plain mean is when every rank has the same batch. Elsewhere (epoch-level values,
        which Lightning computes as a synced sum over a synced sample count, validation,
        test) it is DDP's, except that the mean of an integer tensor is a ``float64`` tensor
        (DDP's truncates it to an integer). A reduction during a step counts as waiting, not
        compute. With micro-batches, a reduction in a micro-batch before this rank's last of
        the step (its ``training_step`` or backward hooks) returns the rank's own value: ranks
        run different numbers of micro-batches, and each syncs in its last one (the value DDP
        logs on a step: its last accumulated batch's, synced), so every rank issues the same
        collectives per optimizer step.
        """
        if not isinstance(tensor, torch.Tensor):
            return tensor
        if self.context is None:  # a bare strategy, never set up: DDP's reduction
            return super().reduce(tensor, group=group, reduce_op=reduce_op)
        if self._micro_local and in_training_batch(self.lightning_module):
            # a micro-batch before this rank's last: ranks run different numbers of them, so
            # the step's values are synced in each rank's last micro-batch only (what DDP
            # logs on a step is its last accumulated batch's value, synced)
            return tensor
        with self.timer.waiting():
            weigh = is_mean(reduce_op) and tensor.is_floating_point() and self.comm.distributed
            if weigh and in_training_batch(self.lightning_module):
                # in place, as DDPStrategy.reduce. b_k is the mode's `share`, set in this
                # strategy's `on_train_batch_start`: a value logged in a callback's or the
                # module's `on_train_batch_start` (they run before it) gets the previous
                # batch's weight, which differs only at a plan change.
                return weighted_mean_(tensor, float(self.training_mode.share[0]), group)
            if is_mean(reduce_op) and not tensor.is_floating_point() and self.comm.distributed:
                # DDP's mean of integers truncates (Lightning divides the summed count of an
                # epoch-level mean by the ranks in place): unequal batches make odd sums
                tensor = tensor.to(torch.float64)
            return super().reduce(tensor, group=group, reduce_op=reduce_op)

    @override
    def barrier(self, name: str | None = None) -> None:
        with self.guarded(f"the barrier {name!r}" if name else "a barrier"):
            super().barrier(name)

    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        trainer = self.lightning_module.trainer
        self.timer.break_cycle()  # validation is no training step's cost
        if trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking:
            self.training_mode.on_validation_start()

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        self.training_mode.on_train_end()

    # ---------------------------------------------------------------- checkpoints, faults
    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        self.training_mode.before_model_state()
        return super().lightning_module_state_dict()

    @override
    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        state = self.training_mode.optimizer_state(optimizer)
        return super().optimizer_state(optimizer) if state is None else state

    @override
    def on_exception(self, exception: BaseException) -> None:
        self.training_mode.on_exception(exception)
        super().on_exception(exception)
        name_unused_parameters_fix(exception, type(self).__name__)

    @override
    def teardown(self) -> None:
        self.training_mode.teardown()
        if self._user_loop_counts is not None:
            set_loop_counts(*self._user_loop_counts)
            self._user_loop_counts = None
        if self._undo_validation is not None:
            self._undo_validation()
            self._undo_validation = None
        while self._undo:
            self._undo.pop()()
        super().teardown()
