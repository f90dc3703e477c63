"""HeteroFSDPStrategy: sharded data parallelism (FSDP2) in which every rank has its own batch."""

from contextlib import AbstractContextManager, nullcontext
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import _StrategyRegistry
from lightning.fabric.utilities.distributed import _set_num_threads_if_needed
from lightning.pytorch.strategies import ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from typing_extensions import override

from lightning_hetero._docstrings import plain_docstring
from lightning_hetero._fsdp_accumulate import UnshardedAccumulation
from lightning_hetero._lightning import model_parallel_setup
from lightning_hetero._namespaces import SameCopy
from lightning_hetero._options import keywords, refuse_unknown
from lightning_hetero.engine import MODE_OPTIONS, HeteroEngine, HeteroOptions, hetero_parts
from lightning_hetero.microbatch import COLLECTIVES, MicroBatches
from lightning_hetero.modes import ModeOptions, ShardedMode
from lightning_hetero.planning import Controller
from lightning_hetero.replan import REPLAN_BUDGET_DEFAULT

__all__ = ["HeteroFSDPStrategy"]

#: The modes sharded training runs: synchronous only.
FSDP_MODES = {ShardedMode.name: ShardedMode}
#: HeteroStrategy's options that only DDP modes have.
_DDP_ONLY = (*MODE_OPTIONS, "ddp_comm_hook", "find_unused_parameters")


class _ShardedMicroBatches(MicroBatches):
    """``HeteroFSDPStrategy``'s micro-batches: FSDP decides in the forward (reshard after
    it?) and in the backward (reduce-scatter, reshard after it?), so its switches stay held
    from a step's first micro-batch to its last (``UnshardedAccumulation``). Its all-gathers
    and reduce-scatters go through ``torch.distributed`` (``all_gather_single`` and
    ``reduce_scatter_single``, or on older torch ``all_gather_into_tensor`` and
    ``reduce_scatter_tensor``): all other collectives are refused as under DDP."""

    refused = tuple(
        name
        for name in COLLECTIVES
        if name not in ("all_gather_into_tensor", "reduce_scatter_tensor", "barrier")
    )

    def __init__(self, strategy: Any) -> None:
        super().__init__(strategy)
        self.accumulation = UnshardedAccumulation()

    @override
    def forward(self, last: bool) -> AbstractContextManager[Any]:
        if last:
            self.accumulation.release()
        else:
            self.accumulation.hold(self.strategy.model)
        return nullcontext()

    @override
    def failed(self) -> None:
        self.accumulation.abandon(self.strategy.model)


