"""Proportional control of per-rank batch sizes (papers 000 and 002)."""

import math
import warnings
from collections.abc import Sequence
from itertools import repeat
from operator import gt, le, mul, sub, truediv
from statistics import fmean, median
from typing import Any

from lightning_hetero.planning.base import (
    AUTO_DEADBAND_FALLBACK,
    BatchLimits,
    Controller,
    Deadband,
    RankStats,
    check_deadband,
    check_inputs,
    noise_deadband,
)
from lightning_hetero.planning.guard import damped_plan
from lightning_hetero.planning.split import (
    _clip,
    _fill_level,
    _round_shares,
    balance_efficiency,
    is_count,
    proportional_split,
)

__all__ = ["ProportionalController"]

_RENORMALIZATIONS = ("project", "omnilearn")
#: How much a rank's batch must shrink before the floor rule reads its step time.
_FLOOR_SHRINK = 0.1
#: Throughput readings kept per rank and batch size, and batch sizes kept per rank.
_READINGS_PER_SIZE = 8
_SIZES_KEPT = 16
#: Standard errors of the speed ratio at which a boundary confirms the probe before it.
_CONFIRM_Z = 1.0
#: How much a rank's batch must differ between two boundaries (relative to the larger size)
#: before their step times give its fixed per-step cost, and in how many standard errors
#: that cost must be positive to count.
_FIT_SPREAD = 0.25
_FIT_Z = 2.0


def _count_down(bounds: list[int | None], expires: list[int | None], relearn_after: int) -> None:
    """Count this boundary against every learned bound (in place): ``expires[k]`` is how many
    boundaries, this one included, ``bounds[k]`` still holds; one without a count (a state
    saved before counts existed) gets ``relearn_after``; one whose time is up is lifted."""
    for k, (bound, left) in enumerate(zip(bounds, expires)):
        if bound is None:
            expires[k] = None
        elif left is None or left > 1:
            expires[k] = relearn_after if left is None else left - 1
        else:
            bounds[k] = expires[k] = None


def _growth_band(deadband: Deadband) -> float:
    """How much a batch must grow before the learned-maximum rule reads its throughput:
    the dead-band, or for ``"auto"`` (noise decides the plan's moves) a fixed 5%."""
    return AUTO_DEADBAND_FALLBACK if deadband == "auto" else deadband


