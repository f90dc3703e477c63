"""Dual batch size learning (paper 003): plan a large and a small batch for equal epoch times.

Most workers train with a large batch ``B_L`` and ``n_S`` workers with a small batch
``B_S``; small batches generalize better but process fewer samples per second. The plan
gives each worker a share of the epoch's data such that every worker needs the same time,
``k`` times an epoch in which every worker uses ``B_L``:

- time per batch is linear, ``t(x) = a*x + b``, so one epoch of ``s`` samples at batch
  ``x`` takes ``(a + b/x) * s`` seconds;
- large-batch workers take ``d_L = k*d/n`` samples; the small-batch workers share the rest,
  ``d_S = (d - n_L*d_L) / n_S``;
- ``B_S`` makes ``(a + b/B_S) * d_S`` equal ``(a + b/B_L) * d_L`` (the paper's Eq. 8):
  ``B_S = b / ((a + b/B_L) * d_L/d_S - a)``;
- on the parameter server each small-batch worker's update is scaled by the model-update
  factor ``d_S/d_L`` (or its square root), in whole samples: the paper's rule
  (``update_factor="ratio"``). The default, ``"share"``, scales every worker's update by its
  batch share ``b_k / (n * B_L)`` of DDP's global batch instead (the strategy applies its
  ``lr_scaling`` rule to it, as in async mode: by default the share itself for SGD and the
  measured-noise rule for adaptive optimizers), so that each push moves the model as far as
  its part of one DDP step.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from typing import Any, Literal

from lightning_hetero.planning.memory import least_squares_line
from lightning_hetero.planning.split import PlanError, is_count
from lightning_hetero.planning.static import StaticController

__all__ = [
    "DualBatchController",
    "DualBatchError",
    "DualBatchPlan",
    "TimeModel",
    "plan_dual_batch",
    "plan_dual_batch_by_speed",
    "push_floor",
]

_FACTOR_RULES = ("share", "ratio", "sqrt", "none")


class DualBatchError(PlanError):
    """Inputs for which no dual batch plan exists; the message says which bound failed."""


@dataclass(frozen=True)
class TimeModel:
    """Time of one training step as a linear function of the batch size: ``a*x + b``.

    Args:
        a: seconds per sample.
        b: seconds per step that do not depend on the batch size.
        relative_error: the largest ``|predicted - measured| / measured`` over the samples
            of the fit (0 when built by hand).
        samples: the ``(batch_size, seconds)`` pairs of the fit.

    Example:
        >>> model = TimeModel.fit([(10, 0.2), (20, 0.3), (40, 0.5)])
        >>> round(model.a, 6), round(model.b, 6), model.relative_error < 1e-9
        (0.01, 0.1, True)
        >>> round(model.epoch_time(batch_size=20, samples=1000), 6)
        15.0
    """

    a: float
    b: float
    relative_error: float = 0.0
    samples: tuple[tuple[int, float], ...] = ()

    def __post_init__(self) -> None:
        if not (math.isfinite(self.a) and math.isfinite(self.b)):
            raise ValueError(f"Time model coefficients must be finite, got a={self.a}, b={self.b}.")
        if self.a < 0 or self.b < 0 or self.a + self.b == 0:
            raise ValueError(
                f"A time model needs a >= 0 and b >= 0, not both 0; got a={self.a}, b={self.b}."
            )

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float]]) -> "TimeModel":
        """Line through timed ``(batch_size, seconds)`` pairs, least squares in relative error.

        Relative error is what the fit is judged by (paper 003's Table IV): a step of a few
        milliseconds counts as much as a long one, which keeps the per-step time ``b`` (set
        by the small batches) from being swamped by the largest. A negative intercept or
        slope (noise around a flat or proportional curve) is set to 0; the reported error is
        that of the clipped line.

        Raises:
            PlanError: fewer than two distinct batch sizes, a size below 1, or a time that is
                not finite and positive.
        """
        pairs = tuple((int(x), float(t)) for x, t in samples)
        if not all(math.isfinite(t) and t > 0 for _, t in pairs):
            raise PlanError(f"Step times must be finite and > 0, got {[t for _, t in pairs]}.")
        intercept, slope = least_squares_line(pairs, "step time", relative=True)
        if slope <= 0:  # time does not grow with the batch: all of it is per-step cost
            slope, intercept = 0.0, sum(t for _, t in pairs) / len(pairs)
        intercept = max(intercept, 0.0)
        error = max(abs(slope * x + intercept - t) / t for x, t in pairs)
        return cls(slope, intercept, error, pairs)

    def predict(self, batch_size: float) -> float:
        """Seconds of one step at ``batch_size``."""
        return self.a * batch_size + self.b

    def epoch_time(self, batch_size: float, samples: float) -> float:
        """Seconds to train ``samples`` samples in batches of ``batch_size`` (Eq. 3)."""
        return (self.a + self.b / batch_size) * samples

    def scaled(self, per_sample: float) -> "TimeModel":
        """The model for inputs ``per_sample`` times as large: ``a`` scales, ``b`` stays."""
        if not (math.isfinite(per_sample) and per_sample > 0):
            raise ValueError(f"`per_sample` must be finite and > 0, got {per_sample}.")
        return replace(self, a=self.a * per_sample)


@dataclass(frozen=True)
class DualBatchPlan:
    """A dual batch plan; ranks ``0..n_L-1`` use ``B_L``, the last ``n_S`` ranks ``B_S``
    (or, planned by speed, the ranks in ``small_ranks``).

    ``large_samples`` and ``small_samples`` are the exact ``d_L`` and ``d_S`` (planned by
    speed: the means over each group, ``rank_samples`` each rank's own); ``samples`` rounds
    them to integers that sum to the dataset size.
    """

    time_model: TimeModel
    dataset_size: int
    world_size: int
    small_workers: int
    extra_time_ratio: float
    large_batch_size: int
    small_batch_size: int | None
    large_samples: float
    small_samples: float
    update_factor: float
    factor_rule: str
    #: Planned by speed: the ranks with ``B_S`` (the slowest), each rank's exact samples and
    #: its own time model (empty for paper 003's plan of one time model).
    small_ranks: tuple[int, ...] = ()
    rank_samples: tuple[float, ...] = ()
    rank_models: tuple[TimeModel, ...] = ()

    @property
    def large_workers(self) -> int:
        return self.world_size - self.small_workers

    def is_small(self, rank: int) -> bool:
        """Whether ``rank`` trains with ``B_S``."""
        if self.rank_models:
            return rank in self.small_ranks
        return rank >= self.large_workers

    def _per_rank(self, large: Any, small: Any) -> list[Any]:
        return [small if self.is_small(k) else large for k in range(self.world_size)]

    @property
    def batch_sizes(self) -> list[int]:
        """Batch size of each rank."""
        return self._per_rank(self.large_batch_size, self.small_batch_size)

    @property
    def samples(self) -> list[int]:
        """Samples each rank trains on per epoch; they sum to the dataset size exactly.

        Floors first, then one more sample for the ranks with the largest remainders
        (the lower rank first on ties), so every rank computes the same split.
        """
        exact = list(self.rank_samples) or self._per_rank(self.large_samples, self.small_samples)
        counts = [math.floor(s) for s in exact]
        left = self.dataset_size - sum(counts)
        order = sorted(range(len(exact)), key=lambda k: (-(exact[k] - counts[k]), k))
        for rank in order[:left]:
            counts[rank] += 1
        return counts

    @property
    def update_factors(self) -> list[float]:
        """The model-update factor of each rank: 1 for the large-batch ranks and
        ``update_factor`` for the small ones (paper 003), or with ``factor_rule="share"``
        each rank's batch share ``b_k / (n * B_L)`` of DDP's global batch."""
        if self.factor_rule == "share":
            return [b / (self.world_size * self.large_batch_size) for b in self.batch_sizes]
        return self._per_rank(1.0, self.update_factor)

    @property
    def steps(self) -> list[int]:
        """Steps per epoch of each rank (its last batch may be short)."""
        return [math.ceil(s / b) for s, b in zip(self.samples, self.batch_sizes)]

    @property
    def predicted_epoch_times(self) -> list[float]:
        """Each rank's epoch time by the time model (Eq. 3)."""
        models = self.rank_models or [self.time_model] * self.world_size
        return [m.epoch_time(b, s) for m, b, s in zip(models, self.batch_sizes, self.samples)]

    @property
    def ddp_epoch_time(self) -> float:
        """An epoch of DDP by the time model(s): ``d / (n B_L)`` steps of ``B_L`` samples on
        every rank, each as long as the slowest rank's."""
        models = self.rank_models or [self.time_model]
        large = self.large_batch_size
        steps = self.dataset_size / (self.world_size * large)
        return steps * max(m.predict(large) for m in models)

    def rescaled(self, large_batch_size: int, time_model: TimeModel) -> "DualBatchPlan":
        """The same data split with another ``B_L`` and time model (``B_S`` planned again).

        The hybrid scheme uses one per input resolution. Planned by speed, every rank's time
        model is scaled as ``time_model`` is from this plan's, each rank keeps its samples, and
        ``B_S`` is the smallest batch at which every small rank ends its share no later than
        the last large rank, and no smaller than ``push_floor``.
        """
        if self.rank_models:
            scale = time_model.a / self.time_model.a if self.time_model.a > 0 else 1.0
            return self._rescaled_by_speed(
                large_batch_size, tuple(m.scaled(scale) for m in self.rank_models)
            )
        return plan_dual_batch(
            time_model,
            self.dataset_size,
            self.world_size,
            self.small_workers,
            large_batch_size,
            self.extra_time_ratio,
            self.factor_rule,
        )

    def _rescaled_by_speed(self, large: int, models: tuple[TimeModel, ...]) -> "DualBatchPlan":
        large = _check_count("large_batch_size", large, 2)
        shares = self.samples
        small_ranks = [r for r in range(self.world_size) if self.is_small(r)]
        large_ranks = [r for r in range(self.world_size) if not self.is_small(r)]
        slowest = max(models, key=lambda m: m.predict(large))
        if not small_ranks:
            return replace(
                self, time_model=slowest, large_batch_size=large, rank_models=models,
                update_factor=1 / self.world_size if self.factor_rule == "share" else 1.0,
            )  # fmt: skip
        ranks = large_ranks or small_ranks  # all small: B_L's epoch is the reference
        deadline = max(models[r].epoch_time(large, shares[r]) for r in ranks)
        low, high = push_floor(models, small_ranks, large_ranks, large), large
        while low < high:
            mid = (low + high) // 2
            if all(models[r].epoch_time(mid, shares[r]) <= deadline for r in small_ranks):
                high = mid
            else:
                low = mid + 1
        factor = low / (self.world_size * large) if self.factor_rule == "share" else None
        return replace(
            self, time_model=slowest, large_batch_size=large, small_batch_size=low,
            rank_models=models,
            update_factor=self.update_factor if factor is None else factor,
        )  # fmt: skip

    def table(self) -> str:
        """The plan as a fixed-width table, one row per rank, and the time model."""
        header = ("rank", "batch", "samples/epoch", "steps", "update factor", "predicted s")
        rows = [header]
        for rank, (b, s, n, f, t) in enumerate(
            zip(
                self.batch_sizes,
                self.samples,
                self.steps,
                self.update_factors,
                self.predicted_epoch_times,
            )
        ):
            role = "small" if self.is_small(rank) else "large"
            rows.append((f"{rank} ({role})", str(b), str(s), str(n), f"{f:.3f}", f"{t:.3g}"))
        widths = [max(len(row[i]) for row in rows) for i in range(len(header))]
        lines = ["  ".join(cell.rjust(w) for cell, w in zip(row, widths)) for row in rows]
        model = self.time_model
        lines.append(
            f"k = {self.extra_time_ratio:g}, d_L = {self.large_samples:.1f},"
            f" d_S = {self.small_samples:.1f}; time per step = {model.a:.3g} s * batch"
            f" + {model.b:.3g} s (fit error {model.relative_error:.1%})"
        )
        if self.rank_models:
            lines[-1] += (
                "; planned by speed (the slowest rank's fit shown): predicted epoch"
                f" {max(self.predicted_epoch_times):.3g} s against DDP's"
                f" {self.ddp_epoch_time:.3g} s"
            )
            small = self.small_ranks
            large = [r for r in range(self.world_size) if r not in small]
            floor = push_floor(self.rank_models, small, large, self.large_batch_size)
            if small and large and self.small_batch_size == floor < self.large_batch_size:
                lines.append(
                    f"B_S = {floor} is the push floor: below it the small ranks would push more"
                    " often than the large ones"
                )
        if self.factor_rule == "share":
            lines.append(
                "update factor: batch share b_k / (n * B_L) of DDP's step; the learning rate"
                " follows lr_scaling's rule of it (by default linear for SGD, measured noise for"
                " adaptive optimizers)"
            )
        return "\n".join(lines)

    def __str__(self) -> str:
        return self.table()


def _round_down(value: float) -> float:
    """``value`` cut to 6 decimals, so that a suggested largest ``k`` is itself feasible."""
    return math.floor(value * 1e6) / 1e6


def _check_count(name: str, value: Any, low: int) -> int:
    if not is_count(value, low):
        raise DualBatchError(f"`{name}` must be an integer >= {low}, got {value!r}.")
    return value


def _check_ratio(extra_time_ratio: float) -> float:
    k = float(extra_time_ratio)
    if not (math.isfinite(k) and k > 1):
        raise DualBatchError(
            f"The extra-time ratio k must be > 1 (k = 1 is the all-B_L baseline), got {k}."
        )
    return k


def _check_rule(update_factor: str) -> None:
    if update_factor not in _FACTOR_RULES:
        raise DualBatchError(
            f"Unknown update_factor {update_factor!r}; expected one of {list(_FACTOR_RULES)}."
        )


def _check_plan_arguments(
    d: int,
    n: int,
    large_batch_size: int,
    small_workers: int,
    extra_time_ratio: float,
    update_factor: str,
) -> tuple[int, float]:
    """The checks both planners share; returns the large batch size and the time ratio."""
    large = _check_count("large_batch_size", large_batch_size, 2)
    if isinstance(small_workers, bool) or not isinstance(small_workers, int):
        raise DualBatchError(f"`small_workers` must be an integer, got {small_workers!r}.")
    if not 0 <= small_workers <= n:
        raise DualBatchError(
            f"`small_workers` must be in [0, {n}] (the number of workers), got {small_workers}."
        )
    k = _check_ratio(extra_time_ratio)
    _check_rule(update_factor)
    if d < n:
        raise DualBatchError(f"{n} workers need at least {n} samples, got {d}.")
    return large, k


def plan_dual_batch(
    time_model: TimeModel,
    dataset_size: int,
    world_size: int,
    small_workers: int,
    large_batch_size: int,
    extra_time_ratio: float,
    update_factor: str = "ratio",
) -> DualBatchPlan:
    """Plan dual batch size learning (paper 003, Eqs. 4-8).

    Args:
        time_model: per-step time against batch size, e.g.
            [`TimeModel.fit`][lightning_hetero.planning.dual.TimeModel.fit].
        dataset_size: ``d``, training samples per epoch.
        world_size: ``n``, workers.
        small_workers: ``n_S`` in ``[0, n]``; ``0`` plans the all-``B_L`` baseline
            (``d/n`` samples each; ``k`` is checked but not used).
        large_batch_size: ``B_L``.
        extra_time_ratio: ``k > 1``.
        update_factor: the small workers' model-update factor: ``"ratio"`` (``d_S/d_L``),
            ``"sqrt"`` (its square root) or ``"none"`` (1). With ``n_S = n`` there is no
            large-batch update to match, and the factor is 1 whatever the rule.
            ``"share"``: every rank's factor is its batch share ``b_k / (n * B_L)``
            ([`DualBatchPlan.update_factors`][lightning_hetero.planning.dual.DualBatchPlan.update_factors];
            ``update_factor`` holds the small ranks').

    Raises:
        DualBatchError: infeasible inputs; the message names the bound that failed and
            the largest ``k`` or smallest ``B_L`` that would work.

    Example:
        >>> plan = plan_dual_batch(TimeModel(a=1.0, b=24.66), 50000, 4, 1, 500, 1.1)
        >>> plan.batch_sizes, plan.samples, round(plan.update_factor, 3)
        ([500, 500, 500, 38], [13750, 13750, 13750, 8750], 0.636)
    """
    d = _check_count("dataset_size", dataset_size, 1)
    n = _check_count("world_size", world_size, 1)
    large, k = _check_plan_arguments(
        d, n, large_batch_size, small_workers, extra_time_ratio, update_factor
    )
    n_small, n_large = small_workers, n - small_workers
    a, b = time_model.a, time_model.b
    if n_small == 0:
        factor = 1 / n if update_factor == "share" else 1.0
        return DualBatchPlan(time_model, d, n, 0, k, large, None, d / n, 0.0, factor, update_factor)
    d_large = round(k * d / n, 9)  # no float noise in the floors of the sample counts
    d_small = round((d - n_large * d_large) / n_small, 9)
    if d_small < 1:
        k_max = _round_down((d - n_small) * n / (n_large * d))
        raise DualBatchError(
            f"With k = {k:g}, the {n_large} large-batch workers take {n_large * d_large:.0f}"
            f" of the {d} samples, leaving d_S = {d_small:.1f} (< 1) for each small-batch"
            f" worker. The largest k that leaves each at least one sample is {k_max}."
        )
    ratio = d_large / d_small
    raw = b / ((a + b / large) * ratio - a) if b > 0 else 0.0
    small = math.floor(raw + 0.5)
    if small < 1:
        # B_S >= 1 needs raw >= 1/2, i.e. ratio <= r_max; ratio grows with k.
        r_max = (2 * b + a) / (a + b / large)
        hints = []
        if b > 0 and r_max > 1:
            k_max = _round_down(r_max * n / (n_small + r_max * n_large))
            hints.append(f"the largest k that gives B_S >= 1 is {k_max}")
        room = (2 * b + a) / ratio - a
        if b > 0 and room > 0:
            hints.append(f"the smallest B_L that does at k = {k:g} is {math.ceil(b / room)}")
        raise DualBatchError(
            f"No positive small batch: Eq. 8 gives B_S = {raw:.3g} for k = {k:g}, B_L = {large},"
            f" a = {a:.3g} s/sample, b = {b:.3g} s/step"
            + (
                f"; {' and '.join(hints)}."
                if hints
                else "; the per-step time b is too small"
                " for any k: a small batch costs no more per sample than the large one."
            )
        )
    small = min(small, large - 1)
    if update_factor == "share":
        factor = small / (n * large)
    elif n_large == 0:
        factor = 1.0  # no large-batch update to match (paper 003 Table III: "-")
    else:
        share = math.floor(d_small) / math.floor(d_large)  # in whole samples, as the paper
        factor = {"ratio": share, "sqrt": math.sqrt(share), "none": 1.0}[update_factor]
    return DualBatchPlan(
        time_model, d, n, n_small, k, large, small, d_large, d_small, factor, update_factor
    )


def _rate(model: TimeModel, batch_size: int) -> float:
    """Samples per second at ``batch_size``."""
    return batch_size / model.predict(batch_size)


def plan_dual_batch_by_speed(
    rank_models: Sequence[TimeModel],
    dataset_size: int,
    small_workers: int,
    large_batch_size: int,
    extra_time_ratio: float,
    update_factor: str = "share",
) -> DualBatchPlan:
    """Plan dual batch size learning on ranks of different speeds, one time model each.

    The ``small_workers`` slowest ranks (by their step time at ``B_L``; ranks within 10% of
    the fastest count as equally fast, and among equals the higher rank is taken) get ``B_S``,
    the others ``B_L``, and every rank a share of the epoch that it trains in the same time
    ``T``:

    - ``T_prop = d / sum_k r_k(B_L)``, the epoch with ``B_L`` everywhere and shares in
      proportion to speed (``r_k(x) = x / t_k(x)`` samples per second);
      ``T_DDP = d / (n B_L) * max_k t_k(B_L)``, DDP's epoch;
    - the target is ``min(k * T_prop, T_DDP)``: paper 003's extra time ``k``, but never an
      epoch slower than DDP's by the models (at equal speeds ``T_prop = T_DDP``, no room for
      a smaller batch, and ``B_S = B_L``);
    - the large ranks train ``T * r_k(B_L)`` samples; ``B_S`` is the smallest batch at which
      the small ranks train the rest in ``T``, but no smaller than the batch at which the
      slowest small rank's step takes as long as the slowest large rank's step at ``B_L``
      (``push_floor``): the small ranks never push more often than the large ones; then
      every share is set so that all ranks end together at ``T' = d / sum_k r_k(b_k) <= T``.

    Why the floor: in asynchronous training every push is one optimizer step, and an
    adaptive optimizer (Adam) folds each push into its running moments with the same
    weight whatever its batch. Where per-step costs are small next to per-sample ones, the
    extra time alone would pick a tiny ``B_S`` (3 samples against ``B_L = 64`` on a 3x
    slower rank, measured) whose pushes outnumber the large ones five to one and steer the
    moments: the reverse-digits transformer with Adam ended 16 points below DDP's accuracy.

    ``update_factor`` as in [`plan_dual_batch`][lightning_hetero.planning.dual.plan_dual_batch]
    (``"ratio"``: the mean small share over the mean large one).

    Example:
        >>> fast, slow = TimeModel(a=1.0, b=8.0), TimeModel(a=3.0, b=24.0)
        >>> plan = plan_dual_batch_by_speed([slow, fast], 1000, 1, 32, 1.05)
        >>> plan.batch_sizes, plan.samples
        ([15, 32], [214, 786])
        >>> round(max(plan.predicted_epoch_times)), round(plan.ddp_epoch_time)
        (984, 1875)
    """
    models = tuple(rank_models)
    n = _check_count("world_size", len(models), 1)
    d = _check_count("dataset_size", dataset_size, 1)
    large, k = _check_plan_arguments(
        d, n, large_batch_size, small_workers, extra_time_ratio, update_factor
    )
    # slowest first; ranks within 10% of the fastest count as equally fast (timing noise),
    # and among those the last ranks come first, as in paper 003's plan
    fastest = min(m.predict(large) for m in models)
    step = [max(m.predict(large), 1.1 * fastest) for m in models]
    slowest_first = sorted(range(n), key=lambda r: (-step[r], -r))
    small_ranks = tuple(sorted(slowest_first[:small_workers]))
    large_ranks = [r for r in range(n) if r not in small_ranks]
    rates_large = [_rate(m, large) for m in models]
    t_prop = d / sum(rates_large)
    t_ddp = d / (n * large) * max(m.predict(large) for m in models)
    target = min(k * t_prop, t_ddp)
    small = large
    if small_ranks:
        rest = d - target * sum(rates_large[r] for r in large_ranks)
        if all(models[r].b == 0 for r in small_ranks):
            raise DualBatchError(
                "No small batch pays off: the small ranks' per-step time b is 0, so a small"
                " batch costs no more per sample than the large one."
            )
        low, high = push_floor(models, small_ranks, large_ranks, large), large
        while low < high:
            mid = (low + high) // 2
            if target * sum(_rate(models[r], mid) for r in small_ranks) >= rest:
                high = mid
            else:
                low = mid + 1
        small = low
    sizes = [small if r in small_ranks else large for r in range(n)]
    rates = [_rate(m, b) for m, b in zip(models, sizes)]
    finish = d / sum(rates)
    exact = tuple(round(finish * rate, 9) for rate in rates)
    mean_large = sum(exact[r] for r in large_ranks) / len(large_ranks) if large_ranks else 0.0
    mean_small = sum(exact[r] for r in small_ranks) / len(small_ranks) if small_ranks else 0.0
    if update_factor == "share":
        factor = (small if small_ranks else large) / (n * large)
    elif not large_ranks or not small_ranks:
        factor = 1.0
    else:
        share = math.floor(mean_small) / max(math.floor(mean_large), 1)
        factor = {"ratio": share, "sqrt": math.sqrt(share), "none": 1.0}[update_factor]
    slowest = models[slowest_first[0]]
    return DualBatchPlan(
        slowest, d, n, len(small_ranks), k, large, small if small_ranks else None,
        mean_large, mean_small, factor, update_factor, small_ranks, exact, models,
    )  # fmt: skip


def push_floor(
    models: Sequence[TimeModel],
    small_ranks: Sequence[int],
    large_ranks: Sequence[int],
    large_batch_size: int,
) -> int:
    """The smallest ``B_S`` at which the slowest small rank's step takes at least as long as
    the slowest large rank's step at ``B_L`` (so it pushes no more often), at most ``B_L``;
    1 where every rank is small.

    Example:
        >>> fast, slow = TimeModel(a=1.0, b=4.0), TimeModel(a=3.0, b=4.0)
        >>> push_floor([fast, slow], [1], [0], 64)  # 3 * 22 + 4 >= 64 + 4
        22
    """
    if not large_ranks or not small_ranks:
        return 1
    step = max(models[r].predict(large_batch_size) for r in large_ranks)
    slowest = max(small_ranks, key=lambda r: models[r].predict(large_batch_size))
    low, high = 1, large_batch_size
    while low < high:
        mid = (low + high) // 2
        if models[slowest].predict(mid) >= step:
            high = mid
        else:
            low = mid + 1
    return low


class DualBatchController(StaticController):
    """Dual batch size learning (paper 003) for ``HeteroStrategy(mode="async")``.

    The strategy times probe batches, plans with
    [`plan_dual_batch`][lightning_hetero.planning.dual.plan_dual_batch] and runs the plan;
    the plan then stays fixed while training (``update`` keeps it).

    Args:
        extra_time_ratio: ``k > 1``, the epoch time allowed relative to every worker
            using ``B_L``.
        small_workers: ``n_S``, workers with the small batch (the slowest by the time
            probe, each rank timed on its own:
            [`plan_dual_batch_by_speed`][lightning_hetero.planning.dual.plan_dual_batch_by_speed],
            whose epoch is never longer than DDP's by the fits and whose small ranks never
            push more often than the large ones, ``push_floor``); ``None``: half of them,
            rounded down, at least one.
        large_batch_size: ``B_L``; ``None``: the strategy's smallest per-rank maximum
            (``max_batch_size``, measured with ``"auto"``), else the loader's batch size.
        update_factor: ``"share"`` (default): each push moves its batch share of one DDP step,
            ``lr_scaling``'s rule of ``b_k / (n * B_L)`` (``"auto"``: as in async mode,
            linear for SGD, the measured-noise rule for adaptive optimizers); the paper's
            rules, which leave the large-batch pushes at the full learning rate:
            ``"ratio"`` (small pushes by ``d_S/d_L``, the paper's choice), ``"sqrt"`` or
            ``"none"``.
    """

    name = "dual"

    def __init__(
        self,
        extra_time_ratio: float = 1.05,
        small_workers: int | None = None,
        large_batch_size: int | None = None,
        update_factor: Literal["share", "ratio", "sqrt", "none"] = "share",
    ) -> None:
        self.extra_time_ratio = _check_ratio(extra_time_ratio)
        if small_workers is not None:
            _check_count("small_workers", small_workers, 0)
        if large_batch_size is not None:
            _check_count("large_batch_size", large_batch_size, 2)
        _check_rule(update_factor)
        self.small_workers = small_workers
        self.large_batch_size = large_batch_size
        self.update_factor = update_factor

    def resolve_small_workers(self, world_size: int) -> int:
        """``small_workers`` for ``world_size`` workers (default: half, at least one)."""
        small = self.small_workers
        if small is None:
            small = max(world_size // 2, 1) if world_size > 1 else 0
        if small > world_size:
            raise DualBatchError(
                f"`small_workers` is {small} but there are only {world_size} workers."
            )
        return small
