"""The hetero half of a strategy, mixed into a Lightning parallel strategy.

``HeteroEngine`` is everything ``HeteroStrategy`` (DDP) and ``HeteroFSDPStrategy``
(FSDP2) share: the plan state, the re-planner, the training mode the Lightning hooks are
handed to, the training loader of each rank and the weighted reduction of logged values.
Each strategy adds its constructor and how it wraps the model.
"""

from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, fields
from typing import Any, ClassVar, Literal

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.utils.data import DataLoader, IterableDataset
from typing_extensions import override

from lightning_hetero._comm import CudaStepTimer, HostStepTimer
from lightning_hetero._data import (
    check_training_loader,
    epoch_order,
    refuse_several_training_loaders,
    refuse_step_counting,
    refuse_unequal_steps,
    with_batch_sampler,
)
from lightning_hetero._lightning import (
    around_loop_backward,
    around_precision_backward,
    at_last_batch,
    check_own_sigterm_only,
    in_training_batch,
    name_unused_parameters_fix,
    put_back_training_loader,
    request_train_reload,
    sampler_epoch,
    time_sigterm_broadcast,
)
from lightning_hetero._probes import StepProbe, check_probe_options
from lightning_hetero.callback import HeteroCallback
from lightning_hetero.collectives import Collectives, destroy_at_exit, is_mean, weighted_mean_
from lightning_hetero.context import RunContext
from lightning_hetero.emulate import Throttle
from lightning_hetero.microbatch import (
    FirstSamples,
    MicroBatches,
    check_micro_batch_size,
    micro_bounds,
    own_collectives,
)
from lightning_hetero.modes import Mode, ModeOptions, build_mode
from lightning_hetero.plan_state import PlanState, check_plan_options
from lightning_hetero.planning import BatchLimits, Controller, StepTimeGuard
from lightning_hetero.planning.dual import DualBatchPlan
from lightning_hetero.replan import REPLAN_BUDGET_DEFAULT, Replanner, check_replan_options
from lightning_hetero.resources import gather_capacities
from lightning_hetero.streaming import set_rank_variables, unset_rank_variables

