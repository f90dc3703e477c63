"""HeteroStrategy: DDP in which every rank gets its own batch size."""

import math
import os
import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import contextmanager
from datetime import timedelta
from typing import TYPE_CHECKING, Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from lightning.pytorch.trainer.states import RunningStage, TrainerFn
from lightning.pytorch.utilities import CombinedLoader
from lightning.pytorch.utilities.exceptions import SIGTERMException
from lightning.pytorch.utilities.rank_zero import rank_zero_info, rank_zero_warn
from torch.nn.modules.batchnorm import _BatchNorm
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    SequentialSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler
from typing_extensions import override

from lightning_hetero._comm import (
    CudaStepTimer,
    HostStepTimer,
    WeightedHookState,
    weighted_allreduce_hook,
)
from lightning_hetero._lightning import in_training_batch, request_train_reload
from lightning_hetero._namespaces import LateBinding
from lightning_hetero._optim import optimizer_params, scaled_lr
from lightning_hetero.cursor import MegaBatchSampler, SharedCursor
from lightning_hetero.emulate import Throttle
from lightning_hetero.localsgd import ReplicaMerger, weighted_average_
from lightning_hetero.memory_probe import auto_max_batch_size, preserved_state
from lightning_hetero.paramserver import ParameterServer, ServerClient
from lightning_hetero.planning import (
    BatchLimits,
    Controller,
    PlanError,
    check_merge_options,
    check_plan,
    make_controller,
    merge_weights,
    probe_sizes,
    proportional_split,
)
from lightning_hetero.planning.dual import (
    DualBatchController,
    DualBatchPlan,
    TimeModel,
    plan_dual_batch,
)
from lightning_hetero.planning.split import expand_bound, is_count
from lightning_hetero.resources import available_cores, flops_or_nan
from lightning_hetero.sampler import EpochPermutation, GlobalBatchSampler, PartitionBatchSampler

if TYPE_CHECKING:
    from lightning_hetero.callback import HeteroCallback

__all__ = ["HeteroStrategy"]


@contextmanager
def _patched(obj: object, attributes: dict[str, Any]) -> Iterator[None]:
    """Set instance attributes for the duration of the block (e.g. silence ``self.log``)."""
    for name, value in attributes.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name in attributes:
            delattr(obj, name)


def _add_note(error: BaseException, note: str) -> None:
    """Attach ``note`` to ``error``'s message (``add_note`` where Python has it)."""
    if hasattr(error, "add_note"):
        error.add_note(note)
    else:  # Python 3.10
        error.args = (f"{error.args[0] if error.args else ''}\n{note}", *error.args[1:])


def _smallest(bound: int | list[int] | None) -> int | None:
    """The smallest of per-rank bounds (one int for all ranks, or none)."""
    return min(bound) if isinstance(bound, list) else bound


_MODES = ("bsp", "async", "local")
_INITIAL_PLANS = ("uniform", "cores", "flops")


