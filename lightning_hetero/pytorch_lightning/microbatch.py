# Generated from lightning_hetero/microbatch.py by `make generate`; do not edit.  # ruff: noqa
# fmt: off
"""Micro-batches: a rank's share of a step, run a few samples at a time.

``MicroBatches`` is the executor a hetero strategy hands each training step to; the
functions are its pure parts (the split, the accumulation take-over's counts).

With ``micro_batch_size``, rank ``k`` runs its ``b_k`` samples of a step as
``ceil(b_k / m_k)`` micro-batches of at most ``m_k`` samples (sizes differing by at most
one), inside one Lightning training step. Each micro-batch's loss is weighted by its samples
``/ B`` (times ``K``, as every rank's loss: see ``Mode.scale_loss``), gradients accumulate locally,
and only the
last micro-batch's backward communicates, so every rank issues the same collectives once per
optimizer step whatever its number of micro-batches. Torch mechanisms only: no controller.
"""

import math
import threading
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any, ClassVar

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import GradientAccumulationScheduler, StochasticWeightAveraging
from lightning_utilities.core.apply_func import apply_to_collection
from lightning_utilities.core.rank_zero import rank_zero_info
from torch.utils.data import DataLoader

from lightning_hetero.pytorch_lightning._lightning import (
    LOOP_COUNTS,
    count_loader_batches,
    in_training_batch,
    log_resets_once,
    running_hook,
    set_logged_batch,
    set_loop_counts,
    set_validation_steps,
    skips_backward,
)
from lightning_hetero.planning.split import is_count
from lightning_hetero.sampler import EpochPermutation, GlobalBatchSampler

__all__ = [
    "check_micro_batch_size",
    "converted_accumulation",
    "local_metric_syncs",
    "micro_bounds",
    "micro_sizes",
    "note_collective_in_micro_batch",
    "COLLECTIVES",
    "own_collectives",
    "refused_collectives",
    "FirstSamples",
    "ddp_loader_batches",
    "limited_batches",
    "validates_after",
    "split_batch",
    "step_loss",
]


def check_micro_batch_size(value: Any) -> None:
    """Refuse a ``micro_batch_size`` that is not ``None``, an int >= 1, a non-empty list of
    them (one per rank) or ``"auto"`` (at construction)."""
    if value is None or value == "auto":
        return
    if is_count(value):
        return
    if (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and value
        and all(is_count(v) for v in value)
    ):
        return
    raise ValueError(
        "`micro_batch_size` must be None, an int >= 1 (every rank), a list of ints >= 1 (one"
        f" per rank) or 'auto' (each rank's bound from the memory probe), got {value!r}."
    )


def converted_accumulation(
    accumulate: int,
    micro_batch_size: Any,
    global_batch_size: int | None,
    batch_sizes: str | Sequence[int],
) -> int:
    """How many of Lightning's accumulated loader batches the strategy runs as one global batch
    of micro-batches (1: none); raises ``ValueError`` where the Trainer's
    ``accumulate_grad_batches`` meets options that already plan a step's samples.

    A program written for DDP with a loader batch ``b`` and ``accumulate_grad_batches=N`` on
    ``K`` ranks trains on ``N * b * K`` samples per optimizer step: planned as one global
    batch whose shares run as micro-batches of at most ``b``, the share follows the speeds
    even when ``b`` is all a rank can hold. ``global_batch_size``, ``micro_batch_size`` or an
    explicit plan say what a step is already; with them accumulation would count twice.

    >>> converted_accumulation(4, None, None, "uniform")
    4
    >>> converted_accumulation(1, 2, 32, "uniform")
    1
    """
    if accumulate == 1:
        return 1
    given = [
        f"{name}={value!r}"
        for name, value in (
            ("micro_batch_size", micro_batch_size),
            ("global_batch_size", global_batch_size),
            ("batch_sizes", None if isinstance(batch_sizes, str) else list(batch_sizes)),
        )
        if value is not None
    ]
    if given:
        raise ValueError(
            f"HeteroStrategy({', '.join(given)}) plans the samples of each optimizer step, and"
            f" the Trainer's `accumulate_grad_batches={accumulate}` would accumulate"
            f" {accumulate} such steps again. Plan the optimizer step as one global batch"
            " instead: HeteroStrategy(global_batch_size=<samples per optimizer step>,"
            " micro_batch_size=<samples a rank holds at once>) with"
            " `accumulate_grad_batches=1`; or leave both unset and keep"
            " `accumulate_grad_batches` (the strategy then plans loader batch x"
            " accumulate_grad_batches x ranks samples per step, see docs/memory.md)."
        )
    return accumulate


