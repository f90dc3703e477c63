"""Step-by-step batch moves from the slowest rank to the fastest (paper 001, Alg. 2)."""

import warnings
from collections.abc import Sequence
from math import isnan
from typing import Any

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats, check_inputs
from lightning_hetero.planning.split import is_count, proportional_split

__all__ = ["StepwiseController"]

_FAST, _FINE = "fast", "fine"


class StepwiseController(Controller):
    """Move a few samples at a time from the straggler to the leader (LB-BSP for GPUs).

    Paper 001 (Alg. 2) finds the balanced plan by trial instead of by a model of the
    step time, which suits GPUs whose time curve is flat and then rises. At each
    boundary:

    * the **straggler** is the rank with the longest compute time;
    * the **leader** is the rank with the shortest compute time among those whose
      ``memory_used`` ([`RankStats`][lightning_hetero.planning.stepwise.RankStats]) is below
      ``memory_threshold`` (an unknown,
      ``nan`` reading counts as below) and whose batch is below its maximum;
    * if the leader's time was below ``(1 - deadband)`` times the straggler's at each of
      the last ``window`` boundaries under the current plan (the *observation window*),
      ``step`` samples move from the straggler to the leader. Timings taken under an
      older plan never count: the window restarts after every move.

    Two phases keep the approach quick and the end calm. The *fast-approach* phase
    uses ``fast_step`` and ``fast_window``; at the first **oscillation** the controller
    switches for good to the *fine-tune* phase (``fine_step``, ``fine_window``). An
    oscillation is a boundary at which the rank that gained samples in the latest move
    is now the straggler, or the rank that gave them is now the leader: the last move
    overshot the balance point. As in the paper there is no way back: after a later
    change of speeds the controller still moves ``fine_step`` samples per ``fine_window``
    boundaries.

    When a move is due but the straggler cannot give a full step without its batch
    falling to zero or below its minimum, it gives what its minimum allows and a
    warning says that training without that rank would likely be faster (the paper
    restarts without it). The warning comes once per episode: again only after another
    rank has been the straggler in between.

    Windows count boundaries. With per-step re-planning (``adjust_every=1``) a boundary
    is an iteration, as in the paper; with coarser boundaries the controller takes
    proportionally longer (``fast_window * (b_straggler - b_balanced) / fast_step``
    boundaries at least), which is why
    [`ProportionalController`][lightning_hetero.planning.ProportionalController] is the default.
    A plan that breaks the limits (new bounds, a plan set by hand) is first projected
    onto them, keeping its proportions, and the window starts afresh.

    Args:
        fast_step: samples moved per move in the fast-approach phase (paper: 5).
        fast_window: boundaries the leader must stay ahead before a fast move (paper: 5).
        fine_step: samples moved per move in the fine-tune phase (paper: 1).
        fine_window: boundaries the leader must stay ahead before a fine move (paper: 20).
        memory_threshold: a rank using this fraction of its memory budget or more is never
            the leader (paper: 0.95, i.e. less than 5% memory left), in ``(0, 1]``.
        deadband: relative lead needed to count as ahead, in ``[0, 1)``; ``0`` (the paper)
            counts any lead. A dead-band keeps timing noise from moving a balanced plan;
            ``HeteroStrategy`` passes its own ``deadband`` (0.05) to controllers it builds
            by name.

    Example:
        >>> from lightning_hetero.planning import BatchLimits
        >>> ctl = StepwiseController(fast_window=2)
        >>> limits = BatchLimits.build(2, 64)
        >>> ctl.update([32, 32], [1.0, 2.0], limits)  # one boundary observed
        [32, 32]
        >>> ctl.update([32, 32], [1.0, 2.0], limits)  # a whole window: move 5 samples
        [37, 27]
    """

    name = "stepwise"
    replicable = True

    def __init__(
        self,
        fast_step: int = 5,
        fast_window: int = 5,
        fine_step: int = 1,
        fine_window: int = 20,
        memory_threshold: float = 0.95,
        deadband: float = 0.0,
    ) -> None:
        for option, value in [
            ("fast_step", fast_step),
            ("fast_window", fast_window),
            ("fine_step", fine_step),
            ("fine_window", fine_window),
        ]:
            if not is_count(value):
                raise ValueError(f"`{option}` must be an integer >= 1, got {value!r}.")
        if not 0.0 < memory_threshold <= 1.0:
            raise ValueError(f"`memory_threshold` must be in (0, 1], got {memory_threshold}.")
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"`deadband` must be in [0, 1), got {deadband}.")
        self.fast_step = fast_step
        self.fast_window = fast_window
        self.fine_step = fine_step
        self.fine_window = fine_window
        self.memory_threshold = memory_threshold
        self.deadband = deadband
        #: ``"fast"`` (fast-approach) or ``"fine"`` (fine-tune).
        self.phase = _FAST
        #: Compute times of each boundary since the last move, oldest first.
        self.observed: list[list[float]] = []
        #: ``[gainer, giver]`` ranks of the latest move, or ``None`` before the first.
        self.last_move: list[int] | None = None
        #: Straggler already warned about in the current episode.
        self.warned_rank: int | None = None
        #: The plan the last update returned; timings under any other plan start afresh.
        self.last_plan: list[int] = []

    @property
    def step(self) -> int:
        """Samples per move in the current phase."""
        return self.fast_step if self.phase == _FAST else self.fine_step

    @property
    def window(self) -> int:
        """Observation window, in boundaries, of the current phase."""
        return self.fast_window if self.phase == _FAST else self.fine_window

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        plan, times, _ = check_inputs(batch_sizes, compute_s, limits, stats)
        lower, upper = limits.min_batch_size, limits.max_batch_size
        if not limits.admits(plan):
            # Not a plan this controller made (new limits, a user's plan): bring it within.
            self.observed = []
            self.last_plan = proportional_split(plan, limits.global_batch_size, lower, upper)
            return list(self.last_plan)
        if plan != self.last_plan:
            self.observed = []
        self.observed = [*self.observed, times][-max(self.fast_window, self.fine_window) :]

        straggler = max(range(len(times)), key=lambda k: (times[k], -k))
        if self.warned_rank != straggler:
            self.warned_rank = None
        candidates = [
            k
            for k in range(len(times))
            if k != straggler and plan[k] < upper[k] and self._memory_ok(stats, k)
        ]
        if candidates:
            leader = min(candidates, key=lambda k: (times[k], k))
            self._detect_oscillation(leader, straggler)
            if self._leader_stayed_ahead(leader, straggler):
                self._move(plan, leader, straggler, limits)
        self.last_plan = list(plan)
        return plan

    def _memory_ok(self, stats: Sequence[RankStats] | None, rank: int) -> bool:
        if stats is None:
            return True
        used = stats[rank].memory_used
        return isnan(used) or used < self.memory_threshold

    def _detect_oscillation(self, leader: int, straggler: int) -> None:
        if self.phase == _FAST and self.last_move is not None:
            gainer, giver = self.last_move
            if straggler == gainer or leader == giver:
                self.phase = _FINE

    def _leader_stayed_ahead(self, leader: int, straggler: int) -> bool:
        if len(self.observed) < self.window:
            return False
        return all(
            times[leader] < (1.0 - self.deadband) * times[straggler]
            for times in self.observed[-self.window :]
        )

    def _move(self, plan: list[int], leader: int, straggler: int, limits: BatchLimits) -> None:
        lowest = limits.min_batch_size[straggler]
        if plan[straggler] - self.step < lowest and self.warned_rank is None:
            self.warned_rank = straggler
            warnings.warn(
                f"Rank {straggler} is the straggler at {plan[straggler]} samples and cannot give"
                f" {self.step} more without going below its minimum of {lowest}: training"
                " without this rank would likely be faster.",
                stacklevel=3,
            )
        amount = min(
            self.step,
            plan[straggler] - lowest,
            limits.max_batch_size[leader] - plan[leader],
        )
        if amount > 0:
            plan[leader] += amount
            plan[straggler] -= amount
            self.last_move = [leader, straggler]
            self.observed = []

    def state_dict(self) -> dict[str, Any]:
        return {
            "phase": self.phase,
            "observed": [list(times) for times in self.observed],
            "last_move": None if self.last_move is None else list(self.last_move),
            "warned_rank": self.warned_rank,
            "last_plan": list(self.last_plan),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.phase = state.get("phase", _FAST)
        self.observed = [list(times) for times in state.get("observed", [])]
        last_move = state.get("last_move")
        self.last_move = None if last_move is None else list(last_move)
        self.warned_rank = state.get("warned_rank")
        self.last_plan = list(state.get("last_plan", []))