__all__ = ["MODE_OPTIONS", "HeteroEngine", "HeteroOptions", "hetero_parts"]


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
    replan_budget: float | None = REPLAN_BUDGET_DEFAULT
    first_boundary: Literal["auto"] | int | None = "auto"
    shuffle: bool = True

    @classmethod
    def pick(cls, arguments: dict[str, Any]) -> "HeteroOptions":
        """These options out of a constructor's ``locals()``."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls)})


#: The modes' own options (``ModeOptions``' fields but the shared ones): keywords of
#: ``HeteroStrategy``, picked into its ``ModeOptions``; ``HeteroFSDPStrategy`` refuses them.
MODE_OPTIONS = tuple(
    f.name for f in fields(ModeOptions) if f.name not in {g.name for g in fields(HeteroOptions)}
)


def hetero_parts(
    mode: str,
    options: ModeOptions,
    shared: HeteroOptions,
    modes: dict[str, type[Mode]] | None = None,
) -> tuple[Mode, PlanState]:
    """Check a strategy's hetero options and build its mode and plan state (before the
    Lightning strategy is built, so that bad input fails first). ``modes``: the engine's
    registry (default: DDP's)."""
    check_replan_options(
        shared.deadband,
        shared.smoothing,
        options.adjust_every,
        shared.replan_budget,
        shared.first_boundary,
    )
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


def _batch_norm_minimum(module: torch.nn.Module | None) -> int:
    """The smallest batch ``module`` trains on: 2 with BatchNorm (a batch of one has no
    variance: BatchNorm refuses to train on it), else 1."""
    batch_norm = module is not None and any(isinstance(m, _BatchNorm) for m in module.modules())
    return 2 if batch_norm else 1


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
    #: The executor of a step's micro-batches (a strategy whose micro-batches hold something
    #: across a step gives its own: ``HeteroFSDPStrategy``).
    micro_batches_class: ClassVar[type[MicroBatches]] = MicroBatches

    def _start_hetero(
        self, training_mode: Mode, plan_state: PlanState, shared: HeteroOptions
    ) -> None:
        """Keep the options as given and build the objects that hold what a run learns."""
        self.shuffle, self.smoothing = shared.shuffle, shared.smoothing
        self.adjust_every, self.deadband = shared.adjust_every, shared.deadband
        self.memory_safety, self.probe_batch_sizes = shared.memory_safety, shared.probe_batch_sizes
        self.revert_slower, self.replan_budget = shared.revert_slower, shared.replan_budget
        self.first_boundary = shared.first_boundary
        self.training_mode = training_mode
        self.plan_state = plan_state
        # the objective it checks, one step time for every rank, exists in lock-step modes
        steps_together = training_mode.steps_together
        guard = StepTimeGuard() if shared.revert_slower and steps_together else None
        self.replanner = Replanner(
            training_mode,
            shared.smoothing,
            shared.adjust_every,
            guard=guard,
            replan_budget=shared.replan_budget,
            first_boundary=shared.first_boundary,
        )
        self.memory_probe = None
        #: The most samples a rank puts through the model at once, as given.
        self.micro_batch_size = shared.micro_batch_size
        #: Each rank's micro-batch bound, once known (set-up; ``"auto"``: the memory probe).
        self.micro_bounds: list[int] | None = None
        #: Samples of the micro-batch running now (``None`` outside micro-batched steps).
        self.micro_batch_samples: int | None = None
        #: Runs each training step's micro-batches (see ``MicroBatches``).
        self.micro = self.micro_batches_class(self)
        #: The run the re-planner, the mode and the probes work in (made at set-up).
        self.context: RunContext | None = None
        self._optimizers_ready = False  # set-up has built the optimizers
        # what set-up changed outside the strategy (environment variables, the Trainer's
        # callbacks), undone at teardown: the process is left as it was found
        self._undo: list[Callable[[], None]] = []
        #: The Trainer, the training loader this strategy made and the one Lightning gave it.
        self._training_loaders: tuple[pl.Trainer, DataLoader, Any] | None = None
        self._reload_after_setup = False  # the training data was loaded before that

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
        return self.training_mode.merges

    @property
    def server(self) -> Any:
        """The parameter server (async mode, rank 0 only, while training)."""
        return self.training_mode.server

    @property
    def dual_plan(self) -> DualBatchPlan | None:
        """Dual batch size learning: the plan being run (``None`` for other controllers)."""
        return self.training_mode.dual_plan

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
        [`RunContext`][lightning_hetero.engine.RunContext])."""
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
        self.plan_state.default_min = _batch_norm_minimum(self.lightning_module)
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
        # the mode's backward (its loss weighting) inside the precision plugin's, and each
        # step's micro-batches around the automatic optimization's (Lightning's hooks in it):
        # `Strategy.backward` stays Lightning's own
        self._undo.append(
            around_precision_backward(self, lambda *args: self.training_mode.backward(*args))
        )
        self._undo.append(around_loop_backward(trainer, self.micro.backward))
        if not self.training_mode.steps_together and self._layer_sync is not None:
            raise ValueError(
                f"{self.training_mode.option_text()} does not synchronize ranks at every step;"
                " SyncBatchNorm (`sync_batchnorm=True`) needs mode='bsp'."
            )
        self.micro.take_over(trainer)
        self.training_mode.setup_environment()

    @override
    def setup(self, trainer: "pl.Trainer") -> None:
        fitting = trainer.state.fn == TrainerFn.FITTING
        state = self.plan_state
        # `configure_model` may have added layers since
        self.plan_state.default_min = _batch_norm_minimum(self.lightning_module)
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
            # a per-step broadcast would tie the ranks again (put back at teardown)
            self._undo.append(check_own_sigterm_only(trainer))
        else:
            # under Lightning's own accumulation the ranks meet there at every loader batch,
            # not only in the all-reduce: that wait is no compute
            self._undo.append(time_sigterm_broadcast(trainer, self._context().timer.waiting))
        if self.micro_batch_size is not None or state.accumulation > 1:
            self.micro.check(trainer)

    def _lightning_setup(self, trainer: "pl.Trainer") -> None:
        """The Lightning strategy's own ``setup`` (a strategy replaces it where Lightning's
        would refuse what the strategy supports: ``HeteroFSDPStrategy``)."""
        super().setup(trainer)

    # ---------------------------------------------------------------- data
    @override
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer
        if trainer.state.stage != RunningStage.TRAINING:
            return dataloader  # validation, test and predict keep Lightning's sharding
        if self.world_size == 1 and isinstance(
            getattr(dataloader, "dataset", None), IterableDataset
        ):
            return dataloader  # one rank: nothing to split, the stream runs as it is
        seed = check_training_loader(dataloader)
        assert isinstance(dataloader, DataLoader)
        state = self.plan_state
        cut = None  # the epoch's samples, where `limit_train_batches` cuts it (taken over)
        if state.accumulation > 1:  # the loader batch is what a rank held under DDP
            self.micro_bounds = [dataloader.batch_size or 1] * self.world_size
            cut = self.micro.loop_counts(trainer, dataloader)
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
        # the epoch Lightning's `set_epoch` will give it: a loader of unknown length (local
        # mode's) is drawn from before that call when a run resumes at an epoch's end
        epochs.set_epoch(sampler_epoch(trainer))
        if cut is not None:
            epochs = FirstSamples(epochs, cut)
        # every batch, the last of an epoch or mega-batch too, has at least the lower bound
        sampler = self.training_mode.batch_sampler(
            epochs, plan, dataloader.drop_last, state.lower()
        )
        if self.training_mode.even_steps:
            refuse_unequal_steps([int(row[0]) for row in self.gather_rows([len(sampler)])])
        loader = with_batch_sampler(dataloader, sampler)
        self._training_loaders = (trainer, loader, dataloader)  # put back at teardown
        return loader

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
        # as training's micro-batches), so that its bound is a micro-batch's
        held = micro_auto and self.micro_batches_hold_more

        def training_step(batch: Any, batch_idx: int) -> Any:
            if sharded:  # the probe's own batch (held: around it, `MicroBatches.forward`)
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
            micro=self.micro.forward if held else None,
            micro_failed=self.micro.failed if held else None,
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
                lower=state.lower(),
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
        self.micro.plan_step(batch_idx)

    @override
    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        # Every backward of a step is timed (manual optimization may run several); the step
        # ends at its last backward or optimizer step, see `HostStepTimer`.
        self.training_mode.post_backward()

    @override
    def training_step(self, *args: Any, **kwargs: Any) -> Any:
        """Lightning's training step; with micro-batches, that of the step's first micro-batch
        (the others run after its backward, see ``MicroBatches``)."""
        sizes = self.micro.sizes()
        if sizes is None:
            with self.micro.whole():
                return self._training_step(*args, **kwargs)
        return self.micro.first(sizes, args, kwargs)

    def _training_step(self, *args: Any, **kwargs: Any) -> Any:
        """One Lightning training step on the batch given (a strategy replaces it where the
        step runs otherwise: ``HeteroFSDPStrategy``)."""
        return super().training_step(*args, **kwargs)

    @override
    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Any,
        model: "pl.LightningModule | torch.nn.Module | None" = None,
        **kwargs: Any,
    ) -> Any:
        run = super().optimizer_step
        closure = self.micro.after(closure, optimizer)
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
        if self.micro.syncs_locally():
            # a micro-batch before this rank's last: ranks run different numbers of them, so
            # the step's values are synced in each rank's last micro-batch only (what DDP
            # logs on a step is its last accumulated batch's value, synced)
            return tensor
        if (
            not self.training_mode.even_steps
            and self.comm.distributed
            and in_training_batch(self.lightning_module)
        ):
            # ranks make different numbers of steps: a collective on a step would pair with
            # another rank's later step, or wait for one that never comes
            raise RuntimeError(
                f"{self.training_mode.option_text()} gives ranks different numbers of steps per"
                " epoch, so a value logged with `self.log(..., sync_dist=True)` in"
                " `training_step` (or another reduction during a training batch) cannot be"
                " synced on the step: log it with `on_step=False, on_epoch=True` or"
                " `sync_dist=False`, or sync it at the epoch's end."
            )
        with self.timer.waiting(), own_collectives():
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
            self.training_mode.on_validation_start(at_last_batch(trainer))

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
        self.micro.teardown()
        if self._training_loaders is not None:
            put_back_training_loader(*self._training_loaders)
            self._training_loaders = None
        while self._undo:
            self._undo.pop()()
        super().teardown()
