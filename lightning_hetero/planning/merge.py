"""Merging weights for local SGD with elastic model averaging (paper 004, Algorithm 2).

In ``mode="local"`` every rank trains its own replica through a mega-batch and the
replicas are then averaged into one global model. This module holds the arithmetic
of that average, with no torch import:

* [`merge_weights`][lightning_hetero.planning.merge.merge_weights] gives each replica its share
  ``alpha_k``: in proportion to its
  batch size when all ranks made the same number of updates, otherwise in proportion
  to its update count; optionally the most- and least-updated replicas are nudged up
  and down by a factor ``delta``.
* [`momentum_merge`][lightning_hetero.planning.merge.momentum_merge] adds the momentum term ``gamma
  * (w - w_prev)`` to the
  weighted average.
* [`check_merge_options`][lightning_hetero.planning.merge.check_merge_options] validates the
  strategy's options up front.
* [`sample_weights`][lightning_hetero.planning.merge.sample_weights] gives each replica its
  share of the samples trained since the last merge (``local_steps="proportional"``).
* [`claim_order`][lightning_hetero.planning.merge.claim_order] is who claims which batch of a
  mega-batch when ranks of different speeds share its pool.
* [`outer_step`][lightning_hetero.planning.merge.outer_step] is DiLoCo's outer optimizer:
  Nesterov momentum on the pseudo-gradient ``w_last_merge - merged`` (``outer_lr``).
"""

from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite
from numbers import Integral
from typing import Any, Literal, TypeVar

__all__ = [
    "LOCAL_STEPS",
    "OUTER_MOMENTUM",
    "MergeWeights",
    "check_local_options",
    "check_merge_options",
    "claim_order",
    "merge_weights",
    "momentum_merge",
    "outer_step",
    "sample_weights",
]

#: ``local_steps`` rules: ``"equal"`` (paper 004: batch sizes follow speed, every rank makes
#: the same number of updates per merge) or ``"proportional"`` (batch sizes stay, each rank
#: makes updates in proportion to its speed in the same wall time).
LOCAL_STEPS = ("equal", "proportional")
#: The outer optimizer's Nesterov momentum (DiLoCo's 0.9).
OUTER_MOMENTUM = 0.9

T = TypeVar("T")


@dataclass(frozen=True)
class MergeWeights:
    """The result of [`merge_weights`][lightning_hetero.planning.merge.merge_weights].

    ``weights[k]`` multiplies replica ``k``; ``perturbed`` says whether the
    most/least-updated adjustment was applied (then the weights may not sum to 1);
    ``basis`` is ``"batch"`` (shares of the batch sizes), ``"updates"`` (shares of
    the update counts) or ``"samples"`` (shares of the samples trained).
    """

    weights: list[float]
    perturbed: bool
    basis: Literal["batch", "updates", "samples"]


def _check_delta(delta: float) -> None:
    if not isfinite(delta):
        raise ValueError(f"The perturbation factor delta must be finite, got {delta}.")
    if delta < 0:
        raise ValueError(
            f"The perturbation factor delta must be in [0, 1): negative delta {delta}."
        )
    if delta >= 1:
        raise ValueError(
            f"The perturbation factor delta must be in [0, 1), got {delta}: with delta >= 1"
            " the least-updated replica would get a weight <= 0."
        )


def _check_threshold(threshold: float) -> None:
    if not threshold > 0:  # also rejects NaN
        raise ValueError(f"The perturbation threshold must be > 0, got {threshold}.")


