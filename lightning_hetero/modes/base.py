"""The interface every training mode implements, with no-op defaults.

A mode is what differs between synchronous data parallelism, a parameter server and local
SGD: how the model is wrapped, how each rank's batches are drawn, what an optimizer step
does, and what happens at validation, epoch ends and teardown. The strategy builds one mode
object from its ``mode=`` option and hands each of its lifecycle hooks to it; it never asks
which mode it runs. A mode sees the run through its
[`RunContext`][lightning_hetero.context.RunContext] and reaches the re-planner only through the
``replan`` callable it is given (both with ``Mode.bind``), so this package imports
neither the strategy nor the re-planner.
"""

from collections.abc import Callable
from dataclasses import dataclass, field, fields
from typing import Any, ClassVar, Literal

import torch
from torch.utils.data import DataLoader, Sampler

from lightning_hetero._optim import check_epoch_average, check_lr_scaling
from lightning_hetero.context import RunContext
from lightning_hetero.localsgd import ReplicaMerger
from lightning_hetero.paramserver import ParameterServer
from lightning_hetero.planning import Controller, check_merge_options
from lightning_hetero.planning.dual import DualBatchPlan
from lightning_hetero.planning.merge import check_local_options
from lightning_hetero.planning.split import is_count, plan_checksum
from lightning_hetero.sampler import EpochPermutation, GlobalBatchSampler

__all__ = [
    "OPTION_GROUPS",
    "MergeOptions",
    "Mode",
    "ModeOptions",
    "OptionGroup",
    "Replan",
    "ServerOptions",
    "TimeProbe",
    "option",
]

#: Run one boundary now: ``replan(updates)``, with each rank's update count where ranks make
#: different numbers of updates (``None`` in lock-step modes). Call on every rank together.
Replan = Callable[[list[int] | None], None]
#: ``probe(largest)``: a time model fitted to timed training steps of up to ``largest`` samples.
TimeProbe = Callable[[int], Any]


def option(default: Any, example: Any) -> Any:
    """A field of an option group: its ``default``, and an ``example``, a valid value other
    than the default (the tests set each option to it).

    The docstring under the field (Markdown, links relative to the API pages) is the option's
    documentation: ``make generate`` writes it, with the field's type and default, into
    ``HeteroStrategy``'s signature and docstring and into ``docs/options.md``.
    """
    return field(default=default, metadata={"example": example})


class OptionGroup:
    """The options of one part of a mode (a dataclass of ``option`` fields, each followed by
    its docstring), checked together by ``check`` next to their definition."""

    #: The part these options configure and the ``mode=`` that has it (for messages).
    part: ClassVar[str] = ""
    used_by: ClassVar[str] = ""

    def check(self) -> None:
        """Refuse values out of range (whichever mode runs)."""


@dataclass(frozen=True, kw_only=True)
class ServerOptions(OptionGroup):
    """Options of the parameter server (``mode="async"``, dual batch included)."""

    part: ClassVar[str] = "parameter server"
    used_by: ClassVar[str] = "mode='async'"

    lookahead: bool | Literal["auto"] = option("auto", example=False)
    """async (dual batch included), SGD with momentum: each push returns the server's parameters
    moved ahead by the momentum of the updates expected before that rank's next push (its
    moving-average staleness times the other ranks' learning-rate factors), so its next gradient is
    taken about where it will be applied. `"auto"`: on for `torch.optim.SGD` with `momentum > 0`,
    off for other optimizers; `True`: on (refused for an optimizer without momentum); `False`: off,
    paper 002's plain return. Other modes take only `"auto"`. Validation and checkpoints see the
    server's parameters themselves. See [the
    lookahead](../modes.md#async-with-sgd-and-momentum-the-lookahead-lookahead)."""
    epoch_average: bool | Literal["auto"] = option("auto", example=False)
    """async (dual batch included): at the end of each epoch (before its validation) and of
    training, the server's parameters become their average over the epoch's pushes, weighted toward
    the last ones (push `i` of `n` weighs about `(i / n)^2`), and every rank goes on from there: the
    swings stale gradients give the model under momentum smooth out. `"auto"`: on for
    `torch.optim.SGD` with `momentum > 0`, off for other optimizers (with Adam, on a model still
    improving fast, the average lags it); `True`: on for every optimizer; `False`: off. Validation
    within an epoch sees the server's parameters as they are. One copy of the parameters on rank 0.
    See [the epoch's average](../modes.md#async-the-epochs-average-epoch_average)."""
    rpc_timeout: float = option(300.0, example=30.0)
    """async: seconds a push or pull to the parameter server may take; the error names the rank and
    the request."""

    def check(self) -> None:
        if self.lookahead not in (True, False, "auto"):
            raise ValueError(f"`lookahead` must be 'auto', True or False, got {self.lookahead!r}.")
        check_epoch_average(self.epoch_average)
        if not self.rpc_timeout > 0:
            raise ValueError(f"`rpc_timeout` must be > 0 seconds, got {self.rpc_timeout}.")