def ddp_loader_batches(samples: int, ranks: int, batch: int, drop_last: bool) -> int:
    """The batches of each rank's training loader under DDP for ``samples`` samples
    (``DistributedSampler`` gives each rank ``ceil(samples / ranks)``).

    >>> ddp_loader_batches(40, 2, 2, drop_last=False)
    10
    """
    per_rank = math.ceil(samples / ranks)
    return per_rank // batch if drop_last else math.ceil(per_rank / batch)


def limited_batches(batches: int, limit: int | float) -> int:
    """An epoch's training batches under the Trainer's ``limit_train_batches`` (Lightning's
    rule: an int caps them, a float keeps that fraction, rounded down).

    >>> limited_batches(10, 5), limited_batches(10, 0.25), limited_batches(10, 1.0)
    (5, 2, 10)
    """
    if isinstance(limit, int) and not isinstance(limit, bool):
        return min(batches, limit)
    return batches if limit == 1.0 else int(batches * limit)


def validates_after(step: int, batches: int, accumulate: int, every: int, offset: int = 0) -> bool:
    """Whether DDP validates at the end of optimizer step ``step`` (counted from 1) of an epoch
    of ``batches`` loader batches, ``accumulate`` of them per step, validating after every
    ``every``-th loader batch (counted from ``offset``: the batches of earlier epochs where
    Lightning counts across epochs, ``check_val_every_n_epoch=None``).

    DDP validates after loader batch ``c`` with the optimizer steps made so far: ``c //
    accumulate``, and all of the epoch's after its last batch (a last, partial window steps
    too). A check before the epoch's first step (``c < accumulate``) has no step to follow.

    >>> [s for s in range(1, 6) if validates_after(s, 10, 2, 5)]  # val_check_interval=0.5
    [2, 5]
    >>> [s for s in range(1, 4) if validates_after(s, 5, 2, 3)]  # 5 batches: steps 2, 2, 1
    [1]
    """
    steps = math.ceil(batches / accumulate)
    first = step * accumulate
    candidates = list(range(first, min(first + accumulate, batches)))
    if step == steps:
        candidates.append(batches)
    return any((offset + c) % every == 0 for c in candidates)


class FirstSamples(EpochPermutation):
    """The first ``count`` positions of ``epochs``' permutation in each epoch: an epoch cut
    as ``limit_train_batches`` cuts DDP's, whose last optimizer step is then a partial window
    of accumulation (a smaller global batch).

    >>> list(FirstSamples(EpochPermutation(10, shuffle=False), 6))
    [0, 1, 2, 3, 4, 5]
    """

    def __init__(self, epochs: EpochPermutation, count: int) -> None:
        super().__init__(min(count, len(epochs)), epochs.shuffle, epochs.seed)
        self.epochs = epochs
        self.epoch = epochs.epoch

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch
        self.epochs.set_epoch(epoch)

    def permutation(self) -> list[int]:
        return self.epochs.permutation()[: self.num_samples]


def micro_bounds(value: int | Sequence[int], world_size: int) -> list[int]:
    """One micro-batch bound per rank from a checked ``micro_batch_size`` (not ``"auto"``)."""
    if isinstance(value, int):
        return [value] * world_size
    if len(value) != world_size:
        raise ValueError(
            f"`micro_batch_size` has {len(value)} entries but there are {world_size} ranks:"
            " give one bound per rank, or one number for every rank."
        )
    return list(value)


