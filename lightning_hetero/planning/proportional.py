"""Proportional control of per-rank batch sizes (papers 000 and 002)."""

import warnings
from collections.abc import Sequence
from itertools import repeat
from operator import gt, le, mul, sub, truediv
from statistics import fmean
from typing import Any

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats, check_inputs
from lightning_hetero.planning.split import (
    _clip,
    _fill_level,
    _round_shares,
    balance_efficiency,
    proportional_split,
)

__all__ = ["ProportionalController"]

_RENORMALIZATIONS = ("project", "omnilearn")


class LearnedMaximum:
    """The learned-maximum rule, shared by controllers that grow a rank's batch.

    If growing rank ``k``'s batch by more than ``deadband`` lowered its throughput by more
    than ``throughput_drop`` (both relative), its maximum becomes the previous size (paper
    000, "batch size bounds"), e.g. when memory runs short. Learned maxima that leave no
    room for the global batch are forgotten with a warning. The subclass sets
    ``deadband``, ``throughput_drop`` and ``learn_max_batch_size``.
    """

    deadband: float
    throughput_drop: float
    learn_max_batch_size: bool

    def _init_learned(self) -> None:
        self.learned_max: list[int | None] = []
        self.last_batch_sizes: list[int] = []
        self.last_throughput: list[float] = []

    def _upper_bounds(
        self, current: list[int], throughput: list[float], limits: BatchLimits
    ) -> list[int]:
        """Learn from this boundary's ``(b_k, X_k)``; return the per-rank upper bounds."""
        world_size = len(current)
        if len(self.learned_max) != world_size:
            self.learned_max = [None] * world_size
        last = self.last_batch_sizes
        if self.learn_max_batch_size and len(last) == world_size and current != last:
            grow, keep = 1.0 + self.deadband, 1.0 - self.throughput_drop
            grew = [k for k, b, old in zip(range(world_size), current, last) if b > grow * old]
            for k in grew:
                if throughput[k] < keep * self.last_throughput[k]:  # and dropped
                    self.learned_max[k] = last[k]
        self.last_batch_sizes, self.last_throughput = current, throughput
        if self.learned_max.count(None) == world_size:
            return list(limits.max_batch_size)
        upper = [
            hi if cap is None else max(lo, min(hi, cap))
            for hi, lo, cap in zip(limits.max_batch_size, limits.min_batch_size, self.learned_max)
        ]
        if sum(upper) < limits.global_batch_size:
            warnings.warn(
                f"The learned maximum batch sizes {self.learned_max} leave no room for the global"
                f" batch {limits.global_batch_size}; forgetting them.",
                stacklevel=3,
            )
            self.learned_max = [None] * world_size
            upper = list(limits.max_batch_size)
        return upper

    def _learned_state(self) -> dict[str, Any]:
        return {
            "learned_max": list(self.learned_max),
            "last_batch_sizes": list(self.last_batch_sizes),
            "last_throughput": list(self.last_throughput),
        }

    def _load_learned_state(self, state: dict[str, Any]) -> None:
        self.learned_max = list(state.get("learned_max", []))
        self.last_batch_sizes = list(state.get("last_batch_sizes", []))
        self.last_throughput = list(state.get("last_throughput", []))