class LearnedMaximum:
    """The learned-maximum rule, shared by controllers that grow a rank's batch.

    If growing rank ``k``'s batch by more than ``deadband`` lowered its throughput by more
    than ``throughput_drop`` (both relative), its previous size becomes a *candidate*
    maximum (paper 000, "batch size bounds"), e.g. when memory runs short. One such
    observation may be contention or noise, so the candidate binds only when a later
    boundary confirms it: the rank runs above the candidate size again and its throughput
    is still below ``1 - throughput_drop`` times the one it had at that size. If it runs
    above the size at that throughput instead, the candidate is dropped. The plan moves
    freely meanwhile; while the rank stays at or below the size, the candidate waits (for
    at most ``relearn_after`` boundaries). A maximum that binds is announced with a warning
    naming the rank and the size, and holds for ``relearn_after`` boundaries; then it is
    lifted, the rank may grow again, and binding again takes a new confirmation. Learned
    maxima that leave no room for the global batch are forgotten with a warning. The
    subclass sets ``deadband``, ``throughput_drop`` and ``learn_max_batch_size``, and calls
    ``_init_learned``.

    Attributes:
        learned_max: per rank, the maximum that binds, or ``None``.
        learned_expires_in: per rank, the boundaries (this one included) for which the
            rank's learned maximum still holds, or ``None``.
        max_candidates: per rank, the candidate maximum waiting for confirmation, or
            ``None``: ``size``, ``throughput`` (samples/s at ``size``), ``grown_to`` and
            ``dropped_to`` (the size and throughput that made it) and ``waited``
            (boundaries it has waited).
    """

    deadband: Deadband
    throughput_drop: float
    learn_max_batch_size: bool

    def _init_learned(self, relearn_after: int = 10) -> None:
        if not is_count(relearn_after):
            raise ValueError(f"`relearn_after` must be an integer >= 1, got {relearn_after!r}.")
        self.relearn_after = relearn_after
        #: Each rank's relative throughput noise at this boundary and the last one.
        self._noise: list[float] = []
        self._last_noise: list[float] = []
        self.learned_max: list[int | None] = []
        self.learned_expires_in: list[int | None] = []
        self.max_candidates: list[dict[str, Any] | None] = []
        self.last_batch_sizes: list[int] = []
        self.last_throughput: list[float] = []
        #: Per rank, ``{size: recent throughputs}``: a cap is judged against the median of
        #: the readings at its size, not one reading that may be an outlier.
        self.size_readings: list[dict[int, list[float]]] = []

    def _reference(self, rank: int, size: int, reading: float) -> float:
        """The throughput of ``rank`` at ``size``: the median of its recent readings there
        (``reading`` when there are none)."""
        held = self.size_readings[rank].get(size) if rank < len(self.size_readings) else None
        return median(held) if held else reading

    def _record(self, current: list[int], throughput: list[float]) -> None:
        if len(self.size_readings) != len(current):
            self.size_readings = [{} for _ in current]
        for readings, size, x in zip(self.size_readings, current, throughput):
            held = readings.pop(size, [])  # re-inserted last: the oldest size goes first
            readings[size] = [*held, x][-_READINGS_PER_SIZE:]
            while len(readings) > _SIZES_KEPT:
                del readings[next(iter(readings))]

    def _upper_bounds(
        self,
        current: list[int],
        throughput: list[float],
        limits: BatchLimits,
        noise: Sequence[float] | None = None,
    ) -> list[int]:
        """Learn from this boundary's ``(b_k, X_k)``; return the per-rank upper bounds.

        ``noise``: each rank's relative standard error of ``X_k``; a drop must then also
        exceed twice the noise of the difference (a few stalls are no memory limit)."""
        self._noise = list(noise) if noise is not None else [0.0] * len(current)
        world_size = len(current)
        if len(self.learned_max) != world_size:
            self.learned_max = [None] * world_size
        if len(self.learned_expires_in) != world_size:
            self.learned_expires_in = [None] * world_size
        if len(self.max_candidates) != world_size:
            self.max_candidates = [None] * world_size
        self._expire_learned()
        last = self.last_batch_sizes
        if self.learn_max_batch_size and len(last) == world_size:
            resolved = self._confirm_candidates(current, throughput)
            if current != last:
                grow, keep = 1.0 + _growth_band(self.deadband), 1.0 - self.throughput_drop
                candidates, last_throughput = self.max_candidates, self.last_throughput
                for k, (b, old) in enumerate(zip(current, last)):
                    if (
                        b > grow * old  # grew
                        # and dropped, against the readings at the old size (not an outlier)
                        and throughput[k] < keep * self._reference(k, old, last_throughput[k])
                        and self._beyond_noise(k, throughput[k], last_throughput[k])
                        and candidates[k] is None
                        and k not in resolved
                    ):
                        candidates[k] = {
                            "size": old,
                            "throughput": self._reference(k, old, last_throughput[k]),
                            "grown_to": b,
                            "dropped_to": throughput[k],
                            "waited": 0,
                        }
        self.last_batch_sizes, self.last_throughput = current, throughput
        self._last_noise = self._noise
        self._record(current, throughput)
        if self.learned_max.count(None) == world_size:
            return list(limits.max_batch_size)
        upper = [
            hi if cap is None else max(lo, min(hi, cap))
            for hi, lo, cap in zip(limits.max_batch_size, limits.min_batch_size, self.learned_max)
        ]
        if sum(upper) < limits.global_batch_size:
            warnings.warn(
                f"hetero: The learned maximum batch sizes {self.learned_max} leave no room for"
                f" the global batch {limits.global_batch_size}; forgetting them.",
                stacklevel=3,
            )
            self.learned_max = [None] * world_size
            self.learned_expires_in = [None] * world_size
            upper = list(limits.max_batch_size)
        return upper

    def _beyond_noise(self, rank: int, now: float, before: float) -> bool:
        """``now`` is below ``before`` by more than twice the noise of the difference (the
        rank's relative noise now, and at the last boundary for ``before``)."""
        noise, last = self._noise, self._last_noise
        now_se = noise[rank] if rank < len(noise) and math.isfinite(noise[rank]) else 0.0
        was_se = last[rank] if rank < len(last) and math.isfinite(last[rank]) else now_se
        return (before - now) / before > 2.0 * math.hypot(now_se, was_se)

    def plan_imposed(self, plan: Sequence[int]) -> None:
        """Lift every learned maximum (and candidate) below ``plan``'s size for its rank: a
        measured step time, the guard's evidence for ``plan``, outweighs a throughput
        reading."""
        for k, size in enumerate(plan):
            if k < len(self.learned_max) and (self.learned_max[k] or size) < size:
                self.learned_max[k] = self.learned_expires_in[k] = None
            candidate = self.max_candidates[k] if k < len(self.max_candidates) else None
            if candidate is not None and candidate["size"] < size:
                self.max_candidates[k] = None

    def _expire_learned(self) -> None:
        """Count this boundary against every learned maximum; lift those whose time is up."""
        _count_down(self.learned_max, self.learned_expires_in, self.relearn_after)

    def _confirm_candidates(self, current: list[int], throughput: list[float]) -> set[int]:
        """Bind or drop the candidates this boundary decides; return their ranks."""
        resolved = set()
        keep = 1.0 - self.throughput_drop
        for k, candidate in enumerate(self.max_candidates):
            if candidate is None:
                continue
            size = candidate["size"]
            if current[k] <= size:  # no news about sizes above it: wait
                candidate["waited"] += 1
                if candidate["waited"] >= self.relearn_after:
                    self.max_candidates[k] = None
                    resolved.add(k)
                continue
            self.max_candidates[k] = None
            resolved.add(k)
            reference = min(candidate["throughput"], self._reference(k, size, math.inf))
            if throughput[k] < keep * reference and self._beyond_noise(k, throughput[k], reference):
                # still slow: confirmed
                self.learned_max[k] = size
                self.learned_expires_in[k] = self.relearn_after
                warnings.warn(
                    f"hetero: Rank {k}'s batch size is capped at {size}: its throughput fell from"
                    f" {candidate['throughput']:.1f} samples/s at batch size {size} to"
                    f" {candidate['dropped_to']:.1f} at {candidate['grown_to']}, and was"
                    f" {throughput[k]:.1f} at {current[k]} at a later boundary. The cap is"
                    f" lifted and re-tested after {self.relearn_after} boundaries"
                    " (`relearn_after`).",
                    stacklevel=4,
                )
        return resolved

    def _learned_state(self) -> dict[str, Any]:
        return {
            "learned_max": list(self.learned_max),
            "learned_expires_in": list(self.learned_expires_in),
            "max_candidates": [None if c is None else dict(c) for c in self.max_candidates],
            "last_batch_sizes": list(self.last_batch_sizes),
            "last_throughput": list(self.last_throughput),
            "size_readings": [[[s, list(x)] for s, x in r.items()] for r in self.size_readings],
        }

    def _load_learned_state(self, state: dict[str, Any]) -> None:
        # States saved before candidates and expiry existed have neither: their maxima get
        # a full ``relearn_after`` from now, and nothing is pending.
        self.learned_max = list(state.get("learned_max", []))
        world_size = len(self.learned_max)
        expires = state.get("learned_expires_in")
        if expires is None or len(expires) != world_size:
            expires = [None if cap is None else self.relearn_after for cap in self.learned_max]
        self.learned_expires_in = list(expires)
        candidates = state.get("max_candidates")
        if candidates is None or len(candidates) != world_size:
            candidates = [None] * world_size
        self.max_candidates = [None if c is None else dict(c) for c in candidates]
        self.last_batch_sizes = list(state.get("last_batch_sizes", []))
        self.last_throughput = list(state.get("last_throughput", []))
        saved = state.get("size_readings", [])  # none in states saved before they existed
        self.size_readings = [{int(s): list(x) for s, x in r} for r in saved]


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
    * **smoothing**: timings arrive as medians of every step since the last change
      ([`TimingSmoother`][lightning_hetero.planning.TimingSmoother]);
    * **learned maximums**: if growing a rank's batch by more than the dead-band lowered
      its throughput by more than ``throughput_drop`` (relative), its previous size is a
      candidate maximum (paper 000, "batch size bounds"), e.g. when memory runs short.
      Both thresholds keep noise from triggering it: a rank grows *because* its last
      timing looked fast, so a small drop afterwards is expected even on a linear worker.
      A candidate binds only if a later boundary confirms it (the rank runs above that
      size again, still slower than ``1 - throughput_drop`` times its throughput there),
      with a warning naming the rank and the size; one slow boundary (contention, noise)
      binds nothing. A maximum holds for ``relearn_after`` boundaries, then the rank may
      grow again and the maximum must be confirmed anew (see ``LearnedMaximum``);
    * **learned floors**: a rank whose batch shrank by more than 10% while its step time
      fell by less than a third of that may have a per-step floor (a device that takes as
      long for 9 samples as for 64, a fixed cost, a share of a busy GPU): taking samples off
      it saves nothing, and proportional control, which reads it as slow per sample, would
      go on emptying it onto the others. Contention that arrives as the batch shrinks looks
      the same once, so the size before the shrink is a candidate; it becomes the rank's
      minimum, with a warning naming the rank, only if a later boundary finds the rank still
      at least 10% below that size and still not faster by a third of the difference (the
      candidate is dropped otherwise, or after ``relearn_after`` boundaries). A minimum
      holds for ``relearn_after`` boundaries.

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
        relearn_after: boundaries a learned maximum or floor holds before it is lifted and
            re-tested (and the most a candidate maximum waits for confirmation), an integer
            ``>= 1``.
        learn_floor: apply the learned-floor rule.
        jump_z: standard errors of evidence at which a move is made in full; below it the
            plan probes (see ``_sized_by_evidence``).
        probe_step: the fraction of each rank's batch a probe moves, in ``(0, 1]``.
        fixed_costs: fit a fixed per-step cost to a rank whose batch shrank by a quarter or
            more since the last boundary (from the two boundaries' times, when it is beyond
            their noise) and aim at equal step times on those lines. Without it a slow rank
            whose steps pay a fixed cost is moved only part of the way at each boundary
            (it looks faster per sample as its batch shrinks) and rounding can hold it a
            sample or two above its best batch. The fixed point is the same either way.

    Attributes:
        learned_min: per rank, the minimum a learned floor sets, or ``None``.
        floor_expires_in: per rank, the boundaries (this one included) for which the learned
            floor still holds, or ``None``.
        floor_candidates: per rank, ``None`` or the floor waiting for confirmation:
            ``size`` and ``time_s`` (the size before the shrink and its step time) and
            ``waited`` (boundaries it has waited).
        fixed_s: per rank, the fixed per-step cost (seconds) the last update planned with
            (0: none fitted).

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
    auto_deadband = True

    def __init__(
        self,
        deadband: Deadband = 0.05,
        throughput_drop: float = 0.1,
        learn_max_batch_size: bool = True,
        renormalization: str = "project",
        relearn_after: int = 10,
        learn_floor: bool = False,
        jump_z: float = 10.0,
        probe_step: float = 0.1,
        fixed_costs: bool = True,
    ) -> None:
        if not jump_z >= 0.0:
            raise ValueError(f"`jump_z` must be >= 0, got {jump_z}.")
        if not 0.0 < probe_step <= 1.0:
            raise ValueError(f"`probe_step` must be in (0, 1], got {probe_step}.")
        if renormalization not in _RENORMALIZATIONS:
            raise ValueError(
                f"`renormalization` must be one of {_RENORMALIZATIONS}, got {renormalization!r}."
            )
        check_deadband(deadband)
        if not 0.0 <= throughput_drop < 1.0:
            raise ValueError(f"`throughput_drop` must be in [0, 1), got {throughput_drop}.")
        self.deadband = deadband
        self.throughput_drop = throughput_drop
        self.learn_max_batch_size = learn_max_batch_size
        self.renormalization = renormalization
        self.learn_floor = learn_floor
        self.jump_z, self.probe_step = float(jump_z), float(probe_step)
        self.fixed_costs = fixed_costs
        #: Per rank, the fixed per-step cost (s) the last two boundaries measured (0: none).
        self.fixed_s: list[float] = []
        #: The direction (per rank: -1, 0, 1) of the last unconfirmed move, if any.
        self.probing: list[int] | None = None
        #: Per-sample times and their relative variances measured before that move.
        self._probe_evidence: tuple[list[float], list[float]] | None = None
        self._init_learned(relearn_after)
        self.learned_min: list[int | None] = []
        self.floor_expires_in: list[int | None] = []
        self.floor_candidates: list[dict[str, Any] | None] = []

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        current, compute_s, readings = check_inputs(batch_sizes, compute_s, limits, stats)
        throughput = list(map(truediv, current, compute_s))
        before = (self.last_batch_sizes, self.last_throughput)
        noise = [r.compute_se / t for r, t in zip(readings, compute_s)]
        last_noise = self._noise  # the last boundary's, until `_upper_bounds` records these
        upper = self._upper_bounds(current, throughput, limits, noise)
        lower = self._lower_bounds(current, compute_s, before, limits, upper)

        held, self.fixed_s = self.fixed_s, [0.0] * len(current)
        if self.renormalization == "omnilearn":
            target = _omnilearn_split(current, compute_s, limits.global_batch_size, lower, upper)
        else:
            if self.fixed_costs:
                fitted = _fixed_costs(current, compute_s, noise, before, last_noise)
                self.fixed_s = _carried(fitted, held, current, compute_s, before[0])
            target = _affine_split(
                current, compute_s, self.fixed_s, limits.global_batch_size, lower, upper
            )
        out_of_bounds = not (all(map(le, lower, current)) and all(map(le, current, upper)))
        band = noise_deadband(self.deadband, compute_s, readings)
        # some rank moves by more than the dead-band: |new - old| > band * old
        moves = map(gt, map(abs, map(sub, target, current)), map(mul, repeat(band), current))
        significant = balance_efficiency(current, compute_s) < 1.0 - band and any(moves)
        if out_of_bounds:
            self.probing = self._probe_evidence = None
            return target
        # a probe is confirmed by a boundary that asks the same way beyond its noise, though
        # the dead-band (the gain in step time) would not act on it alone
        confirming = _agrees(self.probing, current, target) and (
            _evidence_z(current, target, compute_s, readings) >= _CONFIRM_Z
        )
        if not (significant or confirming):  # a probe waits for a boundary that asks again
            return current
        return self._sized_by_evidence(current, target, compute_s, readings, lower, upper, limits)

    def _sized_by_evidence(
        self,
        current: list[int],
        target: list[int],
        compute_s: list[float],
        readings: list[RankStats],
        lower: list[int],
        upper: list[int],
        limits: BatchLimits,
    ) -> list[int]:
        """``target``, or a probe toward it when the evidence is thin.

        The evidence is the log ratio of the compute times of the rank that loses most and the
        rank that gains most, in standard errors of that ratio (their ``compute_se``). At
        ``jump_z`` or more the move is made in full. Else the plan moves ``probe_step`` of
        each rank's batch toward the target (at least a sample), so that a boundary whose
        timings a few stalls distorted moves the plan little; when the next boundary, measured
        at the probe, asks the same way, the two boundaries' per-sample times are pooled
        (weighted by their precision) and the plan moves to their split.
        """
        direction = _direction(current, target)
        per_sample = [t / b for t, b in zip(compute_s, current)]
        variance = [(r.compute_se / t) ** 2 for r, t in zip(readings, compute_s)]
        before, self.probing = self.probing, None
        evidence = self._probe_evidence
        self._probe_evidence = None
        if _evidence_z(current, target, compute_s, readings) >= self.jump_z:
            return target
        if _agrees(before, current, target) and evidence is not None:
            speeds = _pooled_speeds(evidence, (per_sample, variance))
            pooled_s = [b / x for b, x in zip(current, speeds)]
            return _affine_split(
                current, pooled_s, self.fixed_s, limits.global_batch_size, lower, upper
            )
        self.probing = direction
        self._probe_evidence = (per_sample, variance)
        reach = max(abs(t - b) / b for t, b in zip(target, current) if b > 0)
        fraction = min(1.0, self.probe_step / reach) if reach > 0 else 1.0
        probe = damped_plan(current, target, fraction)
        while fraction > 1e-3 and any(
            abs(p - b) > max(1.0, self.probe_step * b) for p, b in zip(probe, current)
        ):  # rounding went past the probe: a smaller one
            fraction *= 0.8
            probe = damped_plan(current, target, fraction)
        if probe == current:  # below one sample: one sample from the most to the least sped-up
            gain = max(range(len(current)), key=lambda k: (target[k] - current[k]) / current[k])
            lose = min(range(len(current)), key=lambda k: (target[k] - current[k]) / current[k])
            probe[gain] += 1
            probe[lose] -= 1
        return probe

    def _lower_bounds(
        self,
        current: list[int],
        compute_s: list[float],
        before: tuple[list[int], list[float]],
        limits: BatchLimits,
        upper: list[int],
    ) -> list[int]:
        """Learn floors from ``before`` (the last boundary's sizes and throughputs) and this
        boundary; return the per-rank lower bounds."""
        world_size = len(current)
        if len(self.learned_min) != world_size:
            self.learned_min = [None] * world_size
            self.floor_expires_in = [None] * world_size
        if len(self.floor_candidates) != world_size:
            self.floor_candidates = [None] * world_size
        _count_down(self.learned_min, self.floor_expires_in, self.relearn_after)
        if self.learn_floor:
            self._confirm_floors(current, compute_s)
            last, last_throughput = before
            if len(last) == world_size and current != last:
                for k, (b, old) in enumerate(zip(current, last)):
                    candidate = {"size": old, "time_s": old / last_throughput[k], "waited": 0}
                    if (
                        self.learned_min[k] is None
                        and self.floor_candidates[k] is None
                        and _at_floor(b, compute_s[k], candidate)
                    ):
                        self.floor_candidates[k] = candidate
        lower = [
            lo if floor is None else max(lo, min(floor, hi))
            for lo, floor, hi in zip(limits.min_batch_size, self.learned_min, upper)
        ]
        if sum(lower) > limits.global_batch_size:
            self.learned_min = [None] * world_size
            self.floor_expires_in = [None] * world_size
            return list(limits.min_batch_size)
        return lower

    def _confirm_floors(self, current: list[int], compute_s: list[float]) -> None:
        """Bind the floor candidates this boundary confirms; drop those it refutes."""
        for k, candidate in enumerate(self.floor_candidates):
            if candidate is None:
                continue
            size = candidate["size"]
            if current[k] <= (1.0 - _FLOOR_SHRINK) * size:  # still well below: news
                self.floor_candidates[k] = None
                if _at_floor(current[k], compute_s[k], candidate):
                    self.learned_min[k], self.floor_expires_in[k] = size, self.relearn_after
                    warnings.warn(
                        f"hetero: Rank {k}'s step time hardly falls with its batch:"
                        f" {candidate['time_s']:.4g} s at {size} samples, {compute_s[k]:.4g} s"
                        f" at {current[k]}. A per-step floor, which fewer samples do not lower:"
                        f" keeping at least {size}"
                        f" samples on it for {self.relearn_after} boundaries (`relearn_after`).",
                        stacklevel=4,
                    )
                continue
            candidate["waited"] += 1
            if candidate["waited"] >= self.relearn_after:
                self.floor_candidates[k] = None

    def state_dict(self) -> dict[str, Any]:
        return {
            **self._learned_state(),
            "learned_min": list(self.learned_min),
            "floor_expires_in": list(self.floor_expires_in),
            "floor_candidates": [None if c is None else dict(c) for c in self.floor_candidates],
            "probing": None if self.probing is None else list(self.probing),
            "fixed_s": list(self.fixed_s),
            "probe_evidence": None
            if self._probe_evidence is None
            else [list(part) for part in self._probe_evidence],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._load_learned_state(state)
        self.learned_min = list(state.get("learned_min", []))
        self.floor_expires_in = list(state.get("floor_expires_in", [None] * len(self.learned_min)))
        candidates = state.get("floor_candidates") or [None] * len(self.learned_min)
        self.floor_candidates = [None if c is None else dict(c) for c in candidates]
        probing = state.get("probing")
        self.probing = None if probing is None else list(probing)
        self.fixed_s = [float(a) for a in state.get("fixed_s", [])]  # none before issue 43
        evidence = state.get("probe_evidence")
        self._probe_evidence = None if evidence is None else (list(evidence[0]), list(evidence[1]))


def _direction(current: list[int], target: list[int]) -> list[int]:
    """Per rank, whether ``target`` grows (1), keeps (0) or shrinks (-1) its batch."""
    return [(t > b) - (t < b) for t, b in zip(target, current)]


def _agrees(probing: list[int] | None, current: list[int], target: list[int]) -> bool:
    """The move to ``target`` asks the way the probe went: the rank it moves most
    (relative to its batch) moves as the probe moved it, and no rank moves against the
    probe by more than one sample (a probe's one-sample moves of large batches are
    rounding, which the next boundary may undo; on two ranks both move, and the main
    rank's direction decides)."""
    if probing is None or len(probing) != len(current) or target == current:
        return False
    main = max(range(len(current)), key=lambda k: abs(target[k] - current[k]) / current[k])
    if probing[main] != _direction(current, target)[main]:
        return False
    return all(d == 0 or (t - b) * d >= -1 for d, t, b in zip(probing, target, current))


def _evidence_z(
    current: list[int], target: list[int], compute_s: list[float], readings: list[RankStats]
) -> float:
    """How sure the move from ``current`` to ``target`` is: the log ratio of the compute times
    of the rank it shrinks most and the rank it grows most (equal times: nothing to move),
    over the standard error of that ratio (``inf`` when a rank reports no noise: nothing says
    the move is unsure)."""
    ranks = range(len(current))
    gain = max(ranks, key=lambda k: (target[k] - current[k]) / current[k])
    lose = min(ranks, key=lambda k: (target[k] - current[k]) / current[k])
    errors = [readings[k].compute_se / compute_s[k] for k in (gain, lose)]
    if not all(math.isfinite(e) for e in errors):
        return math.inf
    spread = math.hypot(*errors)
    ratio = compute_s[lose] / compute_s[gain]
    return math.inf if spread == 0 else abs(math.log(ratio)) / spread


def _fixed_costs(
    current: list[int],
    compute_s: list[float],
    noise: list[float],
    before: tuple[list[int], list[float]],
    last_noise: list[float],
) -> list[float]:
    """Per rank, the fixed per-step cost that the line through its last two boundaries'
    ``(b, t)`` shows, or 0.

    A rank's step time is ``a + c * b``; proportional control takes ``a = 0``, so from a
    rank whose steps pay a fixed cost it moves only part of the way to equal times at each
    boundary (the slow rank looks faster per sample as its batch shrinks) and integer
    rounding can stop it short. Where the rank's batch shrank by at least ``_FIT_SPREAD``
    since the last boundary (``before``: its sizes and throughputs), the two readings give
    ``a``; it counts only when it is positive by ``_FIT_Z`` standard errors (from each
    reading's relative noise), so equal ranks moved a little by noise, and linear ranks,
    keep ``a = 0``. A rank that grew keeps ``a = 0``: a line through a flat part of its
    curve (a device not yet full) would promise it far more samples than it can take. Only
    the last boundary counts: an older reading may predate a change of speed.
    """
    last, last_throughput = before
    fixed = [0.0] * len(current)
    if len(last) != len(current) or len(last_throughput) != len(current):
        return fixed
    for k, (b, t, old, x_old) in enumerate(zip(current, compute_s, last, last_throughput)):
        if b > (1.0 - _FIT_SPREAD) * old or not (x_old > 0 and math.isfinite(x_old)):
            continue  # not shrunk enough to tell
        t_old = old / x_old
        slope = (t - t_old) / (b - old)
        if not slope > 0:
            continue  # slower at fewer samples: another load, not a fixed cost
        now_se, old_se = (
            e[k] * x if k < len(e) and math.isfinite(e[k]) else 0.0
            for e, x in ((noise, t), (last_noise, t_old))
        )
        intercept = (t_old * b - t * old) / (b - old)
        intercept_se = math.hypot(old * now_se, b * old_se) / (old - b)
        if intercept > _FIT_Z * intercept_se:
            fixed[k] = intercept  # below both readings: the slope is positive
    return fixed


def _carried(
    fitted: list[float],
    held: list[float],
    current: list[int],
    compute_s: list[float],
    last: list[int],
) -> list[float]:
    """``fitted``, where a rank without a fit of its own keeps the fixed cost of the last
    boundary while its batch goes on shrinking (a probe toward the plan that cost asked
    for, too small a step for a fit of its own) and the cost stays below its step time; a
    rank that holds its batch or grows drops it."""
    if len(held) != len(current) or len(last) != len(current):
        return fitted
    return [
        a if a > 0 or not (0 < old_a < t and b < old) else old_a
        for a, old_a, t, b, old in zip(fitted, held, compute_s, current, last)
    ]


def _affine_split(
    current: list[int],
    compute_s: list[float],
    fixed_s: list[float],
    total: int,
    lower: Sequence[int],
    upper: Sequence[int],
) -> list[int]:
    """The integer plan at which every rank's line ``t_k(b) = a_k + c_k * b`` through its
    reading ``(current[k], compute_s[k])`` with fixed cost ``a_k = fixed_s[k]`` gives equal
    times (within the bounds); with no fixed cost, the proportional split of ``b_k / t_k``.
    """
    if not any(fixed_s):
        return proportional_split(list(map(truediv, current, compute_s)), total, lower, upper)
    slopes = [(t - a) / b for t, a, b in zip(compute_s, fixed_s, current)]
    weights = [1.0 / c for c in slopes]  # b_k = (T - a_k) / c_k = T * w_k - a_k * w_k
    offsets = [-a * w for a, w in zip(fixed_s, weights)]
    level = _fill_level(weights, total, lower, upper, offsets=offsets)
    if level is None:
        shares = [float(lo) for lo in lower]
    else:
        shares = _clip((c + level * w for c, w in zip(offsets, weights)), lower, upper)
    return _round_shares(shares, total, lower, upper)


def _pooled_speeds(*measured: tuple[list[float], list[float]]) -> list[float]:
    """Per rank, the inverse of the precision-weighted geometric mean of per-sample times
    measured at several boundaries (``(per_sample_s, relative_variance)`` each); a rank
    with an unknown or zero variance takes the plain mean of the logs."""
    speeds = []
    for k in range(len(measured[0][0])):
        logs = [math.log(m[0][k]) for m in measured]
        variances = [v[k] for _, v in measured]
        if all(math.isfinite(v) and v > 0 for v in variances):
            weights = [1.0 / v for v in variances]
        else:
            weights = [1.0] * len(logs)
        speeds.append(math.exp(-sum(w * x for w, x in zip(weights, logs)) / sum(weights)))
    return speeds


def _at_floor(batch_size: int, compute_s: float, before: dict[str, Any]) -> bool:
    """A rank timed at ``before["size"]`` and ``before["time_s"]`` now runs ``batch_size``
    samples in ``compute_s``: at least 10% fewer, and faster by less than a third of that."""
    size = before["size"]
    if batch_size > (1.0 - _FLOOR_SHRINK) * size:
        return False
    expected, fell = 1.0 - batch_size / size, 1.0 - compute_s / before["time_s"]
    return fell < expected / 3.0


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
    """The real-valued target of ``_omnilearn_split``, summing to ``total``."""
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
