"""HeteroStrategy: DDP in which every rank gets its own batch size.

The strategy is ``DDPStrategy`` with the hetero engine mixed in
(``HeteroEngine``), which hands every lifecycle hook to the
training mode (``lightning_hetero.modes``), makes plans with the plan state
(``PlanState``) and runs boundaries with the re-planner
(``Replanner``). Here: the options, and how DDP wraps the model.
"""

from collections.abc import Callable
from datetime import timedelta
from typing import Any, Literal

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins import CheckpointIO, ClusterEnvironment
from lightning.fabric.plugins.collectives.torch_collective import default_pg_timeout
from lightning.fabric.strategies import _StrategyRegistry
from lightning.pytorch.plugins.precision import Precision
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lightning_hetero._docstrings import plain_docstring
from lightning_hetero._namespaces import SameCopy
from lightning_hetero._options import ddp_keywords, keywords, refuse_unknown
from lightning_hetero.engine import MODE_OPTIONS, HeteroEngine, HeteroOptions, hetero_parts
from lightning_hetero.modes import ModeOptions
from lightning_hetero.planning import Controller
from lightning_hetero.replan import REPLAN_BUDGET_DEFAULT

__all__ = ["HeteroStrategy"]


@plain_docstring  # LightningCLI's --help prints it: plain text (the site reads the source)
class HeteroStrategy(SameCopy, HeteroEngine, DDPStrategy):
    """Data-parallel training where each rank's batch size follows its speed.

    The global batch ``B`` stays fixed; rank ``k`` trains on ``b_k`` samples per step,
    gradients are combined with weights ``b_k / B`` (exactly the gradient of the mean
    loss over ``B`` samples), and a controller re-plans the split from measured
    compute times so that fast ranks stop waiting for slow ones.

    Args:
        mode: ``"bsp"``: synchronous, gradients all-reduced with weights ``b_k / B``.
            ``"async"``: a parameter server in rank 0's process applies each rank's gradient
            as it arrives, with its learning rate scaled by its batch share ``b_k / B``
            (``lr_scaling``);
            ranks never wait for each other within an epoch. ``"local"``: local SGD; each
            rank steps its own replica on batches claimed from a shared pool of
            ``megabatch_size`` samples, and the replicas are merged after each mega-batch
            (see [Training modes](../modes.md)).
        controller: a controller name (``"proportional"``, ``"model"``, ``"lbbsp"``,
            ``"stepwise"``, ``"updates"``, ``"static"``; built with ``deadband``;
            ``"dual"``, dual batch size learning, with ``mode="async"`` only) or a
            [`Controller`][lightning_hetero.planning.Controller] instance. Default:
            ``"static"`` in local mode (``"updates"`` with ``local_steps="equal"``),
            ``"proportional"`` otherwise.
        batch_sizes: the initial plan: ``"uniform"``, ``"cores"`` (CPU cores each rank's
            process may use), ``"flops"`` (GPU SMs x clock via NVML, falling back to
            cores), or one batch size per rank.
        global_batch_size: ``B``; default: the sum of an explicit plan, else the training
            loader's ``batch_size`` times the world size, times the Trainer's
            ``accumulate_grad_batches`` in mode ``"bsp"``: the strategy then runs the
            accumulated batches of an optimizer step as one global batch of micro-batches of
            at most the loader's ``batch_size`` (Lightning runs accumulation 1; see "the
            accumulation story" in [Memory-bound ranks](../memory.md)).
        min_batch_size: smallest batch any rank may get, in every step including the
            epoch's last, smaller one (padded with the epoch's first samples when too few are
            left, as DDP's sampler pads). Default: 2 for a model with BatchNorm layers (which
            cannot train on a batch of one), else 1.
        max_batch_size: largest batch any rank may get (default: no limit but ``B``): one
            number, one per rank, or ``"auto"``: each rank measures the peak memory of real
            training steps at a few batch sizes before training, fits
            ``memory = fixed + per_sample * b`` and takes the largest ``b`` that stays under
            ``memory_safety`` of its free memory (model, optimizer and random state are put
            back afterwards; see [Controllers and re-planning](../controllers.md)).
        micro_batch_size: the most samples a rank puts through the model at once (default:
            its whole batch): one number, one per rank, or ``"auto"`` (each rank's bound from
            the memory probe of ``max_batch_size="auto"``). Rank ``k`` runs its ``b_k``
            samples of a step as ``ceil(b_k / m_k)`` micro-batches inside one Lightning
            step, gradients accumulated locally and synchronized once (DDP's ``no_sync`` for
            all but the last), each loss weighted by its samples: the optimizer step is
            still one step on the global batch, and memory bounds the micro-batch, never
            the share. ``mode="bsp"``, automatic optimization only; see [Memory-bound ranks
            (micro-batches)](../memory.md).
        memory_safety: fraction of the free memory ``max_batch_size="auto"`` plans for, in
            ``(0, 1]``.
        probe_batch_sizes: batch sizes ``max_batch_size="auto"`` probes (default: four
            sizes doubling up to ``B``); sizes that would not fit are skipped or caught.
        deadband: how much better a new plan must be before the plan changes (controllers
            built by name; each controller's docstring says what it compares): a relative
            gain in ``[0, 1)``, or ``"auto"``: twice the measured relative noise of the
            ranks' step times, at least 1% (controllers without ``"auto"`` use 5%).
        revert_slower: BSP: check every plan change against the measured wall time of a
            step and undo a change that made steps slower beyond the measured noise; later
            changes then move half as far (see [Controllers and re-planning](../controllers.md),
            "Never slower than DDP").
        smoothing: no effect since per-rank timings became the median of every step since
            the last change (kept so that existing configurations load); in ``[0, 1)``.
        adjust_every: re-plan at each ``"epoch"`` end or every N training batches (then, on
            several ranks with a ``replicable`` controller such as the default, each boundary
            decides on the timings the one before gathered: training never waits for the
            gather, and a plan arrives N batches later).
        replan_budget: with ``adjust_every`` a number, the largest share of the training
            time that boundaries may take (default 0.0025): where steps are so short that a
            boundary every N batches would cost more, boundaries come every multiple of N
            batches that keeps them within it (said once). ``None``: every N batches,
            whatever it costs.
        first_boundary: with ``adjust_every="epoch"``, one boundary this many training
            batches into the first epoch of a fit that has measured nothing yet, so the rest
            of that epoch runs a measured plan instead of the initial one (short fine-tunes
            gain from the first epoch). ``"auto"`` (default): after 8 batches, in an epoch of
            at least 16; ``None``: the first plan holds until the first epoch ends. Modes
            whose ranks run the same steps on a plan that may change: ``"bsp"``,
            ``"async"`` and ``HeteroFSDPStrategy`` (not ``"local"``, nor
            ``controller="dual"``).
        weighted: weight gradients by ``b_k / B``; ``False`` gives DDP's plain mean
            (inexact with unequal batches; for ablations only). BSP mode only.
        shuffle: draw a new permutation of the training set every epoch (seeded by
            ``seed_everything``, the same on every rank), as ``DDPStrategy``'s sampler does
            whatever the loader says; ``False`` keeps the dataset's own order.
        lr_scaling: how a step on part of the global batch scales the learning rate, so
            that it moves its part of DDP's step. ``"linear"`` (``True``): by the share
            ``s`` (paper 002 Eq. 5b; the linear scaling rule of SGD); ``"sqrt"``: by
            ``sqrt(s)`` (the square-root rule of adaptive optimizers, whose step barely
            depends on the gradient's size); ``"noise"`` (async mode, ``controller="dual"``
            included): between the two, by the gradient noise the parameter server
            measures, so that a round of pushes moves about one DDP step whether the ranks'
            gradients agree or not; ``"auto"`` (default): for adaptive optimizers
            (Adam, AdamW, RMSprop, Adagrad and their kin, or any optimizer whose parameter
            groups have e.g. ``betas``) ``"noise"`` in async mode (dual batch included) and
            ``"sqrt"`` in local mode, ``"linear"`` for other optimizers; ``"none"``
            (``False``): ``lr`` unchanged (for ablations). Async mode: ``s = b_k / B`` per
            push; dual batch (``controller="dual"``): ``s = b_k / (n * B_L)``; local mode:
            ``K`` times the factor of ``s = b_k / B`` per replica step (a merge averages the
            ``K`` replicas): ``lr`` at an even split under ``"linear"``, ``sqrt(K) * lr``
            under ``"sqrt"`` (see [Training modes](../modes.md)).
        timeout: how long a collective waits for every rank (``DDPStrategy``'s option). A rank
            that hangs or dies stops the others after this long; their error names the
            operation (e.g. the gradient all-reduce in backward) and this option.
        lookahead: async (dual batch included), SGD with momentum: each push returns the server's
            parameters moved ahead by the momentum of the updates expected before that rank's next
            push (its moving-average staleness times the other ranks' learning-rate factors), so its
            next gradient is taken about where it will be applied. `"auto"`: on for
            `torch.optim.SGD` with `momentum > 0`, off for other optimizers; `True`: on (refused for
            an optimizer without momentum); `False`: off, paper 002's plain return. Other modes take
            only `"auto"`. Validation and checkpoints see the server's parameters themselves. See
            [the lookahead](../modes.md#async-with-sgd-and-momentum-the-lookahead-lookahead).
        epoch_average: async (dual batch included): at the end of each epoch (before its validation)
            and of training, the server's parameters become their average over the epoch's pushes,
            weighted toward the last ones (push `i` of `n` weighs about `(i / n)^2`), and every rank
            goes on from there: the swings stale gradients give the model under momentum smooth out.
            `"auto"`: on for `torch.optim.SGD` with `momentum > 0`, off for other optimizers (with
            Adam, on a model still improving fast, the average lags it); `True`: on for every
            optimizer; `False`: off. Validation within an epoch sees the server's parameters as they
            are. One copy of the parameters on rank 0. See [the epoch's
            average](../modes.md#async-the-epochs-average-epoch_average).
        rpc_timeout: async: seconds a push or pull to the parameter server may take; the error names
            the rank and the request.
        megabatch_size: local: samples claimed between two merges; default `10 * B`; must be at
            least `B`.
        delta: local, `local_steps="equal"`: merge-weight perturbation in `[0, 1)`: the replica with
            the most updates gets `(1+delta) * alpha`, the one with the fewest `(1-delta) * alpha`;
            `0` turns it off.
        perturb_threshold: local: perturb only when every replica's L2 norm per parameter is below
            this (`> 0`).
        gamma: local: merge momentum in `[0, 1)`: `w' = sum_k alpha_k w_k + gamma * (w - w_prev)`;
            `0` is plain weighted averaging. `gamma > 0` amplifies a steady move up to
            `1 / (1 - gamma)` times. Paper 004 uses `0.9`; with a learning rate tuned for `gamma=0`
            that diverges, see [Merge momentum](../modes.md#merge-momentum-gamma) for what
            `gamma > 0` needs.
        local_steps: local: `"proportional"` (batch sizes stay, controller `"static"`; each rank
            makes updates in proportion to its speed in the same wall time, replicas merged by their
            samples) or `"equal"` (paper 004: the `"updates"` controller sizes batches by speed,
            every rank makes the same number of updates per merge; needed for a controller that
            moves batch sizes). See [Local steps and the outer
            optimizer](../modes.md#local-steps-and-the-outer-optimizer).
        outer_lr: local: DiLoCo's outer optimizer at this learning rate (Nesterov momentum 0.9 on
            the pseudo-gradient `w_last_merge - merged`); `None`: the plain weighted average. Not
            with `gamma`.
        merge_optimizer_state: local: each merge also averages the replicas' optimizer state shaped
            like the parameters (SGD's momentum buffers, Adam's moments) with the merge's weights,
            one more all-reduce of that size; `False`: each replica keeps its own.
        **kwargs: forwarded to ``DistributedDataParallel``
            (e.g. ``find_unused_parameters=True``), as with ``DDPStrategy``. A name that is
            neither an option above nor a keyword of ``DistributedDataParallel`` is refused
            here, with the closest valid name.

    The positional arguments are those of ``DDPStrategy``,
    in its order; the options above are keyword-only. DDP communication hooks and
    post-local-SGD are refused: gradients are weighted by scaling each rank's loss and
    averaged by DDP's own all-reduce, which they would replace.

    The first plan is made when Lightning loads the training data at the start of ``fit``,
    after the optimizers exist (see [Data loaders](../data.md) for ``estimated_stepping_batches``).
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
        micro_batch_size: int | list[int] | Literal["auto"] | None = None,
        memory_safety: float = 0.9,
        probe_batch_sizes: list[int] | None = None,
        deadband: float | Literal["auto"] = "auto",
        revert_slower: bool = True,
        smoothing: float = 0.8,
        adjust_every: Literal["epoch"] | int = "epoch",
        replan_budget: float | None = REPLAN_BUDGET_DEFAULT,
        first_boundary: Literal["auto"] | int | None = "auto",
        weighted: bool = True,
        shuffle: bool = True,
        lr_scaling: bool | Literal["auto", "linear", "sqrt", "noise", "none"] = "auto",
        lookahead: bool | Literal["auto"] = "auto",
        epoch_average: bool | Literal["auto"] = "auto",
        rpc_timeout: float = 300.0,
        megabatch_size: int | None = None,
        delta: float = 0.1,
        perturb_threshold: float = 0.1,
        gamma: float = 0.0,
        local_steps: Literal["equal", "proportional"] = "proportional",
        outer_lr: float | None = None,
        merge_optimizer_state: bool = True,
        **kwargs: Any,
    ) -> None:
        refuse_unknown(
            "HeteroStrategy",
            kwargs,
            keywords(HeteroStrategy.__init__) + ddp_keywords(),
            "its keyword arguments (docs: Options) and those of torch's DistributedDataParallel,"
            " which it forwards",
        )
        own_hook = ("ddp_comm_state", "ddp_comm_hook", "ddp_comm_wrapper", "model_averaging_period")
        given = (ddp_comm_state, ddp_comm_hook, ddp_comm_wrapper, model_averaging_period)
        forbidden = [name for name, value in zip(own_hook, given) if value is not None]
        if forbidden:
            raise ValueError(
                f"HeteroStrategy does not take {forbidden}: it weights each rank's gradient by"
                " scaling its loss and relies on DDP's own averaging all-reduce, which a"
                " communication hook or post-local-SGD would replace (Lightning registers them"
                " on CUDA only). For local SGD use HeteroStrategy(mode='local')."
            )
        shared = HeteroOptions.pick(locals())
        options = ModeOptions.pick(locals())
        training_mode, plan_state = hetero_parts(mode, options, shared)
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
        # options, as given (scikit-learn style); what a run learns lives in the objects
        self.mode = mode
        for name in MODE_OPTIONS:
            setattr(self, name, getattr(options, name))
        self._start_hetero(training_mode, plan_state, shared)

    @override
    def _setup_model(self, model: torch.nn.Module) -> torch.nn.Module:
        # no DDP for modes without it: async pushes to the server, local keeps replicas
        return self.training_mode.setup_model(model, super()._setup_model)

    @override
    def _register_ddp_hooks(self) -> None:
        self.training_mode.register_hooks(self.model)

    @classmethod
    @override
    def register_strategies(cls, strategy_registry: _StrategyRegistry) -> None:
        strategy_registry.register(
            cls.strategy_name,
            cls,
            description="DDP with per-rank batch sizes that follow each rank's speed",
        )