def merge_weights(
    batch_sizes: Sequence[int],
    updates: Sequence[int],
    replica_norms: Sequence[float] | None = None,
    delta: float = 0.1,
    threshold: float = 0.1,
) -> MergeWeights:
    """Weights for averaging the replicas of one mega-batch (paper 004, Algorithm 2).

    Args:
        batch_sizes: ``b_k``, each rank's batch size during the mega-batch.
        updates: ``u_k``, the number of optimizer steps each rank took in it.
        replica_norms: each replica's L2 norm divided by its number of parameters;
            ``None`` disables the perturbation.
        delta: perturbation factor in ``[0, 1)``; ``0`` disables the perturbation.
        threshold: the perturbation applies only when every replica norm is below it.

    With equal update counts the weights are ``b_k / sum(b)``, otherwise
    ``u_k / sum(u)``. The batch basis is also used when no rank trained at all (all
    counts zero); if instead every batch size is zero while the counts are equal and
    positive, the (uniform) update shares are used.

    Perturbation, only when the counts differ and every replica norm is below
    ``threshold`` (small norms mean well-regularized replicas, so favouring one does
    little harm): the rank with the most updates gets ``(1 + delta) * alpha``, the one
    with the fewest ``(1 - delta) * alpha`` (ties go to the lowest rank). As in the
    paper the weights are not renormalized afterwards, so their sum is
    ``1 + delta * (alpha_max - alpha_min)`` rather than 1.

    >>> merge_weights([32, 64], [10, 10]).weights
    [0.3333333333333333, 0.6666666666666666]
    >>> merge_weights([32, 64], [10, 30]).weights
    [0.25, 0.75]
    """
    sizes = [int(b) for b in batch_sizes]
    counts = [int(u) for u in updates]
    if not sizes:
        raise ValueError("merge_weights needs at least one replica, got none.")
    if len(sizes) != len(counts):
        raise ValueError(
            f"Got {len(sizes)} batch sizes but {len(counts)} update counts: one of each per rank."
        )
    for rank, (b, u) in enumerate(zip(sizes, counts)):
        if b < 0:
            raise ValueError(f"Rank {rank}: negative batch size {b}.")
        if u < 0:
            raise ValueError(f"Rank {rank}: negative update count {u}.")
    _check_delta(delta)
    _check_threshold(threshold)
    norms: list[float] | None = None
    if replica_norms is not None:
        norms = [float(n) for n in replica_norms]
        if len(norms) != len(sizes):
            raise ValueError(f"Got {len(norms)} replica norms for {len(sizes)} ranks.")
        for rank, n in enumerate(norms):
            if not isfinite(n):
                raise ValueError(f"Rank {rank}: the replica norm is not finite ({n}).")
            if n < 0:
                raise ValueError(f"Rank {rank}: negative replica norm {n}.")
    total_b, total_u = sum(sizes), sum(counts)
    if total_b == 0 and total_u == 0:
        raise ValueError("All batch sizes and all update counts are zero: nothing to weight by.")

    equal = all(u == counts[0] for u in counts)
    if equal and total_b > 0:
        return MergeWeights([b / total_b for b in sizes], perturbed=False, basis="batch")
    weights = [u / total_u for u in counts]
    perturb = not equal and delta > 0 and norms is not None and all(n < threshold for n in norms)
    if perturb:
        # index() returns the first (lowest) rank on ties; max != min since counts differ.
        most, fewest = counts.index(max(counts)), counts.index(min(counts))
        weights[most] *= 1 + delta
        weights[fewest] *= 1 - delta
    return MergeWeights(weights, perturbed=perturb, basis="updates")


def check_merge_options(
    delta: float,
    gamma: float,
    threshold: float,
    megabatch_size: int | None,
    global_batch_size: int | None,
) -> None:
    """Validate the local-mode options at construction time; raise ``ValueError`` if bad.

    ``delta`` (perturbation) and ``gamma`` (momentum) must be in ``[0, 1)``,
    ``threshold`` positive, and ``megabatch_size`` (samples per mega-batch, ``None``
    for the default) an int of at least 1 and at least ``global_batch_size`` when that
    is known, so that every rank can take at least one batch per mega-batch.
    """
    _check_delta(delta)
    if not isfinite(gamma):
        raise ValueError(f"The momentum gamma must be finite, got {gamma}.")
    if gamma < 0:
        raise ValueError(f"The momentum gamma must be in [0, 1): negative gamma {gamma}.")
    if gamma >= 1:
        raise ValueError(
            f"The momentum gamma must be in [0, 1), got {gamma}: gamma >= 1 does not damp"
            " the past model moves."
        )
    _check_threshold(threshold)
    if megabatch_size is None:
        return
    if isinstance(megabatch_size, bool) or not isinstance(megabatch_size, Integral):
        raise ValueError(f"megabatch_size must be an int, got {megabatch_size!r}.")
    if megabatch_size < 1:
        raise ValueError(f"megabatch_size must be >= 1, got {megabatch_size}.")
    if global_batch_size is not None and megabatch_size < global_batch_size:
        raise ValueError(
            f"megabatch_size {megabatch_size} is smaller than the global batch size"
            f" {global_batch_size}: a mega-batch must hold at least one global batch."
        )


def momentum_merge(merged: T, current: T, previous: T, gamma: float) -> T:
    """Return ``merged + gamma * (current - previous)``: the new global model.

    ``merged`` is the weighted average of the replicas, ``current`` and ``previous``
    the global models after the last two merges (paper 004's ``w`` and ``w_p``). Works
    for anything with ``+``, ``-`` and scalar ``*`` (floats, tensors); ``gamma = 0``
    gives the plain average.

    >>> momentum_merge(1.0, 0.5, 0.25, 0.5)
    1.125
    """
    delta: Any = current - previous  # type: ignore[operator]
    return merged + gamma * delta  # type: ignore[operator,no-any-return]