def micro_sizes(samples: int, bound: int, lower: int = 1) -> list[int]:
    """``ceil(samples / bound)`` sizes of at most ``bound`` that sum to ``samples``, the
    larger ones first and differing by at most one (no tiny last micro-batch), and none
    below ``lower`` (a BatchNorm model's 2: a batch of one has no variance): where both
    cannot hold, fewer, larger micro-batches (at most ``lower - 1`` samples over ``bound``).

    >>> micro_sizes(10, 4)
    [4, 3, 3]
    >>> micro_sizes(3, 4)
    [3]
    >>> micro_sizes(5, 2), micro_sizes(5, 2, lower=2)
    ([2, 2, 1], [3, 2])
    """
    parts = max(1, min(math.ceil(samples / bound), samples // max(lower, 1)))
    size, extra = divmod(samples, parts)
    return [size + 1] * extra + [size] * (parts - extra)


def split_batch(batch: Any, samples: int, sizes: Sequence[int]) -> list[Any]:
    """``batch`` cut into consecutive micro-batches of ``sizes`` samples.

    Every tensor whose first dimension is ``samples`` long is sliced (views, no copy), and so
    is every list or tuple of ``samples`` non-tensor items that is a value of a dict batch
    (e.g. file names); other values go unchanged to every micro-batch. Raises ``ValueError`` when
    no tensor of the batch has ``samples`` rows.
    """
    found = False

    def has_rows(tensor: torch.Tensor) -> torch.Tensor:
        nonlocal found
        found = found or (tensor.dim() > 0 and len(tensor) == samples)
        return tensor

    apply_to_collection(batch, torch.Tensor, has_rows)
    if not found:
        raise ValueError(
            f"hetero: `micro_batch_size` cannot cut this rank's batch of {samples} samples: none"
            f" of its tensors has {samples} rows (batch: {type(batch).__name__}). Micro-batches"
            " slice the tensors of a batch along their first dimension; return samples first"
            " from the collate function, or leave `micro_batch_size` unset."
        )
    parts = []
    start = 0
    for size in sizes:
        stop = start + size

        def cut(tensor: torch.Tensor, start: int = start, stop: int = stop) -> torch.Tensor:
            return tensor[start:stop] if tensor.dim() > 0 and len(tensor) == samples else tensor

        part = apply_to_collection(batch, torch.Tensor, cut)
        if isinstance(part, dict):  # per-sample lists beside the tensors (e.g. names)
            for key, value in part.items():
                if _per_sample_list(value, samples):
                    part[key] = value[start:stop]
        parts.append(part)
        start = stop
    return parts


def _per_sample_list(value: Any, samples: int) -> bool:
    return (
        isinstance(value, (list, tuple))
        and len(value) == samples
        and not any(isinstance(v, torch.Tensor) for v in value)
    )


def step_loss(output: Any) -> torch.Tensor:
    """The loss in a ``training_step``'s output (a tensor or a dict with ``"loss"``), as
    Lightning's automatic optimization reads it."""
    loss = output.get("loss") if isinstance(output, Mapping) else output
    if not isinstance(loss, torch.Tensor):
        raise ValueError(
            "hetero: with `micro_batch_size`, every micro-batch's `training_step` must return"
            f" the loss (a tensor, or a dict with 'loss'), got {type(output).__name__}."
        )
    return loss


@contextmanager
def local_metric_syncs(
    module: torch.nn.Module, local: bool, allowed: bool = False
) -> Iterator[None]:
    """With ``local``, the module's torchmetrics metrics that sync on every step
    (``dist_sync_on_step=True``) compute this micro-batch's value on this rank alone.

    Ranks run different numbers of micro-batches per step, so a sync in each would pair
    with nothing on the others; each rank syncs in its last micro-batch only (as
    ``HeteroEngine.reduce`` does for logged values), one sync per optimizer step everywhere.
    With ``allowed`` (a last micro-batch while ``refused_collectives`` holds), their syncs
    run as the strategy's own (``own_collectives``).
    """
    metrics = (local or allowed) and [
        m for m in module.modules() if getattr(m, "dist_sync_on_step", 0) is True
    ]
    if not metrics:
        yield
        return
    saved = [(metric, metric.dist_sync_fn) for metric in metrics]
    for metric, sync in saved:
        if local:
            metric.dist_sync_on_step = False
        else:
            metric.dist_sync_fn = _as_own(sync or _gather_all_tensors())
    try:
        yield
    finally:
        for metric, sync in saved:
            metric.dist_sync_on_step, metric.dist_sync_fn = True, sync


def _gather_all_tensors() -> Callable[..., Any]:
    from torchmetrics.utilities.distributed import gather_all_tensors

    return gather_all_tensors


#: ``torch.distributed``'s collectives, refused while a micro-batch before a rank's last runs.
COLLECTIVES = (
    "all_gather", "all_gather_into_tensor", "all_gather_object", "all_reduce", "all_to_all",
    "all_to_all_single", "barrier", "broadcast", "broadcast_object_list", "gather",
    "gather_object", "reduce", "reduce_scatter", "reduce_scatter_tensor", "scatter",
    "scatter_object_list",
)  # fmt: skip

# the strategy's own collectives while `refused_collectives` holds (depth, this thread)
_OWN = threading.local()


@contextmanager
def own_collectives() -> Iterator[None]:
    """The strategy's own collectives (a deferred step-level sync, a metric's sync in the
    rank's last micro-batch) pass ``refused_collectives``: every rank makes them once per
    optimizer step."""
    depth = getattr(_OWN, "depth", 0)
    _OWN.depth = depth + 1
    try:
        yield
    finally:
        _OWN.depth = depth


def _as_own(function: Callable[..., Any]) -> Callable[..., Any]:
    def own(*args: Any, **kwargs: Any) -> Any:
        with own_collectives():
            return function(*args, **kwargs)

    return own


@contextmanager
def refused_collectives(
    counts: Sequence[int] | None = None, names: Sequence[str] = COLLECTIVES
) -> Iterator[None]:
    """While a micro-batch before this rank's last of a step runs (its ``training_step`` and
    backward), or any training step of a step whose ranks run different numbers of
    micro-batches (``counts``, one per rank): a collective of ``torch.distributed`` raises an
    error that names it, unless the strategy makes it (``own_collectives``). ``names``: the
    functions refused (all of ``COLLECTIVES`` by default).

    Ranks run different numbers of micro-batches, so a collective in each would pair with
    nothing on the other ranks (gloo aborts the process, NCCL hangs). With ``counts`` every
    rank refuses its first such call, the ranks with one micro-batch included, so none is
    left waiting in the call. DDP's own communication is not affected (``no_sync`` holds the
    gradient all-reduce back, and its buffer broadcast is a private call).
    """
    import torch.distributed as dist

    saved = {name: getattr(dist, name) for name in names if hasattr(dist, name)}
    where = (
        f"inside a training step whose ranks run different numbers of micro-batches"
        f" ({list(counts)} this step)"
        if counts is not None
        else "inside a micro-batch that is not this rank's last of the step"
    )

    def refuse(name: str) -> Callable[..., Any]:
        function = saved[name]

        def collective(*args: Any, **kwargs: Any) -> Any:
            if getattr(_OWN, "depth", 0):
                return function(*args, **kwargs)
            raise RuntimeError(
                f"hetero: `torch.distributed.{name}` was called {where}. Each rank runs"
                " `training_step` (and the backward hooks) once per micro-batch, a different"
                " number of times, so the call would pair with nothing on the other ranks."
                " `self.log(..., sync_dist=True)` and torchmetrics' `dist_sync_on_step` sync"
                " once per optimizer step by themselves; move any other collective"
                " (`self.all_gather`, your own `all_reduce`) to `on_train_batch_end`, or train"
                " without micro-batches (no `micro_batch_size`, `accumulate_grad_batches=1`)."
            )

        return collective

    for name in saved:
        setattr(dist, name, refuse(name))
    try:
        yield
    finally:
        for name, function in saved.items():
            setattr(dist, name, function)


def note_collective_in_micro_batch(error: BaseException) -> None:
    """Say, on a collective's error in a micro-batched step, what runs a different number of
    times on each rank (a user's own collective in ``training_step`` or a backward hook)."""
    text = str(error).lower()
    if isinstance(error, RuntimeError) and any(
        word in text for word in ("collective", "gloo", "nccl", "timed out", "timeout")
    ):
        error.add_note(
            "hetero: this collective ran inside a micro-batched step, where each rank runs"
            " `training_step` (and the backward hooks) once per micro-batch, a different number"
            " of times. `self.log(..., sync_dist=True)`, the strategy's `reduce` and torchmetrics'"
            " `dist_sync_on_step` sync once per optimizer step; move any other collective"
            " (`torch.distributed.all_reduce`, `self.all_gather`) to `on_train_batch_end`, or"
            " leave `micro_batch_size` unset and `accumulate_grad_batches=1`."
        )


#: A micro-batch still to run in this step: its batch, samples, other arguments and keywords.
_Part = tuple[Any, int, tuple[Any, ...], dict[str, Any]]


class MicroBatches:
    """A rank's share of each training step, run as micro-batches, for a hetero strategy.

    It owns the split of the share (``micro_sizes``, at most the rank's bound and never
    below the model's minimum), the loss weights (the mode's ``share`` is each micro-batch's
    while it runs: ``samples / B``), the micro-batches after the first (run right after the
    first one's backward, wherever Lightning's closure is called), the collectives (only the
    last micro-batch's backward synchronizes; step-level syncs are deferred to it, see
    ``local``) and Lightning's ``accumulate_grad_batches`` taken over as one global batch
    (``take_over``). The strategy keeps ``micro_bounds`` and ``micro_batch_samples`` as its
    public state and calls ``sizes``, ``first``, ``run_rest``, ``abort`` and ``after`` from
    its ``training_step``, ``backward`` and ``optimizer_step``.

    A strategy whose micro-batches hold something across a step overrides ``forward`` and
    ``failed`` (``HeteroFSDPStrategy``: FSDP2's switches, ``UnshardedAccumulation``).
    """

    #: The collectives of ``torch.distributed`` that raise an error naming them in a
    #: micro-batch before the rank's last, or in any training step of a step whose ranks run
    #: different counts (``refused_collectives``): all but those the micro-batches' own
    #: communication goes through (FSDP2's all-gathers and reduce-scatters).
    refused: ClassVar[tuple[str, ...]] = COLLECTIVES
    #: Take Lightning's accumulation over at world size 1 too (one rank has no shares to
    #: balance, so by default Lightning's accumulation runs there as it is; tests turn it on
    #: to run the take-over in one process).
    takes_over_one_rank: ClassVar[bool] = False

    def __init__(self, strategy: Any) -> None:
        self.strategy = strategy
        #: A micro-batch before this rank's last of the step runs (its training step and its
        #: backward): step-level syncs stay local, as ranks run different counts of them.
        self.local = False
        self._rest: list[_Part] = []
        # the step's whole batch and share, put back once its micro-batches ran
        self._whole: tuple[Any, tuple[int, int]] | None = None
        # accumulation taken over: the Trainer and the user's loop counts, put back at
        # teardown; the user's `val_check_interval` and `limit_train_batches`; DDP's loader
        # batches per epoch and validation interval
        self._user_counts: tuple[Any, dict[str, int | float]] | None = None
        self._ddp_counts: tuple[Any, Any] = (1.0, 1.0)
        self._ddp_batches, self._ddp_every = 0, None
        self._loader_batch = 0  # the loader batch ``b`` (taken over)
        self._undo_validation: Callable[[], None] | None = None
        self._undo_bar: Callable[[], None] | None = None  # the progress bar's loader batches
        self._undo_resets: Callable[[], None] | None = None  # while a step's run
        # each micro-batch's loss and samples, and the step's loss once all of them ran
        self._losses: list[tuple[torch.Tensor, int]] = []
        self._step_loss: torch.Tensor | None = None
        #: The ranks' micro-batch counts of this step where they differ (``plan_step``):
        #: every training step then refuses the user's collectives, on every rank.
        self.uneven: list[int] | None = None

    # ---------------------------------------------------------------- seams
    def forward(self, last: bool) -> AbstractContextManager[Any]:
        """Around a micro-batch's forward: all but the step's ``last`` run without DDP's
        gradient synchronization (DDP decides in the forward whether the backward reduces)."""
        return nullcontext() if last else self.strategy.block_backward_sync()

    def failed(self) -> None:
        """A step's micro-batches stopped before their last (an error): undo what ``forward``
        left set across them (DDP: nothing)."""

    # ---------------------------------------------------------------- set-up
    def take_over(self, trainer: "pl.Trainer") -> None:
        """Run Lightning's ``accumulate_grad_batches=N`` as one global batch per optimizer step.

        Where the mode takes accumulation over (``Mode.takes_over_accumulation``: DDP's
        ``"bsp"``), the ``N * b * K`` samples of a step are planned together and each rank's
        share runs as micro-batches of at most the loader batch ``b`` (set once the loader is
        seen), so the share follows the speeds; Lightning runs with accumulation 1, one loop
        batch per optimizer step, and the user's counts of loader batches are applied as DDP
        applies them (``loop_counts``; see docs/memory.md, "the accumulation story").
        Elsewhere, and beside ``StochasticWeightAveraging``, each accumulated batch is planned
        on its own, as before, and ``micro_batch_size`` beside accumulation is refused. Beside a
        ``GradientAccumulationScheduler`` nothing is taken over: Lightning refuses
        ``accumulate_grad_batches`` with it itself (at the start of training).
        """
        strategy = self.strategy
        state = strategy.plan_state
        state.accumulation = 1
        if strategy.micro_batch_size is None:
            strategy.micro_bounds = None  # a previous fit's, from its loader batch
        accumulate = trainer.accumulate_grad_batches
        if not strategy.lightning_module.automatic_optimization:
            return  # Lightning refuses accumulation with manual optimization itself
        if any(isinstance(cb, GradientAccumulationScheduler) for cb in trainer.callbacks):
            return  # Lightning refuses it beside `accumulate_grad_batches` (on_train_start)
        # SWA's batch-norm epoch sets the loop's batch count and accumulation itself (one more
        # batch, all accumulated) from the Trainer's, and puts back at train end what it saw:
        # beside it the loop keeps Lightning's shape
        swa = any(isinstance(cb, StochasticWeightAveraging) for cb in trainer.callbacks)
        if swa or not strategy.training_mode.takes_over_accumulation:
            if strategy.micro_batch_size is not None and accumulate != 1:
                raise ValueError(
                    f"{type(strategy).__name__}(micro_batch_size={strategy.micro_batch_size!r})"
                    " plans the samples of each optimizer step as micro-batches, and the"
                    f" Trainer's `accumulate_grad_batches={accumulate}` would accumulate"
                    f" {accumulate} such steps again. Set global_batch_size=<samples per"
                    " optimizer step> with `accumulate_grad_batches=1`."
                )
            return
        accumulate = converted_accumulation(
            accumulate, strategy.micro_batch_size, state.global_batch_size, state.initial
        )
        if accumulate == 1 or (strategy.world_size == 1 and not self.takes_over_one_rank):
            return  # one rank has no shares to balance: Lightning's accumulation, as it is
        self._ddp_counts = (trainer.val_check_interval, trainer.limit_train_batches)
        counts = {name: getattr(trainer, name) for name in LOOP_COUNTS}
        self._user_counts = (trainer, set_loop_counts(trainer, counts))
        trainer.accumulate_grad_batches = 1
        self._undo_validation = set_validation_steps(trainer, self.validates)
        self._undo_bar = count_loader_batches(trainer, lambda: self._ddp_batches, accumulate)
        state.accumulation = accumulate
        rank_zero_info(
            f"hetero: `accumulate_grad_batches={accumulate}` runs as one global batch of"
            f" loader batch x {accumulate} x {strategy.world_size} ranks per optimizer step,"
            " each rank's share in micro-batches of at most the loader batch (the loop counts"
            " optimizer steps: one batch each; the progress bar counts loader batches)."
        )

    def check(self, trainer: "pl.Trainer") -> None:
        """Refuse what micro-batches cannot run exactly (at set-up, before any step)."""
        strategy = self.strategy
        if strategy._layer_sync is not None:
            # SyncBatchNorm all-reduces in every forward: once per micro-batch, whose counts
            # differ between ranks
            raise ValueError(
                f"{type(strategy).__name__} runs each rank's share of a step as its own number"
                " of micro-batches (`micro_batch_size`, or the Trainer's"
                " `accumulate_grad_batches` taken over), and SyncBatchNorm"
                " (`sync_batchnorm=True`) communicates in every forward, so the ranks'"
                " collectives would not pair. Remove `sync_batchnorm` (each rank's BatchNorm"
                " then normalizes its own micro-batch), or train without micro-batches"
                " (`accumulate_grad_batches=1`, no `micro_batch_size`)."
            )
        module = strategy.lightning_module
        if not module.automatic_optimization:
            raise ValueError(
                f"`micro_batch_size` runs a rank's share of each step as micro-batches inside"
                f" Lightning's automatic optimization; {type(module).__name__}"
                " uses manual optimization. Remove `micro_batch_size` and cut the batch in your"
                " `training_step`: scale each `manual_backward` loss by its samples / batch"
                " size, and run all but the last in"
                " `self.trainer.strategy.block_backward_sync()`."
            )
        scheduler = GradientAccumulationScheduler
        schedulers = [cb for cb in trainer.callbacks if isinstance(cb, scheduler)]
        if schedulers:
            # it sets the Trainer's accumulation per epoch, which micro-batches would multiply
            raise ValueError(
                f"{type(strategy).__name__}(micro_batch_size={strategy.micro_batch_size!r})"
                " plans the samples of each optimizer step, and the Trainer's"
                f" `{type(schedulers[0]).__name__}` would accumulate several such steps again,"
                " by epoch. Remove the callback and plan each epoch's optimizer step as one"
                " global batch: HeteroStrategy(global_batch_size=<samples per optimizer step>,"
                " micro_batch_size=<samples a rank holds at once>); or remove"
                " `micro_batch_size` (each accumulated batch is then planned on its own)."
            )

    def loop_counts(self, trainer: "pl.Trainer", loader: DataLoader) -> int | None:
        """Lightning's loop counts for an epoch of ``loader`` with accumulation taken over
        (one loop batch per optimizer step), from the user's counts of loader batches as DDP
        applies them; returns the samples of an epoch that ``limit_train_batches`` cuts.

        DDP's epoch has ``n`` loader batches per rank (after ``limit_train_batches``, an int
        or a fraction), ``ceil(n / N)`` optimizer steps, the last a partial window where
        ``N`` does not divide ``n``: the strategy's epoch is its first ``n * b * K`` samples,
        whose last global batch is that window. Validation follows DDP's loader-batch count
        (``validates``); Lightning's own counts are left at the whole epoch.
        """
        batch, ranks = loader.batch_size or 1, self.strategy.world_size
        full = ddp_loader_batches(len(loader.dataset), ranks, batch, loader.drop_last)
        every, limit = self._ddp_counts
        batches = limited_batches(full, limit)
        self._ddp_batches, self._ddp_every = batches, None
        self._loader_batch = batch
        if isinstance(every, float) and batches:
            self._ddp_every = max(1, int(batches * every))
        elif isinstance(every, int) and not isinstance(every, bool):
            self._ddp_every = every
            if every > batches and trainer.check_val_every_n_epoch is not None:
                trainer.val_check_interval = every  # Lightning refuses it, as under DDP
                every = None
        if self._ddp_every is not None and every is not None:
            trainer.val_check_interval = 1.0  # the decision is `validates`'
        if not batches:
            return None  # Lightning's own rules for an empty epoch (refused, or skipped)
        trainer.limit_train_batches = 1.0
        return batches * batch * ranks if batches < full else None

    def validates(self, batch_idx: int) -> bool | None:
        """Whether DDP, with the accumulation taken over, validates after the optimizer step
        of loop batch ``batch_idx`` (``None``: Lightning's own rule applies)."""
        strategy = self.strategy
        accumulate = strategy.plan_state.accumulation
        if accumulate == 1 or self._ddp_every is None:
            return None
        trainer = strategy.lightning_module.trainer
        batches = self._ddp_batches
        offset = trainer.current_epoch * batches if trainer.check_val_every_n_epoch is None else 0
        return validates_after(batch_idx + 1, batches, accumulate, self._ddp_every, offset)

    def teardown(self) -> None:
        """Put the Trainer's loop counts, validation rule and progress bar back as the user
        left them, and close a step an error left open."""
        self.abort(None)
        if self._user_counts is not None:
            set_loop_counts(*self._user_counts)
            self._user_counts = None
        if self._undo_validation is not None:
            self._undo_validation()
            self._undo_validation = None
        if self._undo_bar is not None:
            self._undo_bar()
            self._undo_bar = None

    # ---------------------------------------------------------------- the step
    def plan_step(self, batch_idx: int) -> None:
        """Read every rank's micro-batch count of step ``batch_idx`` from the plan (at the
        step's start, before the training step): ``uneven`` where they differ.

        Under the accumulation take-over, an epoch's last, partial window of ``r`` whole
        loader batches per rank weighs its samples over the full window's ``N * b * K``, as
        DDP divides each of its ``r`` losses by ``N`` all the same."""
        self.uneven = None
        strategy = self.strategy
        bounds, sampler = strategy.micro_bounds, strategy.training_mode.sampler
        module = strategy.lightning_module
        window = strategy.plan_state.accumulation > 1
        counted = (
            bounds is not None
            and bool(self.refused)
            and module.trainer.training
            and module.automatic_optimization
        )
        if not isinstance(sampler, GlobalBatchSampler) or not (window or counted):
            return
        _, shares = sampler.layout(min(batch_idx, len(sampler) - 1))
        if window:
            self._ddp_window(sampler.global_batch_size, sum(shares))
        if not counted:
            return
        lower = strategy.plan_state.lower()
        counts = [len(micro_sizes(n, bounds[k], lower)) for k, n in enumerate(shares)]
        if len(set(counts)) > 1:
            self.uneven = counts

    def _ddp_window(self, window: int, taken: int) -> None:
        """A step of ``taken`` samples where a full one has ``window``: an epoch's last,
        partial window of whole loader batches weighs over the full window."""
        loader_batches = self._loader_batch * self.strategy.world_size
        if taken < window and loader_batches and taken % loader_batches == 0:
            mode = self.strategy.training_mode
            mode.share = (mode.share[0], window)

    def whole(self) -> AbstractContextManager[Any]:
        """Around a training step run as one batch (``sizes`` is ``None``): the refusal of
        collectives where other ranks run several micro-batches (``uneven``)."""
        return self._strict(self.strategy.lightning_module)

    @contextmanager
    def _strict(self, module: torch.nn.Module) -> Iterator[None]:
        if self.uneven is None:
            yield
            return
        refused = refused_collectives(self.uneven, self.refused)
        with refused, local_metric_syncs(module, False, allowed=True):
            yield

    def sizes(self) -> list[int] | None:
        """The sizes of this step's micro-batches; ``None``: the step runs as one batch."""
        strategy = self.strategy
        bounds = strategy.micro_bounds
        module = strategy.lightning_module
        if bounds is None or not (module.trainer.training and module.automatic_optimization):
            return None
        share, lower = strategy.training_mode.share[0], strategy.plan_state.lower()
        sizes = micro_sizes(share, bounds[strategy.global_rank], lower)
        return sizes if len(sizes) > 1 else None

    def first(self, sizes: list[int], args: tuple[Any, ...], kwargs: dict[str, Any]) -> Any:
        """The training step of the step's first micro-batch (Lightning's ``training_step``
        call); the others run after its backward (``run_rest``)."""
        batch, other = args[0], args[1:]
        first, *rest = split_batch(batch, sum(sizes), sizes)
        self._whole = (batch, self.strategy.training_mode.share)
        self._rest = [(part, n, other, kwargs) for part, n in zip(rest, sizes[1:])]
        self._undo_resets = log_resets_once(self.strategy.lightning_module.trainer)
        self._losses, self._step_loss = [], None
        try:
            output = self._step(first, sizes[0], other, kwargs, last=False)
            loss = output.get("loss") if isinstance(output, Mapping) else output
            if isinstance(loss, torch.Tensor):  # else the step's loss stays Lightning's
                self._losses.append((loss.detach(), sizes[0]))
            if skips_backward(self.strategy.lightning_module.trainer):
                # no backward will follow to run the others (SWA's batch-norm epoch): now
                self.run_rest(None)
        except BaseException as error:
            self.abort(error)
            raise
        return output

    def _step(
        self, batch: Any, samples: int, other: tuple[Any, ...], kwargs: dict[str, Any], last: bool
    ) -> Any:
        """The training step of one micro-batch of ``samples``: its loss will weigh
        ``samples / B``; only the step's last backward communicates (``forward``)."""
        assert self._whole is not None
        strategy = self.strategy
        strategy.training_mode.share = (samples, self._whole[1][1])
        strategy.micro_batch_samples = samples
        module = strategy.lightning_module
        set_logged_batch(module.trainer, batch)  # self.log weighs its samples
        self.local = not last  # until the next micro-batch starts (backward too)
        # the last micro-batch's training step refuses the user's collectives where other
        # ranks run other counts; its backward does not (the gradient sync runs there)
        strict = self._strict(module) if last else nullcontext()
        with self.forward(last), local_metric_syncs(module, not last), self.guarded(), strict:
            return strategy._training_step(batch, *other, **kwargs)

    def guarded(self) -> AbstractContextManager[Any]:
        """Around a micro-batch's training step or backward: ``refused_collectives`` before
        the rank's last micro-batch of the step (those the strategy ``refused``)."""
        if self.local and self.refused:
            return refused_collectives(names=self.refused)
        return nullcontext()

    def backward(
        self, run: Callable[[torch.Tensor], None], loss: torch.Tensor, optimizer: Any
    ) -> None:
        """One backward of Lightning's automatic optimization (``run(loss)``: the strategy's
        ``backward`` with Lightning's hooks, see ``around_loop_backward``): no collective
        before the rank's last micro-batch of a step; after a micro-batched step's first, each
        of the step's other micro-batches (``run_rest``)."""
        try:
            with self.guarded():
                run(loss)
            self.run_rest(optimizer)
        except BaseException as error:
            self.abort(error)
            raise

    def run_rest(self, optimizer: Any) -> None:
        """The forward and backward of each of the step's micro-batches after its first, once
        the first's backward ran: wherever Lightning's closure runs (in the optimizer step, or
        called by a user's ``optimizer_step`` that steps later, or not at all), no micro-batch
        is left out. Then the step's share and whole batch are put back."""
        rest, self._rest = self._rest, []
        if not rest or self._whole is None:
            return  # a step run as one batch, or a backward of the rest itself
        strategy = self.strategy
        module = strategy.lightning_module
        backward = not skips_backward(module.trainer)  # as Lightning's loop runs the first
        for index, (batch, samples, other, kwargs) in enumerate(rest):
            last = index == len(rest) - 1
            with running_hook(module, "training_step"):
                output = self._step(batch, samples, other, kwargs, last=last)
            loss = step_loss(output)
            self._losses.append((loss.detach(), samples))
            if backward:
                with running_hook(module, "backward"), self.guarded():
                    strategy.backward(loss, optimizer)
        if len(self._losses) == len(rest) + 1:  # the first's too: the step's loss
            total = sum(samples for _, samples in self._losses)
            self._step_loss = sum(loss * (n / total) for loss, n in self._losses)
        self._losses = []
        # as the step's start left them: its share, and the whole batch for logging
        whole, strategy.training_mode.share = self._whole
        self._whole = strategy.micro_batch_samples = None
        set_logged_batch(module.trainer, whole)
        self._end_resets()

    def _end_resets(self) -> None:
        if self._undo_resets is not None:
            self._undo_resets()
            self._undo_resets = None

    def abort(self, error: BaseException | None) -> None:
        """A micro-batched step failed (``error``; ``None``: a step found still open at
        teardown): undo what its micro-batches left set (once)."""
        if self._whole is None:
            return
        self._whole = self.strategy.micro_batch_samples = None
        self._rest, self.local = [], False
        self._losses, self._step_loss = [], None
        self._end_resets()
        self.failed()
        if error is not None:
            note_collective_in_micro_batch(error)

    def after(self, closure: Callable[[], Any], optimizer: Any) -> Callable[[], Any]:
        """``closure`` (the first micro-batch's step, zero-grad and backward, which runs the
        others), then any micro-batches still to run (a first step that returned no loss).

        The loss the closure returns, which Lightning also hands to ``on_train_batch_end`` as
        ``outputs["loss"]``, becomes the step's: the micro-batches' losses weighted by their
        samples (the loss of the rank's whole share, as one batch, or the sum of what
        Lightning's accumulation hands over the batches of a window)."""

        def run() -> Any:
            result = closure()
            try:
                self.run_rest(optimizer)
            except BaseException as error:
                self.abort(error)
                raise
            step, self._step_loss = self._step_loss, None
            if isinstance(result, torch.Tensor) and step is not None:
                with torch.no_grad():
                    result.copy_(step)  # Lightning's detached copy of the first's loss
            return result

        return run

    def syncs_locally(self) -> bool:
        """Whether a reduction now is a step-level sync deferred to the rank's last
        micro-batch (see ``HeteroEngine.reduce``)."""
        return self.local and in_training_batch(self.strategy.lightning_module)