class ProportionalController(LearnedMaximum, Controller):
    """Give each rank a batch proportional to its measured throughput.

    With ``X_k = b_k / t_k`` from the smoothed compute times, the controller of
    paper 000 (Eqs. 4-5) moves every rank to ``b_k' = b_k * t_mean / t_k``, which is
    ``X_k`` up to a common factor; fixing the global batch (paper 002, Eq. 8) makes
    it the proportional split ``b_k' = B * X_k / sum_j X_j``. Here that split is
    computed exactly, rounded to integers that keep ``B``, and projected onto the
    per-rank bounds (surplus goes to ranks with room).

    Three safeguards from the papers keep it calm:

    * **dead-band**: the plan changes only when some rank's target differs from its
      current batch by more than ``deadband * b_k`` (paper 000 section III-C) *and* the
      measured balance efficiency ``E`` is below ``1 - deadband``, i.e. the step time
      would improve by more than the dead-band. The second condition keeps a balanced
      plan still when timing noise and integer rounding move a small batch by one
      sample (that alone can exceed 5% of it);
    * **smoothing**: timings arrive already averaged since the last change
      (:class:`~lightning_hetero.planning.TimingSmoother`);
    * **learned maximums**: if growing a rank's batch by more than the dead-band lowered
      its throughput by more than ``throughput_drop`` (relative), its maximum becomes the
      previous size (paper 000, "batch size bounds"), e.g. when memory runs short. Both
      thresholds keep noise from triggering it: a rank grows *because* its last timing
      looked fast, so a small drop afterwards is expected even on a linear worker.

    **Renormalisation.** ``renormalization="project"`` (the default) is the exact
    bounded proportional split above. ``"omnilearn"`` reproduces paper 002 step by
    step: Eq. 6 moves each rank to ``b_k * t_mean / t_k``; those targets sum to
    ``B + dB``, and Eq. 8 subtracts the same ``dB / K`` from every rank. A rank pushed
    past a bound is clamped to it and the amount clamped is shared equally by the
    others (the same equal shift, repeated until no bound is crossed); the result is
    rounded by largest fractional part, keeping ``B``. The equal shift is not a
    proportional one: from an unbalanced plan it over- and under-corrects in turn (on
    the HL8 scenario for about a dozen boundaries, until the dead-band holds the plan
    within 5% of balance), where ``"project"`` lands in one. The fixed point, the
    dead-band and the learned maximums are the same with either.

    Args:
        deadband: relative change below which the plan is kept, in ``[0, 1)``.
        throughput_drop: relative throughput loss that counts as a drop, in ``[0, 1)``;
            keep it well above the smoothed timing noise.
        learn_max_batch_size: apply the learned-maximum rule.
        renormalization: how targets are brought back to the global batch: ``"project"``
            (proportional split within the bounds) or ``"omnilearn"`` (paper 002, Eq. 8).

    Example:
        >>> from lightning_hetero.planning import BatchLimits
        >>> ctl = ProportionalController(deadband=0.05)
        >>> ctl.update([64, 64, 64, 64], [4.0, 4.0, 6.0, 1.5], BatchLimits.build(4, 256))
        [48, 48, 32, 128]
        >>> paper = ProportionalController(renormalization="omnilearn")
        >>> paper.update([64, 64, 64, 64], [4.0, 4.0, 6.0, 1.5], BatchLimits.build(4, 256))
        [43, 43, 23, 147]
    """

    name = "proportional"
    replicable = True

    def __init__(
        self,
        deadband: float = 0.05,
        throughput_drop: float = 0.1,
        learn_max_batch_size: bool = True,
        renormalization: str = "project",
    ) -> None:
        if renormalization not in _RENORMALIZATIONS:
            raise ValueError(
                f"`renormalization` must be one of {_RENORMALIZATIONS}, got {renormalization!r}."
            )
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"`deadband` must be in [0, 1), got {deadband}.")
        if not 0.0 <= throughput_drop < 1.0:
            raise ValueError(f"`throughput_drop` must be in [0, 1), got {throughput_drop}.")
        self.deadband = deadband
        self.throughput_drop = throughput_drop
        self.learn_max_batch_size = learn_max_batch_size
        self.renormalization = renormalization
        self._init_learned()

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        current, compute_s, _ = check_inputs(batch_sizes, compute_s, limits, stats)
        throughput = list(map(truediv, current, compute_s))
        upper = self._upper_bounds(current, throughput, limits)

        if self.renormalization == "omnilearn":
            target = _omnilearn_split(
                current, compute_s, limits.global_batch_size, limits.min_batch_size, upper
            )
        else:
            target = proportional_split(
                throughput, limits.global_batch_size, limits.min_batch_size, upper
            )
        out_of_bounds = not (
            all(map(le, limits.min_batch_size, current)) and all(map(le, current, upper))
        )
        # some rank moves by more than the dead-band: |new - old| > deadband * old
        moves = map(
            gt, map(abs, map(sub, target, current)), map(mul, repeat(self.deadband), current)
        )
        significant = balance_efficiency(current, compute_s) < 1.0 - self.deadband and any(moves)
        return target if significant or out_of_bounds else current

    def state_dict(self) -> dict[str, Any]:
        return self._learned_state()

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_learned_state(state)


def _omnilearn_split(
    batch_sizes: Sequence[int],
    compute_s: Sequence[float],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
) -> list[int]:
    """Paper 002's target: Eq. 6 per rank, then Eq. 8's equal shift back to ``total``."""
    shares = _omnilearn_shares(batch_sizes, compute_s, total, lower, upper)
    # The shares sum to the total within the bounds, so they are their own proportional
    # split: only the rounding remains (the split of them would rescale by 1 +- rounding).
    return _round_shares(shares, total, lower, upper)


def _omnilearn_shares(
    batch_sizes: Sequence[int],
    compute_s: Sequence[float],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
) -> list[float]:
    """The real-valued target of :func:`_omnilearn_split`, summing to ``total``."""
    mean_s = fmean(compute_s)
    # Eq. 6: b - T_k * (t_k - t_mean) with T_k = b / t_k, i.e. b * t_mean / t_k.
    moved = list(map(truediv, map(mul, batch_sizes, repeat(mean_s)), compute_s))

    def shifted(shift: float) -> list[float]:
        return _clip(map(sub, moved, repeat(shift)), lower, upper)

    # Eq. 8: subtract dB / K from every rank. Where that crosses a bound, find the common
    # shift that makes the clamped plan sum to the total (the sum falls as the shift grows):
    # water-filling with unit weights, the level being minus the shift.
    shares = shifted((sum(moved) - total) / len(moved))
    if abs(sum(shares) - total) > 1e-9 * total:
        level = _fill_level([1.0] * len(moved), total, lower, upper, offsets=moved)
        shares = [float(lo) for lo in lower] if level is None else shifted(-level)
    return shares
