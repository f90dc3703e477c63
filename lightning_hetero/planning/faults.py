"""Planning after faults: re-planning for a changed world size, ranks to consider removing.

Pure functions: numbers and names in, weights and rank lists out.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass
from statistics import fmean

__all__ = ["RankIdentity", "RestoredWeights", "held_at_minimum", "weights_for_new_world"]


@dataclass(frozen=True)
class RankIdentity:
    """Where a rank runs: its host name and its rank on that host."""

    host: str
    local_rank: int


@dataclass
class RestoredWeights:
    """Per-rank split weights for a new world, and how each rank got its weight.

    ``matched`` maps each new rank that ran before to its rank in the saved run;
    ``fallback`` lists the new ranks without a saved measurement. ``uniform`` is true when
    no rank could be matched and every weight is 1.
    """

    weights: list[float]
    matched: dict[int, int]
    fallback: list[int]
    uniform: bool


def weights_for_new_world(
    saved: Sequence[RankIdentity],
    saved_samples_per_s: Sequence[float],
    current: Sequence[RankIdentity],
) -> RestoredWeights:
    """Split weights for the ranks of ``current`` from the throughputs a saved run measured.

    A new rank is matched with the saved rank on the same host with the same local rank,
    and weighs that rank's throughput (samples/s). Unmatched ranks, and matched ranks
    whose saved throughput is not a positive number, weigh the mean of the usable matched
    throughputs; without any, every rank weighs 1 (a uniform split).

    Example:
        >>> a0, a1, b0 = RankIdentity("a", 0), RankIdentity("a", 1), RankIdentity("b", 0)
        >>> weights_for_new_world([a0, a1, b0], [100.0, 300.0, 50.0], [a1, a0, RankIdentity("c", 0)])
        RestoredWeights(weights=[300.0, 100.0, 200.0], matched={0: 1, 1: 0}, fallback=[2], uniform=False)
    """  # noqa: E501
    if len(saved) != len(saved_samples_per_s):
        raise ValueError(
            f"{len(saved)} saved ranks but {len(saved_samples_per_s)} saved throughputs;"
            " expected one throughput per saved rank."
        )
    by_identity = {identity: rank for rank, identity in enumerate(saved)}
    matched: dict[int, int] = {}
    speeds: dict[int, float] = {}
    for rank, identity in enumerate(current):
        old = by_identity.get(identity)
        if old is None:
            continue
        matched[rank] = old
        speed = float(saved_samples_per_s[old])
        if math.isfinite(speed) and speed > 0:
            speeds[rank] = speed
    fallback = [rank for rank in range(len(current)) if rank not in speeds]
    if not speeds:
        return RestoredWeights([1.0] * len(current), matched, fallback, uniform=True)
    mean = fmean(speeds.values())
    weights = [speeds.get(rank, mean) for rank in range(len(current))]
    return RestoredWeights(weights, matched, fallback, uniform=False)


def held_at_minimum(
    batch_sizes: Sequence[int],
    samples_per_s: Sequence[float],
    min_batch_size: Sequence[int],
    margin: float = 0.25,
) -> list[int]:
    """Ranks whose batch sits at their minimum although their speed asks for clearly less.

    A rank's speed-proportional share of ``B = sum(batch_sizes)`` is
    ``B * X_k / sum_j X_j``; a rank at its minimum with a smaller share slows every step,
    however the others are planned. Paper 001 argues such a worker is better removed.
    Only a share more than ``margin`` below the minimum counts: timing noise puts equal
    ranks a little above or below their share. Nothing is reported unless every throughput
    is a finite positive number.

    Example:
        >>> held_at_minimum([56, 56, 16], [140.0, 140.0, 4.0], [16, 16, 16])
        [2]
    """
    if not len(batch_sizes) == len(samples_per_s) == len(min_batch_size):
        raise ValueError(
            f"Expected one entry per rank in each argument, got {len(batch_sizes)} batch sizes,"
            f" {len(samples_per_s)} throughputs and {len(min_batch_size)} minimums."
        )
    if not all(math.isfinite(x) and x > 0 for x in samples_per_s):
        return []
    total, speed = sum(batch_sizes), sum(samples_per_s)
    return [
        rank
        for rank, (b, x, lo) in enumerate(zip(batch_sizes, samples_per_s, min_batch_size))
        if b <= lo and total * x / speed < lo * (1.0 - margin)
    ]
