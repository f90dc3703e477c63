"""Per-rank statistics of step timings between two plan changes."""

from bisect import bisect_left, insort
from collections import deque
from collections.abc import Iterable, Iterator, Sequence
from dataclasses import dataclass
from math import hypot, inf, isfinite, nan, sqrt
from statistics import fmean, median

__all__ = ["TimingSmoother", "micro_batch_centre", "robust_centre"]

#: Steps a new stretch of readings must hold before it is compared with the steps before it.
_BLOCK = 16
#: Relative change of a rank's median compute time that restarts its statistics (with ``z``
#: standard errors of the difference): a speed change at the same batch size.
_SPEED_CHANGE = 0.05
_Z = 3.0
#: Steps the spread behind ``compute_se`` is read from (the latest ones).
_SPREAD_STEPS = 256
#: ``sqrt(pi / 2) * 1.4826``: standard error of a median from the median absolute deviation
#: (``1.4826 * MAD`` estimates a normal spread; a median's error is ``sqrt(pi / 2)`` times a
#: mean's), so that stalls in a few steps widen it no more than they move the median.
_MEDIAN_SE = 1.8582


def robust_centre(values: list[float]) -> tuple[float, float]:
    """The median of ``values`` and its standard error (``nan`` below two values): from the
    median absolute deviation, or half the interquartile range where that is larger (steps
    in two clusters).

    Example:
        >>> centre, se = robust_centre([1.0, 1.1, 0.9, 1.0, 9.0])  # one stall moves neither
        >>> centre, round(se, 3)
        (1.0, 0.083)
    """
    return _sorted_centre(sorted(values))


def _sorted_centre(ordered: Sequence[float]) -> tuple[float, float]:
    """``robust_centre`` of values already in ascending order."""
    n = len(ordered)
    if n < 2:
        return (ordered[0] if ordered else nan), nan
    centre = _sorted_median(ordered)
    return centre, _MEDIAN_SE * _sorted_spread(ordered, centre) / sqrt(n)


def _sorted_median(ordered: Sequence[float]) -> float:
    """``statistics.median`` of values already in ascending order."""
    n = len(ordered)
    half = n // 2
    return ordered[half] if n % 2 else (ordered[half - 1] + ordered[half]) / 2


def _spread(values: Sequence[float], centre: float) -> float:
    """The median absolute deviation of ``values`` from ``centre``, or half their
    interquartile range where that is larger."""
    return _sorted_spread(sorted(values), centre)


