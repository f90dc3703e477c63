"""The closed loop on the objective: keep a plan change only if steps did not get slower."""

from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite, sqrt
from typing import Any

from lightning_hetero.planning.split import is_count

__all__ = ["StepTimeGuard", "damped_plan"]


def damped_plan(plan: Sequence[int], target: Sequence[int], fraction: float) -> list[int]:
    """``plan + fraction * (target - plan)`` in integers that keep the plan's sum.

    Each rank lands between its old and its target size (so bounds both respect hold);
    the rounding gives the remainder to the largest fractional parts, ties to lower ranks.

    Example:
        >>> damped_plan([64, 64, 64, 64], [61, 1, 1, 193], 0.5)
        [63, 33, 32, 128]
    """
    if len(plan) != len(target) or sum(plan) != sum(target):
        raise ValueError(f"`target` {list(target)} is not a re-split of `plan` {list(plan)}.")
    if not 0.0 <= fraction <= 1.0:
        raise ValueError(f"`fraction` must be in [0, 1], got {fraction}.")
    exact = [b + fraction * (t - b) for b, t in zip(plan, target)]
    low = [min(int(x // 1), max(b, t)) for x, b, t in zip(exact, plan, target)]
    short = sum(plan) - sum(low)
    order = sorted(range(len(plan)), key=lambda k: (-(exact[k] - low[k]), k))
    for k in order[:short]:
        low[k] += 1
    return low


@dataclass
class _Measured:
    plan: list[int]
    step_s: float
    step_se: float


class StepTimeGuard:
    """Checks every plan change against the wall time of a synchronous step, and undoes it.

    In lock-step training every rank's step takes the same wall time, and that time is what
    a plan is for. At each boundary the guard gets the plan in force with its measured mean
    step time and standard error (``review``), and keeps the fastest plan measured so far
    (``baseline``). When steps under the plan in force are slower than under the
    baseline by more than ``z`` standard errors of the difference plus ``tolerance``
    (relative), it answers with the baseline's plan: the change is reverted. Comparing with
    the fastest plan, not with the one just before, keeps changes that each look harmless
    within the noise from adding up to a slower run. When the baseline's own plan is
    measured again, its new time replaces the old one, so the reference follows a cluster
    that changes.

    A plan measured over fewer than ``min_steps`` steps is not judged: the guard holds it
    (``propose`` keeps it) until its steps are enough for a verdict, as happens when
    boundaries come every step or two.

    A revert is remembered as a smaller step: once the baseline's plan, measured again,
    shows that the cluster did not change meanwhile, the next changes move only ``shrink``
    of the way from the plan in force to what the controller asks (halving again at every
    further revert), and once a step would be below ``min_fraction`` no change is tried at
    all. If the baseline's plan is slower than it was beyond the noise, the cluster changed
    (the revert was its doing, not the change's), and full steps are tried again; so they
    are after a change is kept as the new fastest. Each plan is judged once: when a plan that
    was kept later runs at another speed beyond the noise, the cluster changed, and its new
    time becomes the reference (what other plans did under the old speeds no longer says
    anything). So a run is never left slower than the fastest plan it has measured under
    the speeds of the moment, beyond the noise, whatever the controller believes.

    Pure: numbers in, plans out; the re-planner and the simulator drive it.

    Args:
        z: standard errors of the difference of two mean step times that count as noise.
        tolerance: relative slowdown that never counts (timer resolution, drift), ``>= 0``.
        shrink: fraction of the step tried after a revert, in ``(0, 1)``.
        min_fraction: smallest fraction of a step worth trying, in ``(0, 1]``.
        min_steps: steps a plan's step time must hold before it is judged, ``>= 2``.

    Example:
        >>> guard = StepTimeGuard()
        >>> guard.review([32, 32], step_s=1.00, step_se=0.01)  # the start: nothing to check
        >>> guard.propose([32, 32], [60, 4])
        [60, 4]
        >>> guard.review([60, 4], step_s=1.30, step_se=0.01)  # slower: back to the plan before
        [32, 32]
        >>> guard.review([32, 32], step_s=1.00, step_se=0.01)  # as before: not the cluster
        >>> guard.propose([32, 32], [60, 4])  # half the step now
        [46, 18]
    """

    def __init__(
        self,
        z: float = 2.0,
        tolerance: float = 0.005,
        shrink: float = 0.5,
        min_fraction: float = 0.2,
        min_steps: int = 3,
    ) -> None:
        if z < 0 or tolerance < 0:
            raise ValueError(f"`z` and `tolerance` must be >= 0, got {z} and {tolerance}.")
        if not 0.0 < shrink < 1.0:
            raise ValueError(f"`shrink` must be in (0, 1), got {shrink}.")
        if not 0.0 < min_fraction <= 1.0:
            raise ValueError(f"`min_fraction` must be in (0, 1], got {min_fraction}.")
        if not is_count(min_steps, least=2):
            raise ValueError(f"`min_steps` must be an integer >= 2, got {min_steps!r}.")
        self.z, self.tolerance, self.shrink, self.min_fraction = z, tolerance, shrink, min_fraction
        self.min_steps = min_steps
        #: The plan in force has too few steps for a verdict: keep it.
        self.holding = False
        #: The plan in force as measured when it was judged.
        self.current: _Measured | None = None
        self._shrink_pending = False  # a revert waits for the baseline's new measurement
        #: The last kept plan and its step time.
        self.baseline: _Measured | None = None
        #: The change under test (made at the last boundary), if any.
        self.trial: list[int] | None = None
        #: Fraction of a controller's step tried now (1.0 until a revert).
        self.fraction = 1.0
        #: The baseline's step time when the last revert happened.
        self._reverted_at: _Measured | None = None
        #: Changes undone so far.
        self.reverts = 0

    def _slower(self, now: _Measured, before: _Measured) -> bool:
        """``now``'s steps are slower than ``before``'s beyond noise."""
        noise = sqrt(sum(se * se for se in (now.step_se, before.step_se) if isfinite(se)))
        return now.step_s - before.step_s > self.z * noise + self.tolerance * before.step_s

    def review(
        self, plan: Sequence[int], step_s: float, step_se: float, steps: int | None = None
    ) -> list[int] | None:
        """The plan in force and its measured step time (over ``steps`` steps, if known);
        returns the plan to go back to when steps under ``plan`` are slower than under the
        fastest plan measured, else ``None``.

        Call it only with a step time measured at ``plan`` (finite and positive).
        """
        self.holding = steps is not None and steps < self.min_steps
        if self.holding:
            return None  # too few steps to tell: judge it at a later boundary
        now = _Measured(list(plan), float(step_s), float(step_se))
        if self.baseline is not None and sum(self.baseline.plan) != sum(now.plan):
            # another global batch (an input-scale change, a new `global_batch_size`): steps
            # of another size do not compare, and no plan of the old one can come back
            self.restart()
        if self.baseline is None and self.current is None:
            self.baseline = self.current = now  # a (new) reference: nothing to judge
            return None
        best, previous, self.current = self.baseline, self.current, now
        was_trial, self.trial = self.trial == now.plan, None
        if previous is not None and now.plan == previous.plan:
            if self._slower(now, previous) or self._slower(previous, now):
                # a plan judged before now runs at another speed: the cluster changed, and
                # what was measured under other plans no longer holds
                self.baseline, self.fraction = now, 1.0
                self._reverted_at, self._shrink_pending = None, False
            else:
                self.current = previous  # judged once; its verdict stands
                if best is not None and now.plan == best.plan:
                    self.baseline = now
            return None
        if best is None or now.plan == best.plan:
            was = self._reverted_at
            if was is not None:
                if self._slower(now, was) or self._slower(was, now):
                    self.fraction, self._reverted_at = 1.0, None  # the cluster changed
                elif self._shrink_pending:
                    self.fraction *= self.shrink  # the change itself was slower
                self._shrink_pending = False
            self.baseline = now  # the reference follows the cluster
            return None
        if self._slower(now, best):
            self.reverts += 1
            self._shrink_pending = True
            self._reverted_at = best
            return list(best.plan)
        if now.step_s < best.step_s:
            self.baseline = now
            if was_trial:
                self.fraction, self._reverted_at = 1.0, None  # a kept change: full steps again
        return None

    def restart(self) -> None:
        """Forget every measurement: the per-step cost changed for a reason no plan has
        (the model's trainable parameters, the optimizer's parameter groups, the global
        batch), so the next plan measured is the new reference and is not judged."""
        self.baseline = self.current = None
        self.trial, self.fraction = None, 1.0
        self._reverted_at, self._shrink_pending = None, False

    def propose(self, plan: Sequence[int], target: Sequence[int]) -> list[int]:
        """What to run instead of ``plan`` when the controller asks for ``target``: the
        target, a damped step toward it after a revert, or ``plan`` (no change)."""
        current, wanted = list(plan), list(target)
        if wanted == current or self.holding or self.fraction < self.min_fraction:
            return current
        step = damped_plan(current, wanted, self.fraction) if self.fraction < 1.0 else wanted
        self.trial = step if step != current else None
        return step

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue after a restart."""
        return {
            "baseline": None if self.baseline is None else vars(self.baseline).copy(),
            "trial": self.trial,
            "fraction": self.fraction,
            "reverted_at": None if self._reverted_at is None else vars(self._reverted_at).copy(),
            "current": None if self.current is None else vars(self.current).copy(),
            "reverts": self.reverts,
            "holding": self.holding,
            "shrink_pending": self._shrink_pending,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""
        self.baseline = None if state["baseline"] is None else _Measured(**state["baseline"])
        self.trial = state["trial"]
        self.fraction = float(state["fraction"])
        reverted = state["reverted_at"]
        self._reverted_at = None if reverted is None else _Measured(**reverted)
        self.reverts = int(state["reverts"])
        self.holding = bool(state.get("holding", False))
        current = state.get("current")
        self.current = None if current is None else _Measured(**current)
        self._shrink_pending = bool(state.get("shrink_pending", False))
