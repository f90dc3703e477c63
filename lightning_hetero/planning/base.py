"""The controller interface: measured timings in, next plan out."""

from abc import ABC, abstractmethod
from collections.abc import Sequence
from dataclasses import dataclass, field
from math import isfinite, nan
from operator import le
from typing import Any, ClassVar, Literal

from lightning_hetero.planning.split import PlanError, expand_bound, finite_and_positive

__all__ = [
    "AUTO_DEADBAND_CAP",
    "AUTO_DEADBAND_FALLBACK",
    "AUTO_DEADBAND_FLOOR",
    "BatchLimits",
    "Controller",
    "Deadband",
    "RankStats",
    "check_deadband",
    "check_inputs",
    "noise_deadband",
]

#: A dead-band: a relative gain in ``[0, 1)``, or ``"auto"`` (see ``noise_deadband``).
Deadband = float | Literal["auto"]
#: The smallest dead-band ``"auto"`` picks: below it timer resolution and drift decide.
AUTO_DEADBAND_FLOOR = 0.01
#: The largest dead-band ``"auto"`` picks: a move the noise may explain is only a probe
#: (``ProportionalController``'s evidence-sized moves), so a wider band would hold poor plans.
AUTO_DEADBAND_CAP = 0.25
#: The dead-band ``"auto"`` falls back to when no rank reports its timing noise.
AUTO_DEADBAND_FALLBACK = 0.05


@dataclass(frozen=True)
class BatchLimits:
    """The fixed global batch and the per-rank batch bounds every plan must respect."""

    global_batch_size: int
    min_batch_size: list[int] = field(default_factory=list)
    max_batch_size: list[int] = field(default_factory=list)

    @classmethod
    def build(
        cls,
        world_size: int,
        global_batch_size: int,
        min_batch_size: int | Sequence[int] = 1,
        max_batch_size: int | Sequence[int] | None = None,
    ) -> "BatchLimits":
        """Expand scalar bounds to one per rank and check that ``B`` fits between them."""
        lower = expand_bound(min_batch_size, world_size, 1)
        upper = expand_bound(max_batch_size, world_size, global_batch_size)
        upper = [min(u, global_batch_size) for u in upper]
        limits = cls(global_batch_size, lower, upper)
        limits.check()
        return limits

    @property
    def world_size(self) -> int:
        return len(self.min_batch_size)

    def admits(self, plan: Sequence[int]) -> bool:
        """Whether ``plan`` sums to the global batch and keeps every rank within its bounds."""
        return (
            len(plan) == self.world_size
            and sum(plan) == self.global_batch_size
            and all(map(le, self.min_batch_size, plan))
            and all(map(le, plan, self.max_batch_size))
        )

    def check(self) -> None:
        """Raise [`PlanError`][lightning_hetero.planning.base.PlanError] unless some plan satisfies
        these limits."""
        for rank, (lo, hi) in enumerate(zip(self.min_batch_size, self.max_batch_size)):
            if lo < 1:
                raise PlanError(f"Rank {rank}: `min_batch_size` must be >= 1, got {lo}.")
            if lo > hi:
                raise PlanError(f"Rank {rank}: `min_batch_size` {lo} > `max_batch_size` {hi}.")
        lower, upper = sum(self.min_batch_size), sum(self.max_batch_size)
        if not lower <= self.global_batch_size <= upper:
            raise PlanError(
                f"The global batch size {self.global_batch_size} must lie between the sum of the"
                f" per-rank minimums (`min_batch_size`: {lower}) and of the maximums"
                f" (`max_batch_size`: {upper}) for"
                f" {self.world_size} ranks."
            )


@dataclass(frozen=True)
class RankStats:
    """Side readings of one rank at a boundary, next to its compute time.

    Controllers that need more than timings read these; the others ignore them. A
    reading a rank cannot take is ``nan`` (or ``None`` for ``updates``).

    Attributes:
        memory_used: fraction of the rank's memory budget in use at its peak since the last
            boundary (device memory on GPU, host memory of the process on CPU), in ``[0, 1]``.
        cpu_available: fraction of the host's CPU capacity that is idle, in ``[0, 1]``.
        memory_available: fraction of the host's memory that is available, in ``[0, 1]``.
        updates: model updates the rank made since the last boundary, where ranks can
            differ in that (asynchronous and local-SGD modes); ``None`` in lock-step modes.
        compute_se: standard error of the rank's smoothed compute time, seconds (its timing
            noise; see [`compute_se`][lightning_hetero.planning.TimingSmoother.compute_se]).
    """

    memory_used: float = nan
    cpu_available: float = nan
    memory_available: float = nan
    updates: int | None = None
    compute_se: float = nan