def _sorted_spread(ordered: Sequence[float], centre: float) -> float:
    """``_spread`` of values already in ascending order: the median absolute deviation by
    a binary search (``_kth_deviation``), not a sort."""
    n, half = len(ordered), len(ordered) // 2
    spread = _kth_deviation(ordered, centre, half)
    if n % 2 == 0:
        spread = (_kth_deviation(ordered, centre, half - 1) + spread) / 2
    # half the interquartile range equals the MAD on symmetric noise; where stalls make the
    # steps two clusters (a third of them slow, say) the MAD sees only the cluster that holds
    # the median and the IQR sees both: the larger says how far the median may be off
    half_iqr = 0.5 * (ordered[(3 * len(ordered)) // 4] - ordered[len(ordered) // 4])
    return max(spread, half_iqr)


class _Window:
    """The latest ``maxlen`` values, in arrival order and sorted: a boundary at every step
    or two reads their median without sorting a thousand of them."""

    def __init__(self, maxlen: int) -> None:
        self._values: deque[float] = deque(maxlen=maxlen)
        self._ordered: list[float] = []

    def __len__(self) -> int:
        return len(self._values)

    def __iter__(self) -> Iterator[float]:
        return iter(self._values)

    def append(self, value: float) -> None:
        if len(self._values) == self._values.maxlen:
            del self._ordered[bisect_left(self._ordered, self._values[0])]
        self._values.append(value)
        insort(self._ordered, value)

    def clear(self) -> None:
        self._values.clear()
        self._ordered.clear()

    def extend(self, values: Iterable[float]) -> None:
        for value in values:
            self.append(value)

    def median(self) -> float:
        return _sorted_median(self._ordered) if self._ordered else nan

    def centre(self) -> tuple[float, float]:
        """``robust_centre`` of the values held, from their sorted copy."""
        return _sorted_centre(self._ordered)


def _kth_deviation(ordered: Sequence[float], centre: float, k: int) -> float:
    """The ``k``-th smallest (from 0) of ``|v - centre|`` over ``ordered`` (ascending).

    The deviations below ``centre``, read from it outward, rise; so do those at or above it:
    the ``k``-th of the two rising runs is found by a binary search on how many come from
    the first (the k-th element of two sorted arrays)."""
    n, m = len(ordered), bisect_left(ordered, centre)

    def below(i: int) -> float:  # the i-th smallest deviation below the centre
        return centre - ordered[m - 1 - i]

    def above(j: int) -> float:  # the j-th smallest at or above it
        return ordered[m + j] - centre

    lo, hi = max(0, k + 1 - (n - m)), min(k + 1, m)
    while lo < hi:  # the fewest taken from below such that the next below is not smaller
        i = (lo + hi) // 2
        if below(i) < above(k - i):
            lo = i + 1
        else:
            hi = i
    i, j = lo, k + 1 - lo
    return max(below(i - 1) if i > 0 else -inf, above(j - 1) if j > 0 else -inf)


def micro_batch_centre(
    steps: Sequence[Sequence[float]], rests: Sequence[float], batch_size: int
) -> tuple[float, float]:
    """A step's compute time from the micro-batches of several steps, and its standard error.

    ``steps``: per step, the seconds per sample of each of its micro-batches; ``rests``: per
    step, its compute time outside them (loading, the optimizer step, the loop). The step
    costs ``batch_size`` times the median seconds per sample over *every* micro-batch, plus
    the median rest. The per-sample median's standard error (``robust_centre``'s, over all
    micro-batches) holds for micro-batches that vary independently; where they vary
    together within a step (a slow stretch of the host spans the step), it is scaled by the
    root of the design effect ``m * s_step^2 / s^2``, within ``[1, m]``: ``m`` micro-batches
    a step, ``s_step`` the spread of the steps' mean per-sample times, ``s`` that of the
    micro-batches (independent micro-batches give ``s_step^2 = s^2 / m``, an effect of 1;
    micro-batches that move together give ``m``, the error of ``m``-fold fewer samples).

    Example:
        >>> steps = [[0.010, 0.011], [0.009, 0.010], [0.010, 0.012], [0.011, 0.009]]
        >>> centre, se = micro_batch_centre(steps, [0.02, 0.02, 0.021, 0.019], batch_size=8)
        >>> round(centre, 4), round(se, 4)
        (0.1, 0.0053)
    """
    values = [v for step in steps for v in step]
    if not values:
        return nan, nan
    per_sample, se = robust_centre(values)
    rest, rest_se = robust_centre(list(rests))
    if len(steps) > 1 and isfinite(se):
        within = _spread(values, per_sample)
        means = [fmean(step) for step in steps]
        between = _spread(means, median(means))
        m = len(values) / len(steps)
        effect = 1.0 if within == 0 else min(m, max(1.0, m * (between / within) ** 2))
        se *= sqrt(effect)
    return batch_size * per_sample + rest, hypot(batch_size * se, rest_se)


def _lower_quartile(values: list[float]) -> tuple[float, float]:
    """The lower quartile of ``values`` and (roughly) its standard error: a median's."""
    return sorted(values)[len(values) // 4], robust_centre(values)[1]


@dataclass
class TimingSmoother:
    """One rank's step times at one batch size: robust statistics over every step since the
    last change.

    ``compute_s`` and ``wait_s`` are medians over all the steps timed since the
    batch size or the plan changed (the latest ``window`` of them at most, so memory stays
    bounded: another rank's change can change this rank's steps too, through shared hosts
    and waiting), and
    ``compute_se`` is the standard error of that median: it shrinks as steps
    accumulate, so the auto dead-band (``noise_deadband``)
    does too, and a few steps that stalled (another job, a page fault, a GC pause) move
    neither the centre nor its error much. Every 16 steps, and at each boundary
    (``mark``), the steps since the last such test are compared with the steps before
    them: a lower quartile that moved by more than 5% and three standard errors is a speed
    change at the same batch size (another job started on the host; stalls, which only
    slow steps, move the lower quartile only when they are most of the steps), and the
    statistics restart from those latest steps.

    The first step after a restart is discarded when later steps arrive: it pays one-off
    costs (allocator growth, DDP bucket rebuilding, cold caches). A step timed only from its
    batch's arrival (``full=False``: an epoch's first, see
    ``StepRecord``) counts only while no fully timed one exists.

    A step run as several micro-batches (``micro``: each one's samples and compute seconds)
    makes each of them a sample: while every step held has them, ``compute_s`` and
    ``compute_se`` come from ``micro_batch_centre`` over the latest 256 steps (their
    micro-batches, and the rest of each step), so a short epoch of few optimizer steps still
    measures its speed from many timings, and a stall in one micro-batch weighs as one
    micro-batch, not a whole step.

    Besides those it keeps the plain mean of the whole step, compute plus waiting
    (``step_s``, the synchronous step time in lock-step modes, stalls included: they are
    wall time the guard must see) with its standard error.

    Example:
        >>> s = TimingSmoother()
        >>> for t in (9.0, 1.0, 3.0, 1.5, 1.0):  # the first step is dropped
        ...     s.update(batch_size=32, compute_s=t, wait_s=0.0)
        >>> s.batch_size, s.compute_s, s.steps
        (32, 1.25, 5)
    """

    window: int = 1024
    batch_size: int = 0
    steps: int = 0
    full_steps: int = 0
    plan: int = 0

    def __post_init__(self) -> None:
        if isinstance(self.window, bool) or not isinstance(self.window, int) or self.window < 2:
            raise ValueError(f"`window` must be an integer >= 2, got {self.window!r}.")
        self.reset()

    def reset(self) -> None:
        """Forget all samples."""
        self.batch_size = self.steps = self.full_steps = self.plan = 0
        self._compute = _Window(self.window)
        self._wait = _Window(self.window)
        self._latest = _Window(_SPREAD_STEPS)  # the latest of ``_compute``, for the spread
        # per step: its micro-batches' seconds per sample (``None``: run as one batch), and
        # its compute outside them
        self._micro: deque[tuple[float, ...] | None] = deque(maxlen=self.window)
        self._rest: deque[float] = deque(maxlen=self.window)
        self._micro_steps = 0  # steps held with micro-batches
        self._block = 0  # steps since the last speed-change test
        self._step = _Moments()

    def update(
        self,
        batch_size: int,
        compute_s: float,
        wait_s: float,
        full: bool = True,
        plan: int = 0,
        micro: Sequence[tuple[int, float]] = (),
    ) -> None:
        """Add one step; a different ``batch_size`` or ``plan`` (a key of the whole plan)
        restarts the statistics. ``full``: the step was timed from the previous step's end
        (its loading included). ``micro``: ``(samples, compute seconds)`` of each of the
        step's micro-batches, where it ran two or more."""
        if batch_size != self.batch_size or plan != self.plan:
            self.reset()
            self.batch_size, self.plan = batch_size, plan
        if not (isfinite(compute_s) and isfinite(wait_s)):
            return
        if not full and self.full_steps:
            return  # a fully timed reading describes the step better
        if full and self.steps and not self.full_steps:
            self.steps = 1  # only partial readings so far: replace them (one-off costs paid)
        self.steps += 1
        self.full_steps += full
        if self.steps <= 2:  # the first step is replaced by the second
            for samples in (self._compute, self._wait, self._micro, self._rest, self._latest):
                samples.clear()
            self._micro_steps = 0
            self._step = _Moments()
            self._block = 0
        if len(self._micro) == self._micro.maxlen and self._micro[0] is not None:
            self._micro_steps -= 1  # the oldest step leaves the window
        per_sample = _per_sample(micro)
        self._micro_steps += per_sample is not None
        self._compute.append(compute_s)
        self._latest.append(compute_s)
        self._wait.append(wait_s)
        self._micro.append(per_sample)
        self._rest.append(compute_s - sum(t for _, t in micro) if per_sample else nan)
        self._step.add(compute_s + wait_s)
        self._block += 1
        if self._block >= _BLOCK:
            self._restart_on_speed_change()

    def mark(self) -> None:
        """A boundary: test the steps since the last test for a speed change now (if they
        are at least half a block), so that a change between two boundaries shows at the
        second."""
        if 2 * self._block >= _BLOCK:
            self._restart_on_speed_change()

    def _restart_on_speed_change(self) -> None:
        """Keep only the latest steps (since the last test) when their median differs from
        the earlier steps' beyond their noise and ``_SPEED_CHANGE``."""
        latest_n, self._block = self._block, 0
        held = list(self._compute)
        if latest_n < 2 or len(held) - latest_n < latest_n:
            return
        # lower quartiles: a speed change moves every quantile, stalls (slow steps only) move
        # the lower quartile only when they are most of the steps
        before, before_se = _lower_quartile(held[:-latest_n])
        latest, latest_se = _lower_quartile(held[-latest_n:])
        noise = _Z * sqrt(before_se * before_se + latest_se * latest_se)
        if abs(latest - before) > noise + _SPEED_CHANGE * before:
            for samples in (self._compute, self._wait, self._micro, self._rest, self._latest):
                kept = list(samples)[-latest_n:]
                samples.clear()
                samples.extend(kept)  # type: ignore[arg-type]
            self._micro_steps = sum(m is not None for m in self._micro)

    def _by_micro_batch(self) -> tuple[float, float] | None:
        """``micro_batch_centre`` of the latest steps, when every step held ran micro-batches."""
        n = len(self._compute)
        if n == 0 or self._micro_steps != n:
            return None
        steps = [m or () for m in list(self._micro)[-_SPREAD_STEPS:]]
        return micro_batch_centre(steps, list(self._rest)[-_SPREAD_STEPS:], self.batch_size)

    @property
    def compute_s(self) -> float:
        """Median compute time per step since the last change (``nan`` before a step); from
        the micro-batches when the steps ran several (see the class)."""
        by_micro = self._by_micro_batch()
        if by_micro is not None:
            return by_micro[0]
        return self._compute.median()

    @property
    def wait_s(self) -> float:
        """Median wait for other ranks per step since the last change."""
        return self._wait.median()

    @property
    def compute_se(self) -> float:
        """Standard error of ``compute_s`` (see ``robust_centre``); ``nan`` below two
        steps. The spread is read from the latest ``_SPREAD_STEPS`` steps (as good an
        estimate, and a boundary every step or two does not sort a thousand of them); with
        micro-batches, ``micro_batch_centre``'s error."""
        by_micro = self._by_micro_batch()
        if by_micro is not None:
            return by_micro[1]
        n = len(self._compute)
        return self._latest.centre()[1] * sqrt(len(self._latest) / n) if n else nan

    @property
    def compute_count(self) -> int:
        """Steps in ``compute_s``."""
        return len(self._compute)

    @property
    def step_s(self) -> float:
        """Plain mean of compute plus wait per step: the wall time of a step."""
        return self._step.mean

    @property
    def step_count(self) -> int:
        """Steps in ``step_s``."""
        return self._step.count

    @property
    def step_se(self) -> float:
        """Standard error of ``step_s`` (``nan`` below two steps)."""
        n = self._step.count
        return self._step.std / sqrt(n) if n > 1 else nan


def _per_sample(micro: Sequence[tuple[int, float]]) -> tuple[float, ...] | None:
    """Seconds per sample of each micro-batch; ``None`` below two of them or for a reading
    that is not finite."""
    if len(micro) < 2:
        return None
    times = tuple(t / n for n, t in micro if n > 0 and isfinite(t) and t >= 0)
    return times if len(times) == len(micro) else None


@dataclass
class _Moments:
    """Running mean and variance (Welford) of one quantity."""

    count: int = 0
    mean: float = nan
    _m2: float = 0.0

    def add(self, value: float) -> None:
        self.count += 1
        if self.count == 1:
            self.mean, self._m2 = value, 0.0
            return
        delta = value - self.mean
        self.mean += delta / self.count
        self._m2 += delta * (value - self.mean)

    @property
    def std(self) -> float:
        return sqrt(self._m2 / (self.count - 1)) if self.count > 1 else nan