@dataclass(frozen=True, kw_only=True)
class MergeOptions(OptionGroup):
    """Options of local SGD's replica merger (``mode="local"``)."""

    part: ClassVar[str] = "replica merger"
    used_by: ClassVar[str] = "mode='local'"

    megabatch_size: int | None = option(None, example=64)
    """local: samples claimed between two merges; default `10 * B`; must be at least `B`."""
    delta: float = option(0.1, example=0.2)
    """local, `local_steps="equal"`: merge-weight perturbation in `[0, 1)`: the replica with the
    most updates gets `(1+delta) * alpha`, the one with the fewest `(1-delta) * alpha`; `0` turns it
    off."""
    perturb_threshold: float = option(0.1, example=0.2)
    """local: perturb only when every replica's L2 norm per parameter is below this (`> 0`)."""
    gamma: float = option(0.0, example=0.5)
    """local: merge momentum in `[0, 1)`: `w' = sum_k alpha_k w_k + gamma * (w - w_prev)`; `0` is
    plain weighted averaging. `gamma > 0` amplifies a steady move up to `1 / (1 - gamma)` times.
    Paper 004 uses `0.9`; with a learning rate tuned for `gamma=0` that diverges, see [Merge
    momentum](../modes.md#merge-momentum-gamma) for what `gamma > 0` needs."""
    local_steps: Literal["equal", "proportional"] = option("proportional", example="equal")
    """local: `"proportional"` (batch sizes stay, controller `"static"`; each rank makes updates in
    proportion to its speed in the same wall time, replicas merged by their samples) or `"equal"`
    (paper 004: the `"updates"` controller sizes batches by speed, every rank makes the same number
    of updates per merge; needed for a controller that moves batch sizes). See [Local steps and the
    outer optimizer](../modes.md#local-steps-and-the-outer-optimizer)."""
    outer_lr: float | None = option(None, example=0.5)
    """local: DiLoCo's outer optimizer at this learning rate (Nesterov momentum 0.9 on the
    pseudo-gradient `w_last_merge - merged`); `None`: the plain weighted average. Not with
    `gamma`."""
    merge_optimizer_state: bool = option(True, example=False)
    """local: each merge also averages the replicas' optimizer state shaped like the parameters
    (SGD's momentum buffers, Adam's moments) with the merge's weights, one more all-reduce of that
    size; `False`: each replica keeps its own."""

    def check(self) -> None:
        check_merge_options(
            self.delta, self.gamma, self.perturb_threshold, self.megabatch_size, None
        )
        check_local_options(self.local_steps, self.outer_lr, self.gamma)
        if not isinstance(self.merge_optimizer_state, bool):
            value = self.merge_optimizer_state
            raise ValueError(f"`merge_optimizer_state` must be True or False, got {value!r}.")


#: The option groups: each a part's options, with their checks; a mode lists those it reads
#: (``Mode.option_groups``), and any other group's option set away from its default is
#: refused when the mode is built.
OPTION_GROUPS: tuple[type[OptionGroup], ...] = (ServerOptions, MergeOptions)