class HeteroStrategy(LateBinding, DDPStrategy):
    """Data-parallel training where each rank's batch size follows its speed.

    The global batch ``B`` stays fixed; rank ``k`` trains on ``b_k`` samples per step,
    gradients are combined with weights ``b_k / B`` (exactly the gradient of the mean
    loss over ``B`` samples), and a controller re-plans the split from measured
    compute times so that fast ranks stop waiting for slow ones.

    Args:
        mode: ``"bsp"``: synchronous, gradients all-reduced with weights ``b_k / B``.
            ``"async"``: a parameter server in rank 0's process applies each rank's gradient
            as it arrives, with learning rate ``lr * b_k / B``; ranks never wait for each
            other within an epoch. ``"local"``: local SGD; each rank steps its own replica
            on batches claimed from a shared pool of ``megabatch_size`` samples, and the
            replicas are merged after each mega-batch (see the README for details).
        controller: a controller name (``"proportional"``, ``"lbbsp"``, ``"stepwise"``,
            ``"updates"``, ``"static"``; built with ``deadband``; ``"dual"``, dual batch
            size learning, with ``mode="async"`` only) or a
            :class:`~lightning_hetero.planning.Controller` instance. Default:
            ``"updates"`` in local mode, ``"proportional"`` otherwise.
        batch_sizes: the initial plan: ``"uniform"``, ``"cores"`` (CPU cores each rank's
            process may use), ``"flops"`` (GPU SMs x clock via NVML, falling back to
            cores), or one batch size per rank.
        global_batch_size: ``B``; default: the sum of an explicit plan, else the training
            loader's ``batch_size`` times the world size.
        min_batch_size: smallest batch any rank may get, in every step including the
            epoch's last, smaller one (padded with the epoch's first samples when too few are
            left, as DDP's sampler pads). Default: 2 for a model with BatchNorm layers (which
            cannot train on a batch of one), else 1.
        max_batch_size: largest batch any rank may get (default: no limit but ``B``): one
            number, one per rank, or ``"auto"``: before training each rank measures the
            peak memory of real training steps (forward, backward, optimizer step) at a
            few batch sizes, fits ``memory = fixed + per_sample * b`` and takes the
            largest ``b`` whose prediction stays under ``memory_safety`` of its free memory
            (the GPU's on CUDA; on CPU the host's, split among the ranks on the host).
            Model, optimizer and random state are put back after the probe.
        memory_safety: fraction of the free memory ``max_batch_size="auto"`` plans for, in
            ``(0, 1]``.
        probe_batch_sizes: batch sizes ``max_batch_size="auto"`` probes (default: four
            sizes doubling up to ``B``); sizes that would not fit are skipped or caught.
        deadband: how much better a new plan must be before the plan changes (controllers
            built by name; each controller's docstring says what it compares).
        smoothing: EWMA factor of step times, in ``[0, 1)``; 0 keeps only the last step.
        adjust_every: re-plan at each ``"epoch"`` end or every N training batches.
        weighted: weight gradients by ``b_k / B``; ``False`` gives DDP's plain mean
            (inexact with unequal batches; for ablations only). BSP mode only.
        shuffle: draw a new permutation of the training set every epoch (seeded by
            ``seed_everything``, the same on every rank), as ``DDPStrategy``'s sampler does
            whatever the loader says; ``False`` keeps the dataset's own order.
        lr_scaling: async mode: apply rank ``k``'s gradient with learning rate
            ``lr * b_k / B`` (paper 002 Eq. 5b); ``False`` uses ``lr`` (for ablations).
            Local mode: step rank ``k``'s replica with ``lr * b_k * K / B`` (the linear
            scaling rule around an even split of ``B`` over ``K`` ranks); ``False`` uses
            ``lr`` on every rank.
        rpc_timeout: async mode: seconds a push or pull to the parameter server may take
            before the rank stops with an error naming it.
        timeout: how long a collective waits for every rank (``DDPStrategy``'s option). A rank
            that hangs or dies stops the others after this long; their error names the
            operation (e.g. the gradient all-reduce in backward) and this option.
        megabatch_size: local mode: samples claimed between two merges (default: ten
            global batches); must be at least ``B``.
        delta: local mode: perturbation factor of the merge weights of the replicas with the
            most and the fewest updates, in ``[0, 1)``; 0 turns perturbation off.
        perturb_threshold: local mode: perturb only when every replica's L2 norm per
            parameter is below this (``> 0``).
        gamma: local mode: merge momentum in ``[0, 1)``: the merged model is
            ``sum_k alpha_k w_k + gamma * (w - w_prev)``; 0 (default) is plain weighted
            averaging. ``gamma > 0`` is heavy-ball momentum on the merges: a steady move is
            amplified up to ``1 / (1 - gamma)`` times (10x at the paper's 0.9), so it needs
            a learning rate about ``(1 - gamma)`` times the one tuned for ``gamma=0``, many
            merges (a small ``megabatch_size``) and ``delta=0``; see the README.
        **kwargs: forwarded to :class:`~torch.nn.parallel.DistributedDataParallel`
            (e.g. ``find_unused_parameters=True``), as with ``DDPStrategy``.

    The positional arguments are those of :class:`~lightning.pytorch.strategies.DDPStrategy`,
    in its order; the options above are keyword-only. DDP communication hooks and
    post-local-SGD cannot be combined with this strategy: it installs its own hook.

    The plan is made when Lightning loads the training data at the start of ``fit``, after
    the optimizers exist. A ``configure_optimizers`` that reads
    ``trainer.estimated_stepping_batches`` makes Lightning load it earlier, inside ``setup``:
    that loader gets the real number of steps, and the data is loaded again at the usual
    point, where the plan is made as in any other run.
    """

    strategy_name = "hetero"

    def __init__(
        self,
        accelerator: "pl.accelerators.Accelerator | None" = None,
        parallel_devices: list[torch.device] | None = None,
        cluster_environment: ClusterEnvironment | None = None,
        checkpoint_io: CheckpointIO | None = None,
        precision_plugin: Precision | None = None,
        ddp_comm_state: object | None = None,
        ddp_comm_hook: Callable | None = None,
        ddp_comm_wrapper: Callable | None = None,
        model_averaging_period: int | None = None,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        start_method: Literal["popen", "spawn", "fork", "forkserver"] = "popen",
        *,
        mode: Literal["bsp", "async", "local"] = "bsp",
        controller: str | Controller | None = None,
        batch_sizes: str | list[int] = "uniform",
        global_batch_size: int | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | list[int] | Literal["auto"] | None = None,
        memory_safety: float = 0.9,
        probe_batch_sizes: list[int] | None = None,
        deadband: float = 0.05,
        smoothing: float = 0.8,
        adjust_every: Literal["epoch"] | int = "epoch",
        weighted: bool = True,
        shuffle: bool = True,
        lr_scaling: bool = True,
        rpc_timeout: float = 300.0,
        megabatch_size: int | None = None,
        delta: float = 0.1,
        perturb_threshold: float = 0.1,
        gamma: float = 0.0,
        **kwargs: Any,
    ) -> None:
        if mode not in _MODES:
            raise ValueError(f"Unknown mode {mode!r}; expected one of {list(_MODES)}.")
        if mode != "bsp" and not weighted:
            raise ValueError(
                f"`weighted=False` is a BSP ablation; mode={mode!r} weights each rank by its"
                " batch share (use `lr_scaling=False` for the unscaled ablation)."
            )
        if mode != "bsp" and adjust_every != "epoch":
            raise ValueError(
                f"mode={mode!r} re-plans at epoch boundaries"
                + (" and after every mega-batch" if mode == "local" else "")
                + f"; `adjust_every` must be 'epoch', got {adjust_every!r}."
            )
        if not rpc_timeout > 0:
            raise ValueError(f"`rpc_timeout` must be > 0 seconds, got {rpc_timeout}.")
        check_merge_options(delta, gamma, perturb_threshold, megabatch_size, global_batch_size)
        ddp_options = {
            "ddp_comm_state": ddp_comm_state,
            "ddp_comm_hook": ddp_comm_hook,
            "ddp_comm_wrapper": ddp_comm_wrapper,
            "model_averaging_period": model_averaging_period,
        }
        forbidden = [name for name, value in ddp_options.items() if value is not None]
        if forbidden:
            raise ValueError(
                f"HeteroStrategy installs its own weighted communication hook; {forbidden}"
                " cannot be combined with it."
            )
        if min_batch_size is not None and not is_count(min_batch_size):
            raise ValueError(
                f"`min_batch_size` must be an integer >= 1 or None, got {min_batch_size!r}."
            )
        lowest = min_batch_size or 1
        if isinstance(max_batch_size, str) and max_batch_size != "auto":
            raise ValueError(
                f"`max_batch_size` must be an integer, a list, 'auto' or None, got"
                f" {max_batch_size!r}."
            )
        uppers = [max_batch_size] if isinstance(max_batch_size, int) else max_batch_size
        if isinstance(uppers, list) and any(hi < lowest for hi in uppers):
            raise ValueError(
                f"`min_batch_size` ({min_batch_size}) must not exceed `max_batch_size`"
                f" ({max_batch_size})."
            )
        if not 0.0 < memory_safety <= 1.0:
            raise ValueError(f"`memory_safety` must be in (0, 1], got {memory_safety}.")
        if probe_batch_sizes is not None and (
            len(set(probe_batch_sizes)) < 2 or min(probe_batch_sizes) < 1
        ):
            raise ValueError(
                "`probe_batch_sizes` needs at least two distinct sizes >= 1, got"
                f" {probe_batch_sizes}."
            )
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"`deadband` must be in [0, 1), got {deadband}.")
        if not 0.0 <= smoothing < 1.0:
            raise ValueError(f"`smoothing` must be in [0, 1), got {smoothing}.")
        if adjust_every != "epoch" and not is_count(adjust_every):
            raise ValueError(
                f"`adjust_every` must be 'epoch' or an integer >= 1, got {adjust_every!r}."
            )
        if global_batch_size is not None and global_batch_size < 1:
            raise ValueError(f"`global_batch_size` must be >= 1, got {global_batch_size}.")
        if isinstance(batch_sizes, str):
            if batch_sizes not in _INITIAL_PLANS:
                raise ValueError(
                    f"Unknown initial plan {batch_sizes!r}; expected one of {list(_INITIAL_PLANS)}"
                    " or a list with one batch size per rank."
                )
        else:
            size = len(batch_sizes)
            batch_sizes = check_plan(
                batch_sizes,
                size,
                total=global_batch_size,
                lower=[lowest] * size,
                upper=expand_bound(max_batch_size, size, sum(batch_sizes))
                if max_batch_size not in (None, "auto")
                else None,
            )
        if controller is None:
            controller = "updates" if mode == "local" else "proportional"
        if isinstance(controller, str):
            controller = make_controller(controller, deadband=deadband)
        elif not isinstance(controller, Controller):
            raise TypeError(
                "`controller` must be a name or a Controller instance,"
                f" got {type(controller).__name__}."
            )
        if isinstance(controller, DualBatchController):
            if mode != "async":
                raise ValueError(
                    "Dual batch size learning runs on the parameter server: use"
                    f" mode='async' with controller='dual', got mode={mode!r}."
                )
            if not lr_scaling:
                raise ValueError(
                    "With controller='dual' the server scales updates by the model-update"
                    " factor, not by b_k / B; for the unscaled ablation use"
                    " DualBatchController(update_factor='none') instead of lr_scaling=False."
                )
        super().__init__(
            accelerator=accelerator,
            parallel_devices=parallel_devices,
            cluster_environment=cluster_environment,
            checkpoint_io=checkpoint_io,
            precision_plugin=precision_plugin,
            process_group_backend=process_group_backend,
            timeout=timeout,
            start_method=start_method,
            **kwargs,
        )
        self.mode = mode
        self.shuffle = shuffle
        self.controller: Controller = controller
        self.smoothing = smoothing
        self.adjust_every = adjust_every
        self.weighted = weighted
        self.lr_scaling = lr_scaling
        self.rpc_timeout = rpc_timeout
        self.megabatch_size = megabatch_size
        self.delta = delta
        self.perturb_threshold = perturb_threshold
        self.gamma = gamma
        #: The parameter server (async mode, rank 0 only, while training).
        self.server: ParameterServer | None = None
        self._client: ServerClient | None = None
        self._pushes = 0
        self._seen_version = 0
        self._share = (1, 1)
        self._merger: ReplicaMerger | None = None
        self._cursor: SharedCursor | None = None
        self._run_id = ""
        self._next_merge = 0  # local mode: the next mega-batch of the epoch to merge
        self._megabatch_updates = 0
        self._failed = False
        self._initial_plan = batch_sizes
        self._global_batch_size = global_batch_size
        self._min_batch_size = min_batch_size
        self._max_batch_size = max_batch_size
        self.memory_safety = memory_safety
        self.probe_batch_sizes = probe_batch_sizes
        #: What ``max_batch_size="auto"`` found on this rank: the bound and the fitted model.
        self.memory_probe: dict[str, Any] | None = None
        self._plan: list[int] | None = None
        self._limits: BatchLimits | None = None
        self._capacities: list[float] | None = None
        self._restored_plan: list[int] | None = None
        self._restored_weights: list[float] | None = None
        self._optimizers_ready = False  # set-up has built the optimizers
        self._reload_after_setup = False  # the training data was loaded before that
        self.sampler: GlobalBatchSampler | MegaBatchSampler | PartitionBatchSampler | None = None
        #: Dual batch size learning: the plan being run (``None`` for other controllers).
        self.dual_plan: DualBatchPlan | None = None
        self._input_scale = 1.0  # per-sample input size relative to the planned-for size
        self._scaled_global: int | None = None  # a global batch set by `set_input_scale`
        self._base_global: int | None = None  # the global batch at input scale 1
        self._rescale_pending = False
        self._dual_reference: DualBatchPlan | None = None  # the dual plan at input scale 1
        self.history: list[dict[str, Any]] = []
        #: Local mode: one record per merge (weights, update counts, perturbation).
        self.merges: list[dict[str, Any]] = []
        self._timer: HostStepTimer = HostStepTimer()
        self._hook_state: WeightedHookState | None = None

    # ---------------------------------------------------------------- public state
    @property
    def batch_sizes(self) -> list[int]:
        """The current plan, one batch size per global rank (empty until it is known)."""
        if self._plan is not None:
            return list(self._plan)
        return list(self._initial_plan) if isinstance(self._initial_plan, list) else []

    @property
    def limits(self) -> BatchLimits | None:
        """The global batch and per-rank bounds, once the training loader has been seen."""
        return self._limits

    # ---------------------------------------------------------------- setup
    @override
    def setup_environment(self) -> None:
        super().setup_environment()
        if isinstance(self._initial_plan, list) and len(self._initial_plan) != self.world_size:
            raise PlanError(
                f"`batch_sizes` has {len(self._initial_plan)} entries but there are"
                f" {self.world_size} ranks: give one batch size per rank."
            )
        if self._global_batch_size is not None or isinstance(self._initial_plan, list):
            total = self._global_batch_size or sum(self._initial_plan)
            BatchLimits.build(self.world_size, total, self._lower_bound(), self._upper_bound())
        if self.lightning_module is None:
            return  # a bare strategy, e.g. for its collectives, as DDPStrategy allows
        from lightning_hetero.callback import HeteroCallback

        trainer = self.lightning_module.trainer
        if not any(isinstance(cb, HeteroCallback) for cb in trainer.callbacks):
            trainer.callbacks.append(HeteroCallback())
        if trainer.state.fn != TrainerFn.FITTING or self.mode == "bsp":
            return
        if self._layer_sync is not None:
            raise ValueError(
                f"mode={self.mode!r} does not synchronize ranks at every step; SyncBatchNorm"
                " (`sync_batchnorm=True`) needs mode='bsp'."
            )
        self._failed = False
        environment = self.cluster_environment
        assert environment is not None
        if self.mode == "async":
            ServerClient.init_rpc(
                self.global_rank, self.world_size, environment.main_address, self.rpc_timeout
            )
            self._client = ServerClient(self.global_rank, self.rpc_timeout)
        else:
            self._cursor = SharedCursor.connect(environment.main_address, environment.main_port)
            run_id = [os.urandom(6).hex() if self.global_rank == 0 else None]
            torch.distributed.broadcast_object_list(run_id, src=0)
            self._run_id = str(run_id[0])

    @override
    def setup(self, trainer: "pl.Trainer") -> None:
        self._timer = CudaStepTimer() if self.root_device.type == "cuda" else HostStepTimer()
        fitting = trainer.state.fn == TrainerFn.FITTING
        if fitting and self._initial_plan in ("cores", "flops") and self._capacities is None:
            self._capacities = self._gather_capacities(self._initial_plan)
        # Wraps the model in DDP, registers the hook and builds the optimizers; a
        # `configure_optimizers` that reads `trainer.estimated_stepping_batches` makes Lightning
        # load the training data in here, before the optimizers exist.
        self._optimizers_ready = False
        super().setup(trainer)
        self._optimizers_ready = True
        if not fitting:
            return
        if self._reload_after_setup:
            # that early loader served for its length; the plan is made when Lightning loads
            # the data again at its usual point, as in any other run
            self._reload_after_setup = False
            request_train_reload(trainer)
        if self.mode == "local" or self._dual is not None:
            self._check_uneven_steps_trainer(trainer)
        if self.mode != "bsp":
            self._drop_per_step_broadcast(trainer)

    def _gather_capacities(self, kind: str) -> list[float]:
        local = [available_cores(), flops_or_nan(self.root_device) if kind == "flops" else 0.0]
        rows = self.gather_rows(local)
        if kind == "flops":
            flops = [row[1] for row in rows]
            if all(math.isfinite(f) and f > 0 for f in flops):
                return flops
            rank_zero_warn(
                "batch_sizes='flops' needs every rank on a CUDA device readable through NVML;"
                f" got {flops}. Using CPU cores instead."
            )
        return [row[0] for row in rows]

    @staticmethod
    def _drop_per_step_broadcast(trainer: "pl.Trainer") -> None:
        # Lightning >= 2.6 broadcasts rank 0's SIGTERM flag before every training step: a
        # collective that would tie async ranks to rank 0's pace, and deadlock local mode,
        # where ranks make different numbers of steps. Each rank checks its own flag instead.
        loop = trainer.fit_loop.epoch_loop
        if not hasattr(loop, "_broadcast_sigterm_tensor"):
            return

        def check_own_sigterm() -> None:
            if getattr(trainer, "received_sigterm", False):
                raise SIGTERMException()

        loop._broadcast_sigterm_tensor = check_own_sigterm

    @property
    def _dual(self) -> DualBatchController | None:
        controller = self.controller
        return controller if isinstance(controller, DualBatchController) else None

    def _check_uneven_steps_trainer(self, trainer: "pl.Trainer") -> None:
        # Ranks run different numbers of steps per epoch in local mode and with dual batch
        # sizes: anything counted in steps would stop or validate ranks at different points
        # and leave the others waiting.
        problems = []
        if trainer.max_steps != -1:
            problems.append(f"max_steps={trainer.max_steps}")
        if trainer.limit_train_batches not in (1.0, None):
            problems.append(f"limit_train_batches={trainer.limit_train_batches}")
        if trainer.val_check_interval != 1.0:
            problems.append(f"val_check_interval={trainer.val_check_interval}")
        if problems:
            what = "mode='local'" if self.mode == "local" else "controller='dual'"
            raise ValueError(
                f"{what} gives ranks different numbers of steps per epoch, so training is"
                f" counted in epochs only; remove {', '.join(problems)} from the Trainer."
            )

    @override
    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        if self.mode == "bsp":
            return super()._setup_model(model)
        return model  # no DDP: async pushes gradients to the server, local keeps replicas

    @override
    def _register_ddp_hooks(self) -> None:
        if self.mode != "bsp":
            return
        # DDPStrategy registers hooks on CUDA only; ours must run on every device.
        assert isinstance(self.model, DistributedDataParallel)
        self._hook_state = WeightedHookState(
            process_group=None,
            world_size=self.world_size,
            timer=self._timer,
            weighted=self.weighted,
            weight=1.0 / self.world_size,  # plain mean until the first step sets b_k / B
        )
        self.model.register_comm_hook(self._hook_state, weighted_allreduce_hook)

    # ---------------------------------------------------------------- data
    @override
    def process_dataloader(self, dataloader: object) -> object:
        trainer = self.lightning_module.trainer
        if trainer.state.stage != RunningStage.TRAINING:
            return dataloader  # validation, test and predict keep Lightning's sharding
        if not isinstance(dataloader, DataLoader):
            raise TypeError(
                "HeteroStrategy needs the training data as a torch DataLoader over a map-style"
                f" dataset, got {type(dataloader).__name__}."
            )
        return self._slice_training_loader(dataloader)

    def _slice_training_loader(self, loader: DataLoader) -> DataLoader:
        """This rank's view of ``loader``: its slices of one shared permutation per epoch."""
        seed = self._check_training_loader(loader)
        if self._plan is None and not self._optimizers_ready:
            # Loaded inside `setup` (see there): Lightning needs only the number of steps,
            # which an even split of the same global batch already has.
            plan = self._provisional_plan(loader)
            self._reload_after_setup = True
        elif self._plan is None:
            plan = self._plan = self._first_plan(loader)
        else:
            if self._rescale_pending:
                self._apply_input_scale()
            plan = self._plan
        epoch_sampler = EpochPermutation(len(loader.dataset), shuffle=self.shuffle, seed=seed)
        lower = self._lower_bound()  # every batch, the last of an epoch or mega-batch too
        if self.dual_plan is not None:
            self.sampler = PartitionBatchSampler(
                epoch_sampler,
                self.dual_plan.samples,
                self.dual_plan.batch_sizes,
                rank=self.global_rank,
                drop_last=loader.drop_last,
                min_batch_size=lower,
            )
        elif self.mode == "local":
            assert self._cursor is not None
            megabatch = self.megabatch_size or 10 * sum(plan)
            check_merge_options(
                self.delta, self.gamma, self.perturb_threshold, megabatch, sum(plan)
            )
            self.sampler = MegaBatchSampler(
                epoch_sampler,
                self._cursor,
                plan[self.global_rank],
                megabatch,
                self._run_id,
                min_batch_size=lower,
            )
        else:
            self.sampler = GlobalBatchSampler(
                epoch_sampler,
                plan,
                rank=self.global_rank,
                drop_last=loader.drop_last,
                min_batch_sizes=[lower] * self.world_size,
            )
        if type(loader) is not DataLoader:
            rank_zero_warn(
                f"HeteroStrategy replaces the training {type(loader).__name__} by a plain"
                " DataLoader with the same dataset and options."
            )
        sliced = DataLoader(
            loader.dataset,
            batch_sampler=self.sampler,
            num_workers=loader.num_workers,
            collate_fn=loader.collate_fn,
            pin_memory=loader.pin_memory,
            timeout=loader.timeout,
            worker_init_fn=loader.worker_init_fn,
            multiprocessing_context=loader.multiprocessing_context,
            generator=loader.generator,
            prefetch_factor=loader.prefetch_factor,
            persistent_workers=loader.persistent_workers,
            pin_memory_device=loader.pin_memory_device,
        )
        if self.mode == "local" or self.dual_plan is not None:
            return sliced  # ranks make different numbers of steps
        lengths = [int(row[0]) for row in self.gather_rows([len(self.sampler)])]
        if len(set(lengths)) != 1:
            raise RuntimeError(
                f"Ranks disagree on the number of training steps per epoch ({lengths}); every rank"
                " must load the same training set."
            )
        return sliced

    def _check_training_loader(self, loader: DataLoader) -> int:
        """Refuse what one shared permutation cannot serve; returns the shuffling seed."""
        dataset = loader.dataset
        if isinstance(dataset, IterableDataset):
            raise TypeError(
                f"HeteroStrategy cannot split the training {type(dataset).__name__}: it is an"
                " IterableDataset, whose samples cannot be indexed, and HeteroStrategy slices one"
                " permutation of sample indices per epoch by rank speed. Wrap the data in a"
                " map-style Dataset (with __len__ and __getitem__), or train it with"
                " strategy='ddp'."
            )
        if type(loader.batch_sampler) is not BatchSampler:
            raise TypeError(
                "HeteroStrategy builds each rank's batches itself and cannot use the training"
                f" DataLoader's batch_sampler {type(loader.batch_sampler).__name__}; pass"
                " `batch_size` (and `drop_last`) to the DataLoader instead, or train with"
                " strategy='ddp' to keep it."
            )
        sampler = loader.sampler
        # Lightning wraps a custom sampler in a DistributedSamplerWrapper: name the user's own
        user_sampler = getattr(getattr(sampler, "dataset", None), "_sampler", sampler)
        if type(sampler) is DistributedSampler:
            return sampler.seed
        if type(user_sampler) in (RandomSampler, SequentialSampler):
            return int(os.environ.get("PL_GLOBAL_SEED", 0))
        name = type(user_sampler).__name__
        advice = (
            " To keep class balancing, weight the loss per class instead (e.g."
            " `CrossEntropyLoss(weight=...)`) or oversample in the dataset (a map-style Dataset"
            " that lists rare samples more than once)."
            if isinstance(user_sampler, WeightedRandomSampler)
            else " To keep its order, build it into the dataset (a map-style Dataset that"
            " indexes samples in that order) and pass HeteroStrategy(shuffle=False)."
        )
        raise TypeError(
            f"HeteroStrategy cannot keep the training DataLoader's sampler {name}: it draws each"
            " sample exactly once per epoch from one permutation shared by all ranks, sliced by"
            f" rank speed.{advice} Or train with strategy='ddp' to keep {name}."
        )

    def _provisional_plan(self, loader: DataLoader) -> list[int]:
        """An even split of this run's global batch, until the first plan is made."""
        self._base_global = self._global_batch(loader.batch_size)
        limits = self._scaled_limits()
        return proportional_split(
            [1.0] * self.world_size, limits.global_batch_size, limits.min_batch_size
        )

    def _first_plan(self, loader: DataLoader) -> list[int]:
        """Probe (``max_batch_size="auto"``, dual batch sizes) and make the first plan."""
        if self._max_batch_size == "auto" and self.memory_probe is None:
            self._probe_memory(loader)
        if self._dual is not None:
            return self._plan_dual(loader)
        return self._resolve_plan(loader.batch_size)

    def _refuse_several_training_loaders(self, trainer: "pl.Trainer") -> None:
        loaders = CombinedLoader(trainer.train_dataloader).flattened
        if len(loaders) > 1:
            raise TypeError(
                f"HeteroStrategy found {len(loaders)} training DataLoaders"
                f" ({type(trainer.train_dataloader).__name__} of"
                f" {', '.join(type(dl.dataset).__name__ for dl in loaders)}); it sizes one"
                " loader's batches by rank speed and weights gradients by that loader's shares,"
                " which several loaders of their own sizes would get wrong. Return one DataLoader"
                " from `train_dataloader` (e.g. a ConcatDataset or a Dataset that yields the"
                " parts of a sample together), or train with strategy='ddp'."
            )

    def _upper_bound(self) -> int | list[int] | None:
        """Per-rank maximums: as given, or as measured by ``max_batch_size="auto"``."""
        if self._max_batch_size != "auto":
            return self._max_batch_size
        if self.memory_probe is None:
            return None  # not measured yet
        return self.memory_probe["max_batch_sizes"]

    @contextmanager
    def _probing(
        self, loader: DataLoader, what: str, instead: str = ""
    ) -> Iterator[Callable[..., None]]:
        """Yield ``step(batch_size, timed=False)``, one real training step outside the loop.

        Model, optimizer and random state are put back afterwards and logging is silenced;
        ``instead`` completes the error for manual optimization with an alternative.
        ``timed=True`` runs what a worker's step costs without stepping the optimizer:
        forward, backward (with :class:`~lightning_hetero.emulate.Throttle`'s delay, as a
        slower device would take) and, in async mode, the push's round trip to rank 0.
        """
        module = self.lightning_module
        if not module.automatic_optimization:
            raise ValueError(
                f"{what} runs training steps itself and needs automatic optimization{instead}."
            )
        trainer = module.trainer
        dataset = loader.dataset
        optimizers = [*self.optimizers, *(c.scheduler for c in self.lr_scheduler_configs)]
        throttles = [cb for cb in trainer.callbacks if isinstance(cb, Throttle)]

        def step(batch_size: int, timed: bool = False) -> None:
            batch = loader.collate_fn([dataset[i] for i in range(batch_size)])
            batch = self.batch_to_device(batch)
            with self.precision_plugin.train_step_context():
                output = module.training_step(batch, 0)
            loss = output["loss"] if isinstance(output, dict) else output
            if not isinstance(loss, torch.Tensor):
                raise ValueError(
                    f"{what} needs `training_step` to return the loss (or a dict with 'loss'),"
                    f" got {type(output).__name__}."
                )
            if timed:
                for throttle in throttles:
                    throttle.on_train_batch_start(trainer, module, batch, 0)
                    throttle.on_before_backward(trainer, module, loss)
            loss.backward()
            if timed and self._client is not None:
                # async: a worker's step includes its push, gradients out and parameters back
                grads = [p.grad.detach().cpu() for p in module.parameters() if p.grad is not None]
                self._client.echo(grads)
            for optimizer in self.optimizers:
                if not timed:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        quiet = {"log": lambda *a, **k: None, "log_dict": lambda *a, **k: None}
        with preserved_state(module, optimizers), _patched(module, quiet):
            yield step

    def _probe_memory(self, loader: DataLoader) -> None:
        """``max_batch_size="auto"``: measure each rank's memory bound and gather them all."""
        total = self._global_batch_size or (loader.batch_size or 1) * self.world_size
        largest = min(total, len(loader.dataset))  # type: ignore[arg-type]
        sizes = self.probe_batch_sizes or probe_sizes(largest)
        device = self.root_device
        devices = self.parallel_devices or [device]
        # ranks sharing what the probe measures: the GPU on CUDA, the host's memory on CPU
        share = sum(d == device for d in devices) if device.type == "cuda" else len(devices)
        instead = "; set `max_batch_size` explicitly with manual optimization"
        with self._probing(loader, "max_batch_size='auto'", instead) as step:
            bound, model, result = auto_max_batch_size(
                step, sizes, device, safety=self.memory_safety, cap=total, share=share
            )
        if device.type == "cuda":
            torch.cuda.reset_peak_memory_stats(device)  # the probe's peak is not training's
        bound = total if bound is None else bound
        rows = self.gather_rows([bound, model.fixed_bytes, model.per_sample_bytes])
        self.memory_probe = {
            "max_batch_sizes": [int(row[0]) for row in rows],
            "fixed_bytes": [row[1] for row in rows],
            "per_sample_bytes": [row[2] for row in rows],
            "budget_bytes": result.budget_bytes / share,
            "relative_error": model.relative_error,
            "samples": list(result.samples),
        }
        if model.relative_error > 0.1:
            rank_zero_warn(
                f"max_batch_size='auto': the linear memory fit is off by up to"
                f" {model.relative_error:.0%} on rank 0's probe {list(result.samples)}."
            )
        rank_zero_info(
            "max_batch_size='auto': per-rank maximum batch sizes"
            f" {self.memory_probe['max_batch_sizes']} (probed {result.tried})."
        )

    def _global_batch(self, loader_batch_size: int | None) -> int:
        """``B`` at input scale 1: as given, the explicit plan's sum, or the loader's times K."""
        if self._global_batch_size is not None:
            return self._global_batch_size
        if isinstance(self._initial_plan, list):
            return sum(self._initial_plan)
        if loader_batch_size is None:
            raise ValueError("Set `global_batch_size` or the training DataLoader's `batch_size`.")
        return loader_batch_size * self.world_size

    def _lower_bound(self) -> int:
        """``min_batch_size``; by default 2 for a model with BatchNorm layers, else 1."""
        if self._min_batch_size is not None:
            return self._min_batch_size
        module = self.lightning_module
        # a batch of one has no variance: BatchNorm refuses to train on it
        batch_norm = module is not None and any(isinstance(m, _BatchNorm) for m in module.modules())
        return 2 if batch_norm else 1

    def _resolve_plan(self, loader_batch_size: int | None) -> list[int]:
        world_size = self.world_size
        initial = self._initial_plan
        total = self._base_global = self._global_batch(loader_batch_size)
        limits = self._limits = self._scaled_limits()
        total = limits.global_batch_size
        lower, upper = limits.min_batch_size, limits.max_batch_size
        if self._restored_plan is not None:
            restored = self._restored_plan
            if len(restored) == world_size and sum(restored) == total:
                return check_plan(restored, world_size, total, lower, upper)
            if len(restored) == world_size:
                # another global batch (e.g. another input scale): keep the saved proportions
                rank_zero_info(
                    f"hetero: the checkpoint's plan {restored} sums to {sum(restored)}; this run's"
                    f" global batch is {total}: splitting it in the same proportions."
                )
                return proportional_split(restored, total, lower, upper)
            weights = self._restored_weights
            if weights is not None and len(weights) == world_size:
                return proportional_split(weights, total, lower, upper)  # the callback warned
            rank_zero_warn(
                f"The checkpoint's plan {restored} does not fit {world_size} ranks and a global"
                f" batch of {total}; starting again from batch_sizes={initial!r}."
            )
        if isinstance(initial, list):
            if total != self._base_global:  # another input scale: the same proportions
                return proportional_split(initial, total, lower, upper)
            return check_plan(initial, world_size, total, lower, upper)
        if initial == "uniform":
            return proportional_split([1.0] * world_size, total, lower, upper)
        assert self._capacities is not None
        return proportional_split(self._capacities, total, lower, upper)

    def _scaled_upper(self) -> int | list[int] | None:
        """Per-rank maximums at the current input scale (memory per sample follows it)."""
        upper = self._upper_bound()
        if self._max_batch_size == "auto" and isinstance(upper, list) and self._input_scale != 1:
            return [max(1, math.floor(b / self._input_scale)) for b in upper]
        return upper

    def _scaled_limits(self) -> BatchLimits:
        """The limits at the current input scale: see :meth:`set_input_scale`."""
        assert self._base_global is not None
        world_size, upper = self.world_size, self._scaled_upper()
        total = self._scaled_global
        if total is None:
            total = round(self._base_global / self._input_scale)
            if self._input_scale != 1:  # a derived batch fits: it gives every rank its minimum
                lowest = sum(expand_bound(self._lower_bound(), world_size, 1))
                if total < lowest:
                    rank_zero_warn(
                        f"hetero: input scale {self._input_scale:g} makes the global batch"
                        f" {total}, below the per-rank minimums' sum; using {lowest}."
                    )
                    total = lowest
                if upper is not None:
                    total = min(total, sum(expand_bound(upper, world_size, total)))
        try:
            return BatchLimits.build(world_size, total, self._lower_bound(), upper)
        except PlanError as err:
            if self._max_batch_size == "auto":
                raise PlanError(
                    f"max_batch_size='auto' measured per-rank maximums {upper}; {err} Lower the"
                    " global batch size, or free memory on the ranks."
                ) from None
            if self._min_batch_size is None and self._lower_bound() > 1:
                raise PlanError(
                    f"{err} The model has BatchNorm layers, which cannot train on a batch of one,"
                    " so every rank gets at least 2 samples (`min_batch_size` defaults to 2 for"
                    f" such models): raise the global batch size to at least {2 * world_size}"
                    " (the training DataLoader's `batch_size`, or `global_batch_size`)."
                ) from None
            raise

    # ---------------------------------------------------------------- dual batch sizes
    def _plan_dual(self, loader: DataLoader) -> list[int]:
        """Dual batch size learning: time probe batches, then plan ``B_L``/``B_S`` and shares."""
        dual = self._dual
        assert dual is not None
        upper = self._upper_bound()
        smallest_upper = _smallest(upper)
        large = dual.large_batch_size or smallest_upper or loader.batch_size
        if large is None:
            raise ValueError(
                "controller='dual' needs a large batch size: set"
                " DualBatchController(large_batch_size=...), `max_batch_size`, or the training"
                " DataLoader's `batch_size`."
            )
        if smallest_upper is not None and large > smallest_upper:
            raise PlanError(
                f"The large batch size {large} exceeds the per-rank maximum {upper}; lower"
                " `large_batch_size` or raise `max_batch_size`."
            )
        time_model = self._probe_time(loader, large)
        if time_model.relative_error > 0.1:
            rank_zero_warn(
                f"controller='dual': the linear time fit is off by up to"
                f" {time_model.relative_error:.0%} on the probe {list(time_model.samples)}."
            )
        self._dual_reference = plan_dual_batch(
            time_model,
            len(loader.dataset),  # type: ignore[arg-type]
            self.world_size,
            dual.resolve_small_workers(self.world_size),
            large,
            dual.extra_time_ratio,
            dual.update_factor,
        )
        return self._rescale_dual()

    def _probe_time(self, loader: DataLoader, largest: int) -> TimeModel:
        """Fit ``t(x) = a*x + b`` to timed forward/backward passes of the slowest rank."""
        largest = min(largest, len(loader.dataset))  # type: ignore[arg-type]
        sizes = sorted({min(2, largest), *probe_sizes(largest)})  # small batches show b
        cuda = self.root_device.type == "cuda"
        times = []
        with self._probing(loader, "controller='dual'") as step:
            step(sizes[0], timed=True)  # warm-up: allocator, kernels, caches
            for size in sizes:
                if torch.distributed.is_initialized():
                    self.barrier("the time probe")  # ranks time each size together
                runs = []
                for _ in range(5):
                    if cuda:
                        torch.cuda.synchronize(self.root_device)
                    started = time.perf_counter()
                    step(size, timed=True)
                    if cuda:
                        torch.cuda.synchronize(self.root_device)
                    runs.append(time.perf_counter() - started)
                times.append(min(runs))
        rows = self.gather_rows(times)
        # the slowest rank sets the pace of an epoch: plan with its times
        slowest = [max(row[i] for row in rows) for i in range(len(sizes))]
        return TimeModel.fit(list(zip(sizes, slowest)))

    def _rescale_dual(self) -> list[int]:
        """The dual plan at the current input scale (hybrid scheme: one per resolution)."""
        reference = self._dual_reference
        assert reference is not None
        scale = self._input_scale
        plan = reference
        if scale != 1.0 or self._scaled_global is not None:
            large = self._scaled_global or max(round(reference.large_batch_size / scale), 2)
            upper = self._scaled_upper()
            if self._scaled_global is None and upper is not None:
                large = min(large, _smallest(upper))
            plan = reference.rescaled(large, reference.time_model.scaled(scale))
        self.dual_plan = plan
        sizes = list(plan.batch_sizes)
        self._limits = BatchLimits(sum(sizes), sizes, sizes)
        rank_zero_info(f"hetero: dual batch size plan (input scale {scale:g})\n{plan.table()}")
        return sizes

    def set_input_scale(self, scale: float, global_batch_size: int | None = None) -> None:
        """Inputs are now ``scale`` times as large per sample as those the plan was made for.

        Progressive learning calls this when the image resolution changes (``scale`` is the
        ratio of pixel counts). From the next epoch (the training loader is rebuilt), the
        global batch is ``global_batch_size`` or, by default, the planned-for global batch
        divided by ``scale`` and capped by what fits: maximums measured by
        ``max_batch_size="auto"`` scale by ``1 / scale`` (memory per sample follows the input
        size; given maximums stay as they are). The current plan is rescaled in proportion.
        With ``controller="dual"`` the batch is the large batch ``B_L``, the time model's
        per-sample cost scales by ``scale`` and ``B_S`` is planned again (paper 003's hybrid
        scheme); the per-rank sample shares stay. Call it on every rank with the same
        arguments.
        """
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"`scale` must be a finite number > 0, got {scale}.")
        if global_batch_size is not None and not is_count(global_batch_size):
            raise ValueError(
                f"`global_batch_size` must be an integer >= 1, got {global_batch_size}."
            )
        if (scale, global_batch_size) == (self._input_scale, self._scaled_global):
            return
        self._input_scale, self._scaled_global = scale, global_batch_size
        if self._plan is not None:  # else the first training loader applies it
            self._rescale_pending = True
            request_train_reload(self.lightning_module.trainer)

    def _apply_input_scale(self) -> None:
        """Rescale the plan to the input scale set since the last training loader."""
        self._rescale_pending = False
        if self.dual_plan is not None:
            self._plan = self._rescale_dual()
            return
        limits = self._limits = self._scaled_limits()
        self._plan = proportional_split(
            self.batch_sizes,
            limits.global_batch_size,
            limits.min_batch_size,
            limits.max_batch_size,
        )

    # ---------------------------------------------------------------- plan changes
    def apply_plan(self, batch_sizes: Sequence[int], from_step: int | None = None) -> None:
        """Switch every rank to ``batch_sizes`` from training step ``from_step`` of this epoch.

        Must be called on every rank with the same arguments. ``None`` means from the next
        epoch; the step must not have been drawn by any rank's loader yet.
        """
        assert self._limits is not None and self.sampler is not None
        limits = self._limits
        plan = check_plan(
            batch_sizes,
            self.world_size,
            limits.global_batch_size,
            limits.min_batch_size,
            limits.max_batch_size,
        )
        if isinstance(self.sampler, MegaBatchSampler):
            self.sampler.set_batch_size(plan[self.global_rank])  # from this rank's next claim
        else:
            self.sampler.set_plan(plan, from_step)
        self._plan = plan

    def restore_plan(
        self, batch_sizes: Sequence[int], weights: Sequence[float] | None = None
    ) -> None:
        """Start (or continue) from ``batch_sizes``, e.g. a plan saved in a checkpoint.

        ``weights``: one split weight per rank of this run, for when ``batch_sizes`` does not
        fit it (another world size): the initial plan is then proportional to them.
        """
        self._restored_plan = [int(b) for b in batch_sizes]
        self._restored_weights = None if weights is None else [float(w) for w in weights]
        self._plan = None  # made again from the next training loader

    def gather_rows(self, values: Sequence[float]) -> list[list[float]]:
        """All-gather one row of floats per rank; returns the rows in rank order."""
        tensor = torch.tensor(
            [float(v) for v in values], dtype=torch.float64, device=self.root_device
        )
        if not torch.distributed.is_initialized() or self.world_size == 1:
            return [tensor.tolist()]
        rows = [torch.empty_like(tensor) for _ in range(self.world_size)]
        torch.distributed.all_gather(rows, tensor)
        return [row.cpu().tolist() for row in rows]

    def gather_objects(self, value: Any) -> list[Any]:
        """All-gather one picklable object per rank; returns them in rank order."""
        if not torch.distributed.is_initialized() or self.world_size == 1:
            return [value]
        values: list[Any] = [None] * self.world_size
        torch.distributed.all_gather_object(values, value)
        return values

    def broadcast_plan(self, batch_sizes: Sequence[int]) -> list[int]:
        """Rank 0's plan, on every rank (the controller runs on rank 0 only).

        Raises:
            RuntimeError: rank 0 sent the all-zero plan that marks a controller failure.
        """
        tensor = torch.tensor([int(b) for b in batch_sizes], dtype=torch.int64)
        if self.root_device.type == "cuda":
            tensor = tensor.to(self.root_device)
        if torch.distributed.is_initialized() and self.world_size > 1:
            torch.distributed.broadcast(tensor, src=0)
        plan = [int(b) for b in tensor.tolist()]
        if not any(plan):
            raise RuntimeError(
                f"hetero: the {type(self.controller).__name__} controller failed on rank 0 (see"
                " its warning above); stopping every rank."
            )
        return plan

    # ---------------------------------------------------------------- step
    @override
    def on_train_start(self) -> None:
        super().on_train_start()
        self._refuse_several_training_loaders(self.lightning_module.trainer)
        if self.mode == "async":
            if self.global_rank == 0:
                self.server = ParameterServer(
                    self.optimizers, self.world_size, self.lr_scaling and self.dual_plan is None
                )
                ServerClient.start_server(self.server)
            self.synchronize("the start of training")  # every rank starts from the server
        elif self.mode == "local":
            module = self.lightning_module
            for tensor in [*module.parameters(), *module.buffers()]:
                if torch.distributed.is_initialized():
                    torch.distributed.broadcast(tensor.data, src=0)
            self._merger = ReplicaMerger(module, self.global_rank, self.gamma)

    @override
    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        super().on_train_batch_start(batch, batch_idx)
        self._timer.finish()  # the previous step is over, whether this one is timed or not
        if isinstance(self.sampler, MegaBatchSampler):
            megabatch, local = self.sampler.tags.popleft()
            while self._next_merge < megabatch:
                self._merge_megabatch()
            self._megabatch_updates += 1
            plan = self.batch_sizes
            self._share = (local, sum(plan))
            if local == plan[self.global_rank]:
                self._timer.start(local)
            return
        if isinstance(self.sampler, PartitionBatchSampler):
            local = self.sampler.size_at(batch_idx)
            self._share = (local, local)  # dual: the server scales by the update factor
            if local == self.sampler.batch_size:
                self._timer.start(local)
            return
        if self.sampler is None:
            return
        step = min(batch_idx, len(self.sampler) - 1)
        _, sizes = self.sampler.layout(step)
        local = sizes[self.global_rank]
        self._share = (local, sum(sizes))
        if self._hook_state is not None:
            self._hook_state.weight = local / sum(sizes)
        if sizes == self.sampler.plan_at(step):
            self._timer.start(local)  # irregular tail steps would restart the smoothing

    @override
    def post_backward(self, closure_loss: torch.Tensor) -> None:
        super().post_backward(closure_loss)
        # Every backward of a step is timed (manual optimization may run several); the step
        # ends at its last backward or optimizer step, see `HostStepTimer`.
        if self.mode == "async":
            self._timer.grads_ready()  # the push that follows counts as waiting
        else:
            self._timer.backward_done()

    @override
    def optimizer_step(
        self,
        optimizer: torch.optim.Optimizer,
        closure: Any,
        model: "pl.LightningModule | torch.nn.Module | None" = None,
        **kwargs: Any,
    ) -> Any:
        if self.mode == "bsp":
            output = super().optimizer_step(optimizer, closure, model, **kwargs)
            self._timer.step_done()  # the optimizer's work counts as compute
            return output
        if self.mode == "local":
            local, total = self._share
            factor = local * self.world_size / total if self.lr_scaling else 1.0
            with scaled_lr(optimizer, factor):
                output = super().optimizer_step(optimizer, closure, model, **kwargs)
            self._timer.step_done()
            return output
        index = self._optimizer_index(optimizer)

        def push_instead_of_step(closure: Any = None, **_: Any) -> Any:
            loss = closure() if closure is not None else None
            self._push(index, optimizer)
            return loss

        # Precision plugins call `optimizer.step`; the server steps instead of this rank.
        with _patched(optimizer, {"step": push_instead_of_step}):
            output = super().optimizer_step(optimizer, closure, model, **kwargs)
        optimizer._opt_called = True  # type: ignore[attr-defined]  # LR schedulers check it
        self._timer.step_done()
        return output

    # ---------------------------------------------------------------- async mode
    def _optimizer_index(self, optimizer: torch.optim.Optimizer) -> int:
        """Position of ``optimizer`` (or the one a ``LightningOptimizer`` wraps)."""
        raw = getattr(optimizer, "_optimizer", optimizer)
        return next(i for i, opt in enumerate(self.optimizers) if opt is raw)

    def _push(self, index: int, optimizer: torch.optim.Optimizer) -> None:
        assert self._client is not None
        params = optimizer_params(optimizer)
        grads = [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]
        lrs = [float(group["lr"]) for group in optimizer.param_groups]
        local, total = self._share
        factor = 1.0 if self.dual_plan is None else self.dual_plan.update_factors[self.global_rank]
        result = self._client.push(index, grads, local, total, lrs, self._seen_version, factor)
        self._load(params, result.params)
        self._seen_version = result.version
        self._pushes += 1
        self._timer.backward_done()

    def _pull_all(self) -> None:
        """Load the server's latest parameters into this rank's model."""
        assert self._client is not None
        for index, optimizer in enumerate(self.optimizers):
            result = self._client.pull(index)
            self._load(optimizer_params(optimizer), result.params)
            self._seen_version = result.version

    @staticmethod
    def _load(params: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
        with torch.no_grad():
            for param, value in zip(params, values):
                param.copy_(value)

    def synchronize(self, point: str) -> None:
        """Async mode: wait for every rank, then load the server's model everywhere."""
        self.barrier(point)  # every push of every rank has been applied
        self._pull_all()
        buffers = [b for b in self.lightning_module.buffers() if b.dtype.is_floating_point]
        with self.guarded(f"the buffer average at {point}"):
            # BatchNorm statistics would stay per rank otherwise
            weighted_average_(buffers, 1.0, self.world_size)
        self.barrier(f"{point}, after the pulls")  # no rank tears the server down mid-pull

    @contextmanager
    def guarded(self, operation: str) -> Iterator[None]:
        """Run a collective; if it fails, the error says which operation on which rank.

        A timed-out collective's note also names the ``timeout`` option, a closed connection's
        says that a peer stopped first (once, where guards are nested; each guard names its
        operation).
        """
        try:
            yield
        except Exception as err:
            note = f"hetero: {operation} failed on rank {self.global_rank}."
            text = "" if getattr(err, "_hetero_noted", False) else str(err).lower()
            if "timed out" in text or "timeout" in text:
                note += (
                    f" Some rank did not join it within the collective timeout ({self._timeout},"
                    " the strategy's `timeout` option): a rank that hangs or dies stops the"
                    " others after that long. Resume from the last checkpoint with"
                    " `trainer.fit(..., ckpt_path=...)`."
                )
            elif "connection closed" in text or "connection reset" in text:
                note += (
                    " A peer rank stopped first (it failed, was killed or timed out): see its log."
                )
            _add_note(err, note)
            err._hetero_noted = True  # type: ignore[attr-defined]
            raise

    @override
    def backward(
        self,
        closure_loss: torch.Tensor,
        optimizer: torch.optim.Optimizer | None,
        *args: Any,
        **kwargs: Any,
    ) -> torch.Tensor:
        if self.mode != "bsp":
            return super().backward(closure_loss, optimizer, *args, **kwargs)
        # DDP waits for the gradient all-reduce inside backward: a hung peer surfaces here
        # (the note names both, since backward can also fail on its own, e.g. out of memory).
        with self.guarded("backward with its gradient all-reduce"):
            return super().backward(closure_loss, optimizer, *args, **kwargs)

    @override
    def reduce(
        self,
        tensor: Any,
        group: Any | None = None,
        reduce_op: Any | None = "mean",
    ) -> Any:
        """``DDPStrategy.reduce``, with a training step's means weighted by batch size.

        Inside the training loop's batches (where Lightning reduces the step-level values of
        ``self.log(..., sync_dist=True)``), a mean weights rank ``k`` by the samples of its
        current batch, ``b_k``: the per-sample mean over the global batch, which is what
        DDP's plain mean is when every rank has the same batch. Elsewhere (epoch-level values,
        which Lightning computes as a synced sum over a synced sample count, validation,
        test) it is DDP's. A reduction during a step counts as waiting, not compute.
        """
        if not isinstance(tensor, torch.Tensor):
            return tensor
        with self._timer.waiting():
            if self._weighs_by_batch(tensor, reduce_op):
                local = float(self._share[0])  # this step's b_k
                values = tensor.detach().reshape(-1) * local
                packed = torch.cat([values, tensor.new_full((1,), local)])
                torch.distributed.all_reduce(packed, group=group)  # [sum v_k b_k, sum b_k]
                # in place, as DDPStrategy.reduce
                return tensor.copy_((packed[:-1] / packed[-1]).view_as(tensor))
            return super().reduce(tensor, group=group, reduce_op=reduce_op)

    def _weighs_by_batch(self, tensor: torch.Tensor, reduce_op: Any) -> bool:
        is_mean = (
            reduce_op.lower() in ("mean", "avg")
            if isinstance(reduce_op, str)
            else reduce_op == torch.distributed.ReduceOp.AVG
        )
        if not (is_mean and tensor.is_floating_point() and self.world_size > 1):
            return False
        if not torch.distributed.is_initialized() or self.lightning_module is None:
            return False
        try:
            trainer = self.lightning_module.trainer
        except RuntimeError:  # a module not attached to a Trainer
            return False
        # b_k comes from `_share`, set in the strategy's `on_train_batch_start`: a value logged
        # in a callback's or the module's `on_train_batch_start` (they run before it) gets the
        # previous batch's weight, which differs only at a plan change.
        return in_training_batch(trainer)

    @override
    def barrier(self, name: str | None = None) -> None:
        with self.guarded(f"the barrier {name!r}" if name else "a barrier"):
            super().barrier(name)

    # ---------------------------------------------------------------- local mode
    def _merge_megabatch(self) -> None:
        """Merge the replicas after mega-batch ``_next_merge`` and re-plan (every rank)."""
        assert self._merger is not None
        rows = self.gather_rows([self._megabatch_updates, self._merger.norm_per_parameter()])
        updates = [int(row[0]) for row in rows]
        weights = merge_weights(
            self.batch_sizes,
            updates,
            [row[1] for row in rows],
            delta=self.delta,
            threshold=self.perturb_threshold,
        )
        self._merger.merge(weights.weights)
        self.merges.append(
            {
                "epoch": self.lightning_module.trainer.current_epoch,
                "megabatch": self._next_merge,
                "batch_sizes": self.batch_sizes,
                "updates": updates,
                "weights": weights.weights,
                "perturbed": weights.perturbed,
            }
        )
        self._next_merge += 1
        self._megabatch_updates = 0
        callback = self._callback()
        callback.boundary(self.lightning_module.trainer, self, updates=updates)

    def finish_epoch(self) -> None:
        """Local mode: merge the mega-batches of this epoch not merged yet (every rank)."""
        if not isinstance(self.sampler, MegaBatchSampler):
            return
        while self._next_merge < self.sampler.num_megabatches:
            self._merge_megabatch()

    def start_epoch(self) -> None:
        """Local mode: a new epoch's mega-batches start at 0."""
        self._next_merge = 0
        self._megabatch_updates = 0

    def _callback(self) -> "HeteroCallback":
        from lightning_hetero.callback import HeteroCallback

        trainer = self.lightning_module.trainer
        return next(cb for cb in trainer.callbacks if isinstance(cb, HeteroCallback))

    # ---------------------------------------------------------------- models and checkpoints
    @override
    def on_validation_start(self) -> None:
        super().on_validation_start()
        trainer = self.lightning_module.trainer
        if trainer.state.fn != TrainerFn.FITTING or trainer.sanity_checking:
            return
        if self.mode == "async" and self._client is not None:
            self.synchronize("validation")  # validate the server's model
        elif self.mode == "local":
            self.finish_epoch()  # validate the merged model

    @override
    def on_train_end(self) -> None:
        super().on_train_end()
        if self.mode == "async" and self._client is not None:
            self.synchronize("the end of training")

    @override
    def lightning_module_state_dict(self) -> dict[str, Any]:
        if self.server is not None:
            self._pull_all()  # rank 0: checkpoints hold the server's model
        return super().lightning_module_state_dict()

    @override
    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any]:
        if self.server is None:
            return super().optimizer_state(optimizer)
        return self.server.optimizer_state(self._optimizer_index(optimizer))

    @override
    def on_exception(self, exception: BaseException) -> None:
        self._failed = True
        if self._client is not None and isinstance(exception, Exception):
            gone = self._client.unreachable(range(self.world_size))
            if gone:
                _add_note(
                    exception,
                    f"hetero: rank {self.global_rank} finds that rank(s) {gone} no longer answer:"
                    " the rank that died, and any that stopped after it (each rank reports what"
                    " it sees; rank 0 hosts the server). The parameter server applies each update"
                    " whole, so its model holds only complete updates; resume from the last"
                    " checkpoint with `trainer.fit(..., ckpt_path=...)`.",
                )
        super().on_exception(exception)

    @override
    def teardown(self) -> None:
        if self.server is not None:
            # Later `trainer.save_checkpoint` calls save the optimizers: give them the server's.
            for index, optimizer in enumerate(self.optimizers):
                optimizer.load_state_dict(self.server.optimizer_state(index))
        if self._client is not None:
            ServerClient.stop_server()
            ServerClient.shutdown(graceful=not self._failed)
            self._client = None
            self.server = None
        super().teardown()

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="DDP with per-rank batch sizes that follow each rank's speed",
        )