@plain_docstring  # LightningCLI's --help prints it: plain text (the site reads the source)
class HeteroFSDPStrategy(SameCopy, HeteroEngine, ModelParallelStrategy):
    """Fully sharded data parallelism (FSDP2) where each rank's batch size follows its speed.

    Parameters, gradients and optimizer state are sharded over the ranks with
    ``torch.distributed.fsdp.fully_shard``, as Lightning's ``ModelParallelStrategy`` does, so
    models that do not fit one device train, and GPUs with less memory can be given smaller
    batches (``max_batch_size="auto"`` measures each rank's own bound under sharding).
    Rank ``k`` trains on ``b_k`` samples of each global batch of ``B``; its loss is scaled by
    ``K * b_k / B`` before backward, so FSDP's averaging reduce-scatter yields exactly the
    gradient of the mean loss over the ``B`` samples. Compute time excludes the time a rank
    waits for the others in FSDP's collectives, so the controller sees each rank's speed.

    The model needs no change: if its ``configure_model`` applied ``fully_shard``, that
    sharding is kept; otherwise each module whose class is named in ``shard_modules`` is
    sharded, then the LightningModule itself (the root).

    Args:
        data_parallel_size: ranks in the data-parallel (sharding) group; ``"auto"``: all.
        tensor_parallel_size: must be 1 (tensor parallelism is not supported yet).
        save_distributed_checkpoint: each rank saves its shard (a folder); ``False``: one
            full checkpoint file from rank 0. Both carry the plan and the controller.
        process_group_backend: as ``ModelParallelStrategy`` (``"gloo"`` on CPU).
        timeout: how long a collective waits for every rank.
        mode: ``"bsp"`` only: sharded training is synchronous.
        shard_modules: class names of the submodules to shard each on their own (e.g.
            ``["TransformerBlock"]``), before the root; default: only the root.

    The other options (``controller``, ``batch_sizes``, ``global_batch_size``,
    ``min_batch_size``, ``max_batch_size``, ``memory_safety``, ``probe_batch_sizes``,
    ``deadband``, ``revert_slower``, ``smoothing``, ``adjust_every``, ``replan_budget``,
    ``first_boundary``, ``shuffle``) mean what they mean for
    [`HeteroStrategy`][lightning_hetero.HeteroStrategy]. ``micro_batch_size``
    (an int, one per rank, or ``"auto"``) runs a rank's share as micro-batches with the
    collectives of one FSDP step: from the step's first forward to its last, every unit's
    parameters stay gathered and its gradients unsharded. ``"auto"`` measures that: the
    memory probe runs each size as two micro-batches held as in training (see
    [Memory-bound ranks](../memory.md)).
    """

    strategy_name = "hetero_fsdp"
    micro_batches_hold_more = True  # every unit gathered from a step's first micro-batch on
    micro_batches_class = _ShardedMicroBatches

    def __init__(
        self,
        data_parallel_size: Literal["auto"] | int = "auto",
        tensor_parallel_size: Literal["auto"] | int = 1,
        save_distributed_checkpoint: bool = True,
        process_group_backend: str | None = None,
        timeout: timedelta | None = default_pg_timeout,
        *,
        mode: Literal["bsp"] = "bsp",
        shard_modules: list[str] | None = None,
        controller: str | Controller | None = None,
        batch_sizes: str | list[int] = "uniform",
        global_batch_size: int | None = None,
        min_batch_size: int | None = None,
        max_batch_size: int | list[int] | Literal["auto"] | None = None,
        micro_batch_size: int | list[int] | Literal["auto"] | None = None,
        memory_safety: float = 0.9,
        probe_batch_sizes: list[int] | None = None,
        deadband: float | Literal["auto"] = "auto",
        revert_slower: bool = True,
        smoothing: float = 0.8,
        adjust_every: Literal["epoch"] | int = "epoch",
        replan_budget: float | None = REPLAN_BUDGET_DEFAULT,
        first_boundary: Literal["auto"] | int | None = "auto",
        shuffle: bool = True,
        **kwargs: Any,
    ) -> None:
        ddp_only = sorted(set(kwargs) & set(_DDP_ONLY))
        if ddp_only:
            raise TypeError(
                f"HeteroFSDPStrategy does not take {ddp_only}: they belong to HeteroStrategy's"
                " DDP modes. Remove them, or train with HeteroStrategy."
            )
        refuse_unknown(
            "HeteroFSDPStrategy",
            kwargs,
            keywords(HeteroFSDPStrategy.__init__),
            "its keyword arguments (docs: Options)",
        )
        if tensor_parallel_size != 1:
            raise ValueError(
                f"HeteroFSDPStrategy shards over data-parallel ranks only; got"
                f" tensor_parallel_size={tensor_parallel_size!r}. Tensor parallelism with"
                " per-rank batch sizes is not supported: use tensor_parallel_size=1, or"
                " Lightning's ModelParallelStrategy with equal batches."
            )
        if mode not in FSDP_MODES:
            raise ValueError(
                f"HeteroFSDPStrategy runs mode='bsp' only (sharded training is synchronous),"
                f" got mode={mode!r}; for {mode!r} use HeteroStrategy(mode={mode!r})."
            )
        if shard_modules is not None and not all(isinstance(n, str) for n in shard_modules):
            raise TypeError(f"`shard_modules` must be a list of class names, got {shard_modules}.")
        shared = HeteroOptions.pick(locals())
        options = ModeOptions.pick(locals())
        training_mode, plan_state = hetero_parts(mode, options, shared, modes=FSDP_MODES)
        super().__init__(
            data_parallel_size=data_parallel_size,
            tensor_parallel_size=1,
            save_distributed_checkpoint=save_distributed_checkpoint,
            process_group_backend=process_group_backend,
            timeout=timeout,
        )
        self.mode, self.shard_modules = mode, shard_modules
        self._start_hetero(training_mode, plan_state, shared)

    @override
    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # ModelParallelStrategy's "auto" is per node
            self._data_parallel_size = self.num_nodes * self.num_processes
        # Lightning's launcher gives each rank cores // processes CPU threads, but
        # ModelParallelStrategy has a launcher on the launching rank only: the ranks it starts
        # kept every core (twice rank 0's threads on 2 ranks), so equal ranks computed at
        # different speeds and got unequal plans. DDPStrategy sets it on every rank; so here.
        environment = self.cluster_environment
        if environment is not None and environment.creates_processes_externally:
            _set_num_threads_if_needed(num_processes=self.num_processes)
        super().setup_environment()

    @override
    def _lightning_setup(self, trainer: "pl.Trainer") -> None:
        # Lightning's sequence, with the model sharded here unless the user's `configure_model`
        # did it (ModelParallelStrategy.setup demands a `configure_model`)
        fitting = trainer.state.fn == TrainerFn.FITTING

        def parallelize(model: torch.nn.Module) -> torch.nn.Module:
            if fitting and self._layer_sync is not None:
                # `Trainer(sync_batchnorm=True)`, which ModelParallelStrategy leaves unapplied:
                # statistics over the union batch, whatever each rank's share (GPU only)
                model = self._layer_sync.apply(model)
            return self.training_mode.setup_model(model, self._shard)

        model_parallel_setup(self, trainer, parallelize)
        if fitting:
            self.training_mode.register_hooks(self.model)

    # Each step method runs inside the sharded root's forward (``ShardedMode.redirect``), so
    # FSDP's hooks gather the root's parameters whatever the step calls: Lightning's own
    # redirection runs only when the wrapped model is another object than the module.
    @override
    def _training_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.train_step_context():
            return self.training_mode.redirect(self.model, "training_step", *args, **kwargs)

    @override
    def validation_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.val_step_context():
            return self.training_mode.redirect(self.model, "validation_step", *args, **kwargs)

    @override
    def test_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.test_step_context():
            return self.training_mode.redirect(self.model, "test_step", *args, **kwargs)

    @override
    def predict_step(self, *args: Any, **kwargs: Any) -> Any:
        with self.precision_plugin.predict_step_context():
            return self.training_mode.redirect(self.model, "predict_step", *args, **kwargs)

    def _shard(self, module: torch.nn.Module) -> torch.nn.Module:
        """Apply ``fully_shard`` as ``shard_modules`` says, unless the model is sharded."""
        from torch.distributed.fsdp import FSDPModule, FullyShardedDataParallel, fully_shard
        from torch.distributed.tensor import DTensor

        if any(isinstance(m, FullyShardedDataParallel) for m in module.modules()):
            raise TypeError(
                f"{type(module).__name__} holds modules wrapped in FSDP1's"
                " FullyShardedDataParallel; HeteroFSDPStrategy shards with FSDP2: apply"
                " `torch.distributed.fsdp.fully_shard` in `configure_model` instead, or let"
                " HeteroFSDPStrategy shard the model (leave it unwrapped)."
            )
        if any(isinstance(m, torch.nn.parallel.DistributedDataParallel) for m in module.modules()):
            raise TypeError(
                f"{type(module).__name__} holds a DistributedDataParallel module;"
                " HeteroFSDPStrategy shards the model itself: leave it unwrapped."
            )
        if any(isinstance(m, FSDPModule) for m in module.modules()):
            return module  # the user's `configure_model` sharded it: keep that
        if any(isinstance(p, DTensor) for p in module.parameters()):
            raise TypeError(
                f"{type(module).__name__} has distributed (DTensor) parameters from another"
                " parallelism (e.g. tensor parallelism), which HeteroFSDPStrategy does not"
                " support: leave the model unparallelized."
            )
        mesh = self.device_mesh["data_parallel"]
        names = set(self.shard_modules or ())
        found = set()
        for child in list(module.modules())[1:]:
            name = type(child).__name__  # before sharding: it renames the class
            if name in names:
                fully_shard(child, mesh=mesh)
                found.add(name)
        if names - found:
            raise ValueError(
                f"`shard_modules` names {sorted(names - found)}, which {type(module).__name__}"
                " does not contain."
            )
        fully_shard(module, mesh=mesh)
        return module

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="FSDP2 with per-rank batch sizes that follow each rank's speed",
        )
