"""The closed loop on the objective: keep a plan change only if steps did not get slower."""

from collections.abc import Sequence
from dataclasses import dataclass
from math import isfinite, sqrt
from typing import Any

from lightning_hetero.planning.split import is_count

__all__ = ["StepTimeGuard", "damped_plan", "load_index"]


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
    #: Per rank, compute seconds per sample under ``plan`` (``None``: not reported).
    sample_s: list[float] | None = None


def load_index(now: _Measured, before: _Measured) -> float:
    """How much slower the machine runs in ``now`` than in ``before``, whatever the plan: the
    smallest ratio of any rank's compute time per sample, at least 1.

    A plan moves samples between ranks; on a rank whose batch grew the time per sample stays
    or falls (fixed costs spread), so a plan that is worse leaves some rank's per-sample time
    where it was. Only a slowdown that every rank saw (another job on the machine, a clock
    that fell) raises them all. 1.0 when either measurement lacks per-rank times.
    """
    if now.sample_s is None or before.sample_s is None or len(now.sample_s) != len(before.sample_s):
        return 1.0
    ratios = [n / b for n, b in zip(now.sample_s, before.sample_s) if b > 0 and isfinite(n / b)]
    if len(ratios) != len(now.sample_s):
        return 1.0
    return max(1.0, min(ratios))


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

    **Same conditions.** A slowdown every rank saw is not the plan's doing: with per-rank
    compute times (``review``'s ``compute_s``), the plan in force is judged on its step time
    divided by the load index (``load_index``: the smallest rise of any rank's time per
    sample), so a whole-machine slowdown under a balanced plan is no revert. And a revert
    sends the run back to the reference plan, which is so measured again: the revert stands
    as the change's fault only if the change was slower than the reference both before and
    after it; if the reference, measured again, is as slow as the change was, the load moved
    (the revert was its doing) and full steps are tried again.

    A revert the change is to blame for is remembered as a smaller step: the next changes
    move only ``shrink`` of the way from the plan in force to what the controller asks
    (halving again at every further revert), and once a step would be below
    ``min_fraction`` no change is tried at all. **No flip-flop:** after ``max_reverts``
    reverts to the same reference with no change kept between them, whatever caused them,
    the guard tries no change from that reference until the cluster changes beyond the
    drift seen so far (the reference's step time leaves the range it showed since the first
    of those reverts by more than the noise) or the controller asks for another plan (one
    farther than half the refused step from the refused target); so a pair of plans never
    alternates more than ``max_reverts`` times under a load that drifts. A change that is
    kept as the new fastest restores full steps. Each plan is judged once: when a plan that
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
        max_reverts: reverts to the same reference, with no change kept between, after which
            no change from it is tried until the cluster or the controller's target changes,
            ``>= 1``.

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
        max_reverts: int = 2,
    ) -> None:
        if z < 0 or tolerance < 0:
            raise ValueError(f"`z` and `tolerance` must be >= 0, got {z} and {tolerance}.")
        if not 0.0 < shrink < 1.0:
            raise ValueError(f"`shrink` must be in (0, 1), got {shrink}.")
        if not 0.0 < min_fraction <= 1.0:
            raise ValueError(f"`min_fraction` must be in (0, 1], got {min_fraction}.")
        if not is_count(min_steps, least=2):
            raise ValueError(f"`min_steps` must be an integer >= 2, got {min_steps!r}.")
        if not is_count(max_reverts):
            raise ValueError(f"`max_reverts` must be an integer >= 1, got {max_reverts!r}.")
        self.max_reverts = max_reverts
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
        #: Reverts to the baseline's plan since a change was last kept.
        self.reverts_in_row = 0
        #: The change last reverted, as measured (the revert's verdict waits for the baseline's
        #: new measurement).
        self._reverted_trial: _Measured | None = None
        #: ``(lowest, highest)`` step time of the baseline's plan since the first of the reverts
        #: in a row: the drift the verdicts were made under.
        self._envelope: tuple[float, float] | None = None
        #: What the controller asked when the guard stopped trying (``None``: trying).
        self.refused: list[int] | None = None

    def _slower(self, now: _Measured, before: _Measured, load: float = 1.0) -> bool:
        """``now``'s steps, divided by ``load``, are slower than ``before``'s beyond noise."""
        now_se = now.step_se / load
        noise = sqrt(sum(se * se for se in (now_se, before.step_se) if isfinite(se)))
        return now.step_s / load - before.step_s > self.z * noise + self.tolerance * before.step_s

    def _note_baseline(self, step_s: float) -> None:
        """Widen the drift range of the baseline's step time while reverts are counted."""
        if self.reverts_in_row and self._envelope is not None:
            low, high = self._envelope
            self._envelope = (min(low, step_s), max(high, step_s))

    def _beyond_drift(self, now: _Measured) -> bool:
        """The baseline's plan runs outside the range it showed since the reverts began."""
        if self._envelope is None:
            return True
        low, high = self._envelope
        band = self.z * (now.step_se if isfinite(now.step_se) else 0.0)
        band += self.tolerance * now.step_s
        return now.step_s > high + band or now.step_s < low - band

    def _trying_again(self) -> None:
        """Forget the reverts in a row: changes from the baseline are tried afresh."""
        self.reverts_in_row, self._envelope, self.refused = 0, None, None

    def review(
        self,
        plan: Sequence[int],
        step_s: float,
        step_se: float,
        steps: int | None = None,
        compute_s: Sequence[float] | None = None,
    ) -> list[int] | None:
        """The plan in force and its measured step time (over ``steps`` steps, if known);
        returns the plan to go back to when steps under ``plan`` are slower than under the
        fastest plan measured, else ``None``.

        ``compute_s``: each rank's compute time per step under ``plan``; with it a slowdown
        that every rank saw is told from the plan's (``load_index``).

        Call it only with a step time measured at ``plan`` (finite and positive).
        """
        self.holding = steps is not None and steps < self.min_steps
        if self.holding:
            return None  # too few steps to tell: judge it at a later boundary
        per_sample = None
        if compute_s is not None and len(compute_s) == len(plan) and all(plan):
            per_sample = [float(t) / b for t, b in zip(compute_s, plan)]
        now = _Measured(list(plan), float(step_s), float(step_se), per_sample)
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
                if self.reverts_in_row and not self._beyond_drift(now):
                    self._note_baseline(now.step_s)  # within the drift seen: still refused
                else:
                    self._trying_again()
                self.baseline, self.fraction = now, 1.0
                self._reverted_at, self._shrink_pending = None, False
            else:
                self.current = previous  # judged once; its verdict stands
                if best is not None and now.plan == best.plan:
                    self.baseline = now
                    self._note_baseline(now.step_s)
            return None
        if best is None or now.plan == best.plan:
            was, trial = self._reverted_at, self._reverted_trial
            if was is not None:
                # the reference measured again: the change is to blame only if it was slower
                # than the reference after it too (same conditions), else the load moved
                if self._shrink_pending and trial is not None and self._slower(trial, now):
                    self.fraction *= self.shrink
                elif self._shrink_pending or self._slower(now, was) or self._slower(was, now):
                    self.fraction, self._reverted_at = 1.0, None  # the cluster changed
                self._shrink_pending = False
            self._reverted_trial = None
            self._note_baseline(now.step_s)
            self.baseline = now  # the reference follows the cluster
            return None
        load = load_index(now, best)
        if self._slower(now, best, load):
            self.reverts += 1
            self.reverts_in_row += 1
            if self._envelope is None:
                self._envelope = (best.step_s, best.step_s)
            self._shrink_pending = True
            self._reverted_at, self._reverted_trial = best, now
            return list(best.plan)
        if was_trial:
            self._trying_again()  # a change kept: the reverts before it are history
        if now.step_s / load < best.step_s:
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
        self._reverted_trial = None
        self._trying_again()

    def propose(self, plan: Sequence[int], target: Sequence[int]) -> list[int]:
        """What to run instead of ``plan`` when the controller asks for ``target``: the
        target, a damped step toward it after a revert, or ``plan`` (no change)."""
        current, wanted = list(plan), list(target)
        if self.reverts_in_row >= self.max_reverts:
            refused = self.refused if self.refused is not None else wanted
            if self.refused is None:
                self.refused = wanted
            step = sum(abs(r - b) for r, b in zip(refused, current))
            if sum(abs(w - r) for w, r in zip(wanted, refused)) * 2 <= step:
                return current  # the same request from the same reference: refused
            self._trying_again()  # the controller asks for something else: judge it afresh
            self.fraction = 1.0
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
            "reverts_in_row": self.reverts_in_row,
            "reverted_trial": (
                None if self._reverted_trial is None else vars(self._reverted_trial).copy()
            ),
            "envelope": None if self._envelope is None else list(self._envelope),
            "refused": self.refused,
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
        self.reverts_in_row = int(state.get("reverts_in_row", 0))
        trial = state.get("reverted_trial")
        self._reverted_trial = None if trial is None else _Measured(**trial)
        envelope = state.get("envelope")
        self._envelope = None if envelope is None else (float(envelope[0]), float(envelope[1]))
        refused = state.get("refused")
        self.refused = None if refused is None else list(refused)