def sample_weights(samples: Sequence[int], batch_sizes: Sequence[int]) -> MergeWeights:
    """Each replica's share ``n_k / sum_j n_j`` of the ``samples`` it trained since the last
    merge (``local_steps="proportional"``: a fast rank makes more updates of the same batch
    size, and its replica counts for the samples it saw; no perturbation).

    With no samples at all (every count zero) the shares of ``batch_sizes`` are used.

    >>> sample_weights([960, 320], [32, 32]).weights
    [0.75, 0.25]
    >>> sample_weights([0, 0], [16, 48]).weights
    [0.25, 0.75]
    """
    counts, sizes = [int(n) for n in samples], [int(b) for b in batch_sizes]
    if not counts or len(sizes) != len(counts):
        raise ValueError(
            f"Got {len(counts)} sample counts and {len(sizes)} batch sizes: one of each per rank."
        )
    if min(sizes) < 0 or min(counts) < 0:
        raise ValueError(f"Sample counts {counts} and batch sizes {sizes} must be >= 0.")
    total = sum(counts)
    if total == 0:
        if sum(sizes) == 0:
            raise ValueError("All sample counts and batch sizes are zero: nothing to weight by.")
        return MergeWeights([b / sum(sizes) for b in sizes], perturbed=False, basis="batch")
    return MergeWeights([n / total for n in counts], perturbed=False, basis="samples")


def claim_order(
    seconds_per_sample: Sequence[float], batch_sizes: Sequence[int], megabatch: int
) -> list[tuple[int, int]]:
    """``(rank, samples)`` of each claim on a pool of ``megabatch`` samples, in claim order.

    Every rank starts at the merge; each claims its batch (the last claim takes what is left)
    when its previous step ends, a step of ``b`` samples taking ``b * seconds_per_sample[k]``
    (ties to the lower rank), until the pool is used up. With even batch sizes each rank
    makes updates in proportion to its speed within the same wall time
    (``local_steps="proportional"``); with batch sizes in proportion to speed every rank
    makes the same number (``"equal"``, paper 004).

    >>> claim_order([1.0, 3.0], [2, 2], 8)
    [(0, 2), (1, 2), (0, 2), (0, 2)]
    """
    if len(seconds_per_sample) != len(batch_sizes) or not batch_sizes:
        raise ValueError("claim_order needs one time per sample and one batch size per rank.")
    if min(batch_sizes) < 1 or not all(isfinite(c) and c > 0 for c in seconds_per_sample):
        raise ValueError(
            f"Batch sizes {list(batch_sizes)} must be >= 1 and times per sample"
            f" {list(seconds_per_sample)} finite and > 0."
        )
    free = [0.0] * len(batch_sizes)  # when each rank's last step ends
    claims: list[tuple[int, int]] = []
    left = int(megabatch)
    while left > 0:
        rank = min(range(len(free)), key=lambda k: (free[k], k))
        size = min(int(batch_sizes[rank]), left)
        claims.append((rank, size))
        left -= size
        free[rank] += size * seconds_per_sample[rank]
    return claims


def check_local_options(local_steps: str, outer_lr: float | None, gamma: float) -> None:
    """Validate ``local_steps`` and ``outer_lr`` (with ``gamma``); raise ``ValueError`` if bad."""
    if local_steps not in LOCAL_STEPS:
        raise ValueError(f"`local_steps` must be one of {list(LOCAL_STEPS)}, got {local_steps!r}.")
    if outer_lr is None:
        return
    if isinstance(outer_lr, bool) or not isinstance(outer_lr, (int, float)):
        raise ValueError(f"`outer_lr` must be a number or None, got {outer_lr!r}.")
    if not (isfinite(outer_lr) and outer_lr > 0):
        raise ValueError(f"`outer_lr` must be finite and > 0 (None: plain merges), got {outer_lr}.")
    if gamma > 0:
        raise ValueError(
            f"`outer_lr` ({outer_lr}) and `gamma` ({gamma}) are both momentum on the merged"
            " model: set one of them (gamma=0 with the outer optimizer, or outer_lr=None)."
        )


def outer_step(
    anchor: T, merged: T, buffer: T | None, lr: float, momentum: float = OUTER_MOMENTUM
) -> tuple[T, T]:
    """DiLoCo's outer step: Nesterov momentum on the pseudo-gradient ``g = anchor - merged``.

    ``anchor`` is the global model after the last merge, ``merged`` the weighted average of
    the replicas now, ``buffer`` the momentum buffer (``None`` before the first merge). As
    ``torch.optim.SGD(nesterov=True)``: ``buffer' = momentum * buffer + g`` and the new
    global model is ``anchor - lr * (g + momentum * buffer')``. Returns ``(new, buffer')``.
    ``lr=1, momentum=0`` gives ``merged`` itself.

    >>> outer_step(1.0, 0.8, None, 0.5)
    (0.81, 0.19999999999999996)
    """
    grad: Any = anchor - merged  # type: ignore[operator]
    velocity: Any = grad if buffer is None else momentum * buffer + grad  # type: ignore[operator]
    return anchor - lr * (grad + momentum * velocity), velocity  # type: ignore[operator,return-value]
