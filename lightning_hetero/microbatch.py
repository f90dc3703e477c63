"""Micro-batches: a rank's share of a step, run a few samples at a time.

With ``micro_batch_size``, rank ``k`` runs its ``b_k`` samples of a step as
``ceil(b_k / m_k)`` micro-batches of at most ``m_k`` samples (sizes differing by at most
one), inside one Lightning training step. Each micro-batch's loss is weighted by its samples
``/ B`` (times ``K``, as every rank's loss: see ``Mode.scale_loss``), gradients accumulate locally,
and only the
last micro-batch's backward communicates, so every rank issues the same collectives once per
optimizer step whatever its number of micro-batches. Torch mechanisms only: no controller.
"""

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from typing import Any

import torch
from lightning_utilities.core.apply_func import apply_to_collection

from lightning_hetero.planning.split import is_count
from lightning_hetero.sampler import EpochPermutation

__all__ = [
    "check_micro_batch_size",
    "converted_accumulation",
    "local_metric_syncs",
    "micro_bounds",
    "micro_sizes",
    "note_collective_in_micro_batch",
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
def local_metric_syncs(module: torch.nn.Module, local: bool) -> Iterator[None]:
    """With ``local``, the module's torchmetrics metrics that sync on every step
    (``dist_sync_on_step=True``) compute this micro-batch's value on this rank alone.

    Ranks run different numbers of micro-batches per step, so a sync in each would pair
    with nothing on the others; each rank syncs in its last micro-batch only (as
    ``HeteroEngine.reduce`` does for logged values), one sync per optimizer step everywhere.
    """
    metrics = local and [m for m in module.modules() if getattr(m, "dist_sync_on_step", 0) is True]
    if not metrics:
        yield
        return
    for metric in metrics:
        metric.dist_sync_on_step = False
    try:
        yield
    finally:
        for metric in metrics:
            metric.dist_sync_on_step = True


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