@dataclass(frozen=True, kw_only=True)
class ModeOptions(ServerOptions, MergeOptions):
    """The strategy's options that modes read (see ``HeteroStrategy`` for each), by keyword
    only: several neighbours share a type, and swapped positions would still type-check.

    The common options are fields here; a part's options are fields of its group
    (``ServerOptions``, ``MergeOptions``), checked by the group's ``check``. A new option is
    three edits: its field in its group (``option``, with its docstring), its check there, and
    its use in the mode. ``make generate`` then writes its keyword, docstring entry and row of
    ``docs/options.md`` from the field, and the strategies pick the fields out of their keyword
    arguments (``pick``)."""

    adjust_every: Literal["epoch"] | int = "epoch"
    first_boundary: Literal["auto"] | int | None = "auto"
    weighted: bool = True
    lr_scaling: bool | Literal["auto", "linear", "sqrt", "noise", "none"] = "auto"
    global_batch_size: int | None = None

    def __post_init__(self) -> None:
        # a bad value is refused whichever mode runs (each mode refuses what it cannot honour)
        for group in OPTION_GROUPS:
            group.check(self)
        check_lr_scaling(self.lr_scaling)
        if self.megabatch_size is not None and self.global_batch_size is not None:
            check_merge_options(
                self.delta, self.gamma, self.perturb_threshold, self.megabatch_size,
                self.global_batch_size,
            )  # fmt: skip

    @classmethod
    def pick(cls, arguments: dict[str, Any]) -> "ModeOptions":
        """These options out of a strategy constructor's ``locals()`` (options it does not
        take keep their defaults)."""
        return cls(**{f.name: arguments[f.name] for f in fields(cls) if f.name in arguments})

    @classmethod
    def part_options(cls) -> list[str]:
        """The names of the parts' options (every group's fields)."""
        return [f.name for group in OPTION_GROUPS for f in fields(group)]


