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
"""

from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite
from numbers import Integral
from typing import Any, Literal, TypeVar

__all__ = ["MergeWeights", "check_merge_options", "merge_weights", "momentum_merge"]

T = TypeVar("T")


@dataclass(frozen=True)
class MergeWeights:
    """The result of [`merge_weights`][lightning_hetero.planning.merge.merge_weights].

    ``weights[k]`` multiplies replica ``k``; ``perturbed`` says whether the
    most/least-updated adjustment was applied (then the weights may not sum to 1);
    ``basis`` is ``"batch"`` (shares of the batch sizes) or ``"updates"`` (shares of
    the update counts).
    """

    weights: list[float]
    perturbed: bool
    basis: Literal["batch", "updates"]


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