def check_deadband(deadband: Deadband) -> None:
    """Refuse a dead-band that is neither ``"auto"`` nor a number in ``[0, 1)``."""
    if deadband == "auto":
        return
    if isinstance(deadband, bool) or not isinstance(deadband, int | float):
        raise ValueError(f"`deadband` must be 'auto' or a number in [0, 1), got {deadband!r}.")
    if not 0.0 <= deadband < 1.0:
        raise ValueError(f"`deadband` must be 'auto' or in [0, 1), got {deadband}.")


def noise_deadband(
    deadband: Deadband, compute_s: Sequence[float], stats: Sequence[RankStats]
) -> float:
    """The dead-band in force: ``deadband`` itself, or for ``"auto"`` the measured noise.

    ``"auto"`` is twice the largest relative standard error of the ranks' smoothed compute
    times (a predicted gain smaller than that could be noise), at least
    ``AUTO_DEADBAND_FLOOR`` and at most ``AUTO_DEADBAND_CAP``; with no rank reporting its noise,
    ``AUTO_DEADBAND_FALLBACK``. Calm clusters so settle within a percent or two of
    balance, noisy ones move only for gains the noise cannot explain.

    Example:
        >>> noise_deadband("auto", [1.0, 2.0], [RankStats(compute_se=0.004)] * 2)
        0.01
        >>> noise_deadband("auto", [1.0, 2.0], [RankStats(compute_se=0.02)] * 2)
        0.04
        >>> noise_deadband(0.05, [1.0, 2.0], [RankStats(compute_se=0.02)] * 2)
        0.05
    """
    if deadband != "auto":
        return float(deadband)
    relative = [
        s.compute_se / t for s, t in zip(stats, compute_s) if isfinite(s.compute_se) and t > 0
    ]
    if not relative:
        return AUTO_DEADBAND_FALLBACK
    return min(AUTO_DEADBAND_CAP, max(AUTO_DEADBAND_FLOOR, 2.0 * max(relative)))


def check_inputs(
    batch_sizes: Sequence[int],
    compute_s: Sequence[float],
    limits: BatchLimits,
    stats: Sequence[RankStats] | None = None,
) -> tuple[list[int], list[float], list[RankStats]]:
    """Validate what a controller's ``update`` received; returns them as lists.

    Missing ``stats`` become one empty [`RankStats`][lightning_hetero.planning.base.RankStats] per
    rank.

    Raises:
        ValueError: lengths that differ from the world size, or a compute time that is not
            finite and positive.
    """
    plan, times = list(batch_sizes), list(map(float, compute_s))
    readings = [RankStats()] * len(plan) if stats is None else list(stats)
    if not len(plan) == len(times) == len(readings) == limits.world_size:
        raise ValueError(
            f"Expected one batch size, compute time and RankStats per rank for"
            f" {limits.world_size} ranks, got {len(plan)}, {len(times)} and {len(readings)}."
        )
    if not finite_and_positive(times):
        raise ValueError(f"Compute times must be finite and positive, got {times}.")
    return plan, times, readings


class Controller(ABC):
    """Decides the next plan from the current one and each rank's smoothed compute time.

    Subclasses are pure: numbers in, plan out, with all state in attributes that
    ``state_dict`` returns. Every rank runs the same controller on the same
    gathered numbers and so reaches the same plan.
    """

    #: Name under which the controller is selected, e.g. ``HeteroStrategy(controller="static")``.
    name: ClassVar[str]
    #: Every rank reaches the same plan from the same gathered numbers, bit for bit, on any
    #: machine (plain float arithmetic only: no libm, torch or randomness). Then each rank
    #: decides for itself and a boundary needs one collective; otherwise rank 0 decides and
    #: broadcasts. Leave it ``False`` unless that holds.
    replicable: bool = False
    #: Takes ``deadband="auto"`` (the dead-band follows the ranks' measured timing noise,
    #: ``noise_deadband``).
    auto_deadband: ClassVar[bool] = False
    #: Moves the plan from timings. ``False`` for a fixed plan the user chose on purpose: a
    #: boundary then keeps an unbalanced plan without saying so.
    adapts: ClassVar[bool] = True

    @abstractmethod
    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        """Return the next plan.

        Args:
            batch_sizes: the batch size each rank was timed at (the plan in force).
            compute_s: each rank's smoothed compute time per step at that batch size, seconds.
            limits: the global batch and the per-rank bounds the result must respect.
            stats: one [`RankStats`][lightning_hetero.planning.base.RankStats] per rank, or ``None``
                when no side readings exist.
        """

    def plan_imposed(self, plan: Sequence[int]) -> None:
        """``plan`` runs next though this controller did not choose it (the step-time
        guard's revert, measured evidence): drop what it learned that ``plan`` contradicts,
        so that it does not force the plan back at the next boundary. Default: nothing."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly after a restart."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