class Mode:
    """One training mode: the strategy's lifecycle hooks, each a no-op or DDP's default here.

    Subclasses set ``name`` (the ``mode=`` value), override the hooks they need and are
    listed in ``lightning_hetero.modes.MODES``.

    Args:
        controller: the controller the re-planner runs.
        options: the strategy's options.
    """

    name: ClassVar[str] = ""
    #: The controller used when the user names none.
    default_controller: ClassVar[str] = "proportional"
    #: Ranks wait for each other at every step (gradients are combined in the step).
    steps_together: ClassVar[bool] = False
    #: Every rank runs the same number of steps per epoch. When ``False`` ranks make
    #: different numbers of steps, so training is counted in epochs only.
    even_steps: ClassVar[bool] = True
    #: The model is wrapped in ``DistributedDataParallel``.
    wraps_model: ClassVar[bool] = False
    #: Boundaries may fall inside an epoch (``adjust_every`` as a number of batches).
    replans_within_epoch: ClassVar[bool] = False
    #: The option groups (parts' options) this mode reads; see ``OPTION_GROUPS``.
    option_groups: ClassVar[tuple[type[OptionGroup], ...]] = ()
    #: A training step communicates across ranks even outside the loop (a sharded model's
    #: all-gathers), so probes must run the same steps on every rank.
    probe_steps_communicate: ClassVar[bool] = False
    #: The plan is fixed on purpose (no rank is "held" at its minimum by the controller).
    fixed_plan: ClassVar[bool] = False
    #: Runs a rank's share of a step as micro-batches (``micro_batch_size``): the loss is
    #: weighted by ``share`` and gradients accumulate until the step's last backward.
    micro_batches: ClassVar[bool] = False
    #: Runs Lightning's ``accumulate_grad_batches=N`` as one global batch of micro-batches
    #: per optimizer step (not under FSDP2, where held-gathered units would change the
    #: memory a program that fit before needs).
    takes_over_accumulation: ClassVar[bool] = False

    def __init__(self, controller: Controller, options: ModeOptions) -> None:
        self.controller = controller
        self.options = options
        self.context: RunContext | None = None
        self.replan: Replan | None = None
        self.sampler: Sampler[list[int]] | None = None
        #: ``(b_k, B)`` of the current step: this rank's samples and the step's global batch
        #: (while micro-batches run, the samples of the one running now).
        self.share: tuple[int, int] = (1, 1)
        self._keyed: tuple[list[int] | None, int] = (None, 0)  # a plan and its checksum
        # the parts a mode may hold, typed here (``None`` or empty where it has none), so that
        # the strategy reads them as attributes whatever the mode
        #: The parameter server (async modes: rank 0, while training).
        self.server: ParameterServer | None = None
        #: Local SGD's replica merger (while training) and one record per merge.
        self.merger: ReplicaMerger | None = None
        self.merges: list[dict[str, Any]] = []
        #: Dual batch size learning: the plan being run.
        self.dual_plan: DualBatchPlan | None = None

    # ---------------------------------------------------------------- construction
    @classmethod
    def check_options(cls, options: ModeOptions, controller: Controller) -> None:
        """Refuse options this mode cannot honour (at construction; values out of range are
        refused by ``ModeOptions`` itself)."""
        if not options.weighted and not cls.steps_together:  # a gradient all-reduce ablation
            raise ValueError(
                f"`weighted=False` is a BSP ablation; mode={cls.name!r} weights each rank by its"
                " batch share (use `lr_scaling='none'` for the unscaled ablation)."
            )
        if options.adjust_every != "epoch" and not cls.replans_within_epoch:
            raise ValueError(
                f"mode={cls.name!r} re-plans at epoch boundaries{cls.other_boundaries()};"
                f" `adjust_every` must be 'epoch', got {options.adjust_every!r}."
            )
        if is_count(options.first_boundary) and not cls.early_boundary():
            why = (
                "its plan is fixed"
                if cls.fixed_plan
                else "its ranks run different numbers of steps, so no batch is the same"
                " moment on every rank"
            )
            raise ValueError(
                f"`first_boundary={options.first_boundary}` re-plans inside the first epoch,"
                f" which {cls.option_text()} does not ({why}): leave `first_boundary` out."
            )
        for group in OPTION_GROUPS:
            if group in cls.option_groups:
                continue
            for option in fields(group):
                value = getattr(options, option.name)
                if value != option.default:
                    raise ValueError(
                        f"`{option.name}` is an option of the {group.part} ({group.used_by});"
                        f" {cls.option_text()} has no {group.part}. Leave"
                        f" {option.name}={option.default!r} (got {value!r}), or use"
                        f" {group.used_by}."
                    )

    @classmethod
    def controller_name(cls, options: ModeOptions) -> str:
        """The controller used when the user names none (``default_controller``)."""
        return cls.default_controller

    @classmethod
    def early_boundary(cls) -> bool:
        """Whether the first epoch may take one boundary inside it (``first_boundary``):
        every rank runs the same steps (``even_steps``), so the boundary falls at the same
        batch everywhere, and the plan may change from a step (not ``fixed_plan``). Also
        where boundaries otherwise come at epoch ends only (``mode="async"``: one wait for
        the slowest rank, which the epoch's end would have cost anyway)."""
        return cls.even_steps and not cls.fixed_plan

    @classmethod
    def other_boundaries(cls) -> str:
        """Where this mode re-plans besides epoch ends, for error messages."""
        return ""

    @classmethod
    def option_text(cls) -> str:
        """The option that selected this mode, for error messages."""
        return f"mode={cls.name!r}"

    def bind(self, context: RunContext, replan: Replan) -> None:
        """Work in ``context`` and re-plan through ``replan`` (at each run's set-up, before
        any other hook)."""
        self.context = context
        self.replan = replan

    @property
    def ctx(self) -> RunContext:
        """The run this mode is bound to."""
        if self.context is None:
            raise RuntimeError(f"hetero: {self.option_text()} is not bound to a run yet.")
        return self.context

    # ---------------------------------------------------------------- set-up
    def setup_environment(self) -> None:
        """Bring up what the mode needs besides the process group (fitting only)."""

    def setup_model(self, model: torch.nn.Module, wrap: Callable[[torch.nn.Module], Any]) -> Any:
        """The model to train: ``wrap(model)`` (DDP) when ``wraps_model``, else the model."""
        return wrap(model) if self.wraps_model else model

    def register_hooks(self, model: Any) -> None:
        """Install the mode's hooks on the wrapped model (e.g. the grads-ready marks)."""

    def first_plan(self, loader: DataLoader, probe_time: TimeProbe) -> list[int] | None:
        """A plan made by the mode itself (``None``: the strategy's plan state makes it)."""
        return None

    def rescaled_plan(self) -> list[int] | None:
        """The mode's own plan at a new input scale (``None``: the plan state rescales)."""
        return None

    def batch_sampler(
        self, epochs: EpochPermutation, plan: list[int], drop_last: bool, lower: int
    ) -> Sampler[list[int]]:
        """This rank's training batches: its slice of each global batch of ``plan``."""
        ctx = self.ctx
        self.sampler = GlobalBatchSampler(
            epochs,
            plan,
            rank=ctx.rank,
            drop_last=drop_last,
            min_batch_sizes=[lower] * ctx.world_size,
        )
        return self.sampler

    def apply_plan(self, plan: list[int], from_step: int | None) -> None:
        """Switch the sampler to ``plan`` from ``from_step`` (``None``: the next epoch)."""
        assert isinstance(self.sampler, GlobalBatchSampler)
        self.sampler.set_plan(plan, from_step)

    def drawn_steps(self) -> int:
        """Steps this rank's loader has drawn this epoch (a plan may change after them)."""
        return self.sampler.cursor if isinstance(self.sampler, GlobalBatchSampler) else 0

    # ---------------------------------------------------------------- training
    def on_train_start(self) -> None:
        """Training starts (after the first training loader was built)."""

    def step_layout(self, batch_idx: int) -> tuple[int, int, bool] | None:
        """``(b_k, B, planned)`` of step ``batch_idx``; ``planned``: it runs the plan in force
        (irregular steps, such as an epoch's short last one, are not timed). ``None``: no
        training sampler (nothing to time)."""
        sampler = self.sampler
        if not isinstance(sampler, GlobalBatchSampler):
            return None
        step = min(batch_idx, len(sampler) - 1)
        _, sizes = sampler.layout(step)
        return sizes[self.ctx.rank], sum(sizes), sizes == sampler.plan_at(step)

    def step_samples(self, batch_idx: int) -> int | None:
        """The samples this rank trains in step ``batch_idx`` (``b_k``), read without
        consuming anything; ``None``: not known before the step."""
        layout = self.step_layout(batch_idx)
        return None if layout is None else layout[0]

    def on_train_batch_start(self, batch_idx: int) -> None:
        """Close the previous step's timing; set ``share``; time the step if planned."""
        timer = self.ctx.timer
        layout = self.step_layout(batch_idx)
        if layout is not None:
            self.share = layout[:2]
        if layout is not None and layout[2]:
            timer.start(layout[0], self._plan_key(batch_idx))
        else:  # an untimed step: the next one's cycle must not hold it
            timer.break_cycle()

    def _plan_key(self, batch_idx: int) -> int:
        """The checksum of the plan step ``batch_idx`` runs under (its step time is that
        plan's)."""
        sampler = self.sampler
        if not isinstance(sampler, GlobalBatchSampler):
            return 0
        plan = sampler.plan_at(min(batch_idx, len(sampler) - 1))
        if plan is not self._keyed[0]:  # the sampler hands out the same list until it changes
            self._keyed = (plan, plan_checksum(plan))
        return self._keyed[1]

    def backward(self, loss: torch.Tensor, run: Callable[[torch.Tensor], None]) -> None:
        """Run the backward pass of ``loss`` (``run(loss)``; a mode may scale the loss)."""
        run(loss)

    def scale_loss(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss * K * b_k / B`` for this step's ``share``: once the ranks' gradients are
        averaged (DDP's all-reduce, FSDP's reduce-scatter), rank ``k``'s weighs ``b_k / B``."""
        local, total = self.share
        factor = self.ctx.world_size * local / total
        return loss if factor == 1.0 else loss * factor

    def post_backward(self) -> None:
        """A backward pass ended (of ``share``'s samples: a micro-batch's, while they run)."""
        self.ctx.timer.backward_done(self.share[0])

    def optimizer_step(self, optimizer: torch.optim.Optimizer, run: Callable[[], Any]) -> Any:
        """Step ``optimizer`` (``run`` is Lightning's step); the step's work is compute."""
        output = run()
        self.ctx.timer.step_done()
        return output

    def on_train_epoch_start(self) -> None:
        """An epoch of training starts."""

    def on_train_epoch_end(self) -> bool:
        """The epoch's batches are over; ``True`` when the re-planner may run an epoch-end
        boundary now (``False``: the mode re-planned already, e.g. at each merge)."""
        return True

    def boundary_stats(self) -> dict[str, Any]:
        """Extra per-rank figures for the boundary's history entry (rank 0)."""
        return {}

    def on_validation_start(self, epoch_end: bool = False) -> None:
        """Validation during fitting starts (not in the sanity check); ``epoch_end``: after
        the epoch's last batch, before ``on_train_epoch_end``."""

    def on_train_end(self) -> None:
        """Training ends."""

    # ---------------------------------------------------------------- checkpoints, faults
    def state_dict(self) -> dict[str, Any]:
        """What the mode's parts learned that the model and optimizers do not hold (saved
        with the re-planner's state in ``HeteroCallback``'s checkpoint entry)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Continue from ``state`` (of ``state_dict``; empty: a checkpoint without it)."""

    def before_model_state(self) -> None:
        """The model's state is about to be saved."""

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        """The state to checkpoint for ``optimizer`` (``None``: the optimizer's own)."""
        return None

    def timed_step_extra(self, module: torch.nn.Module) -> None:
        """What a timed probe step costs besides forward and backward (e.g. a push)."""

    def on_exception(self, exception: BaseException) -> None:
        """Training failed with ``exception`` (add what the mode knows to its message)."""

    def teardown(self) -> None:
        """Release what ``setup_environment`` and ``on_train_start`` brought up."""
