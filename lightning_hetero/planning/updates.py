"""Batch size scaling by model-update counts (paper 004, Alg. 1)."""

from collections.abc import Sequence
from itertools import repeat
from math import isfinite
from operator import add, attrgetter, is_, le, mul, sub, truediv
from statistics import fmean
from typing import Any

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats, check_inputs
from lightning_hetero.planning.split import (
    balance_efficiency,
    finite_and_positive,
    is_count,
    proportional_split,
)

__all__ = ["UpdatesController"]


class UpdatesController(Controller):
    """Equalise the number of model updates: ranks that update more get larger batches.

    Adaptive SGD (paper 004, Alg. 1) lets ranks claim batches from a shared pool (a
    *mega-batch*) until it is used up, so fast ranks make more updates ``u_k``. After
    each mega-batch, every rank moves by the deviation of its count from the mean:

    ``b_k' = b_k + beta * (u_k - mean(u))``,

    a move that is applied only when ``b_k'`` stays within the rank's bounds (otherwise
    ``b_k`` stays). The learning rate follows the linear scaling rule: rank ``k``'s
    factor ``b_k' / b_k`` is in ``lr_factors`` after each update, for the modes that
    scale the learning rate per rank.

    **Update counts.** When every rank reports ``updates`` in its
    [`RankStats`][lightning_hetero.planning.updates.RankStats]
    (asynchronous and local-SGD modes), those are ``u_k``. In lock-step modes they are
    ``None``, and ``u_k`` is derived from the compute times as the *expected* count a
    dynamic schedule would give in the same wall time: the pool of ``megabatch_size``
    samples lasts ``T = megabatch_size / sum_j X_j`` at the combined throughput
    ``X_j = b_j / t_j``, in which rank ``k`` makes ``u_k = T / t_k`` updates (real-valued:
    ``sum_k b_k u_k`` is the pool). The mean then sits near ``megabatch_size / B``.

    **Keeping the global batch.** Without rejected moves the deviations sum to zero, and
    so do the moves; rounding and rejected moves break that. The moved plan is therefore
    renormalised the way
    [`ProportionalController`][lightning_hetero.planning.ProportionalController] renormalises its
    target: scaled by
    a common factor to sum to ``B``, clipped to the bounds (the surplus goes to the ranks
    with room, in proportion to their size), then rounded by largest fractional part
    (ties to the lower rank), so the result sums to ``B`` exactly and every rank computes
    the same plan.

    **Choosing beta.** A rank whose batch is off its balanced size ``b*_k`` by ``e_k``
    runs ``e_k / b*_k`` (relative) too long, so its count is off by about that fraction of
    ``mean(u)`` and the rule moves it back by ``beta * mean(u) * e_k / b*_k``: a gain of
    ``beta * mean(u) / b*_k`` per update, largest on the smallest rank, oscillating above
    2. A fixed ``beta`` (the paper sets it empirically, to half its minimum batch size) thus
    suits one batch scale and one count scale only. The default, ``beta=None``, takes
    ``beta = mean(b) / (2 * mean(u))`` at each update, a gain of ``mean(b) / (2 * b*_k)``:
    0.5 on a rank of average size, stable for ranks down to a quarter of it, whatever the
    global batch, the mega-batch or the length of the interval the counts cover. On the
    four-rank scenarios (``B = 256``) it is about 3.2 near balance.

    Args:
        beta: samples moved per update of deviation from the mean, ``> 0``; ``None`` scales
            it to the batch and count sizes as above.
        megabatch_size: samples in one mega-batch for derived counts; ``None`` means ten
            global batches. It matters only with a fixed ``beta`` (the gain depends on
            ``beta * megabatch_size``).
        deadband: keep the plan while the measured balance efficiency is at least
            ``1 - deadband``. (Unlike the proportional controller, moves are not also required
            to exceed ``deadband * b_k``: this rule closes the gap in shrinking steps, which
            would stop short.) Paper 004 has none (``0.0``, the default here);
            ``HeteroStrategy(controller="updates")`` passes its own ``deadband`` (0.05), which
            stops the small moves timing noise causes at nearly every boundary.

    Example:
        >>> from lightning_hetero.planning import BatchLimits
        >>> ctl = UpdatesController()
        >>> ctl.update([64, 64], [2.0, 1.0], BatchLimits.build(2, 128))
        [53, 75]
        >>> [round(u, 2) for u in ctl.last_updates], [round(f, 3) for f in ctl.lr_factors]
        ([6.67, 13.33], [0.828, 1.172])
    """

    name = "updates"
    replicable = True

    def __init__(
        self, beta: float | None = None, megabatch_size: int | None = None, deadband: float = 0.0
    ) -> None:
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"`deadband` must be in [0, 1), got {deadband}.")
        if beta is not None and (
            isinstance(beta, bool)
            or not isinstance(beta, (int, float))
            or not isfinite(beta)
            or beta <= 0
        ):
            raise ValueError(f"`beta` must be a finite number > 0 or None, got {beta!r}.")
        if megabatch_size is not None and not is_count(megabatch_size):
            raise ValueError(
                f"`megabatch_size` must be a positive integer or None, got {megabatch_size!r}."
            )
        self.beta = None if beta is None else float(beta)
        self.megabatch_size = megabatch_size
        self.deadband = deadband
        #: Learning-rate factor ``b_new / b_old`` of each rank from the latest update.
        self.lr_factors: list[float] = []
        #: Update counts the latest update used (reported or derived).
        self.last_updates: list[float] = []

    def update_counts(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[float]:
        """Update counts ``u_k``: reported by every rank, else derived from compute times.

        Args:
            batch_sizes: the plan in force.
            compute_s: each rank's compute time per step at that plan, seconds.
            limits: the global batch (sets the default mega-batch).
            stats: side readings; used when every rank reports ``updates``.

        Example:
            >>> from lightning_hetero.planning import BatchLimits
            >>> ctl = UpdatesController(megabatch_size=300)
            >>> ctl.update_counts([10, 20], [1.0, 1.0], BatchLimits.build(2, 30))
            [10.0, 10.0]
        """
        counts = None if stats is None else list(map(attrgetter("updates"), stats))
        if counts is not None and not any(map(is_, counts, repeat(None))):
            reported = list(map(float, counts))
            if not finite_and_positive(reported, zero_ok=True):
                raise ValueError(f"Update counts must be finite and >= 0, got {reported}.")
            return reported
        pool = self.megabatch_size or 10 * limits.global_batch_size
        samples_per_s = sum(map(truediv, batch_sizes, compute_s))
        pool_s = pool / samples_per_s
        return list(map(truediv, repeat(pool_s), compute_s))

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        current, compute_s, stats = check_inputs(batch_sizes, compute_s, limits, stats)
        updates = self.update_counts(current, compute_s, limits, stats)
        mean_updates = fmean(updates)
        if self.beta is not None:
            beta = self.beta
        elif mean_updates > 0:
            beta = fmean(current) / (2.0 * mean_updates)
        else:
            beta = 0.0  # no rank made an update: nothing to equalise
        lower, upper = limits.min_batch_size, limits.max_batch_size
        balanced = balance_efficiency(current, compute_s) >= 1.0 - self.deadband
        if self.deadband > 0 and balanced and limits.admits(current):
            plan = current  # balanced within the dead-band: keep the plan
        else:
            # b + beta * (u - mean(u)) (paper 004, Alg. 1, lines 3-8); a move out of bounds
            # is not made
            deviations = map(sub, updates, repeat(mean_updates))
            targets = list(map(add, current, map(mul, repeat(beta), deviations)))
            if all(map(le, lower, targets)) and all(map(le, targets, upper)):
                moved = targets
            else:
                moved = [
                    t if lo <= t <= hi else float(b)
                    for t, b, lo, hi in zip(targets, current, lower, upper)
                ]
            plan = proportional_split(moved, limits.global_batch_size, lower, upper)
        self.last_updates = updates
        self.lr_factors = list(map(truediv, plan, current))
        return plan

    def state_dict(self) -> dict[str, Any]:
        return {"lr_factors": list(self.lr_factors), "last_updates": list(self.last_updates)}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.lr_factors = list(state.get("lr_factors", []))
        self.last_updates = list(state.get("last_updates", []))
