"""Per-rank smoothing of step timings between two plan changes."""

from dataclasses import dataclass
from math import isfinite, nan, sqrt

__all__ = ["TimingSmoother"]


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


@dataclass
class TimingSmoother:
    """Exponentially weighted moving average of one rank's step times at one batch size.

    ``value <- smoothing * value + (1 - smoothing) * new``: ``smoothing=0`` keeps only
    the latest step, values near 1 average over many steps (papers 000 and 002 smooth
    iteration times since the last batch change). The average restarts whenever the
    batch size changes, so it always describes the batch size it reports. The first
    step after a restart is discarded when later steps arrive: it pays one-off costs
    (allocator growth, DDP bucket rebuilding, cold caches). A step timed only from its
    batch's arrival (``full=False``: an epoch's first, see
    ``StepRecord``) counts only while no fully timed one exists.

    Besides the average it keeps, over the same steps, how noisy they are
    (``compute_se``) and the plain mean of the whole step, compute plus waiting
    (``step_s``, the synchronous step time in lock-step modes) with its standard error,
    over the steps of the latest ``plan`` only: another rank's change makes this rank's
    steps longer or shorter at the same batch size.

    Example:
        >>> s = TimingSmoother(smoothing=0.5)
        >>> for t in (9.0, 1.0, 3.0):
        ...     s.update(batch_size=32, compute_s=t, wait_s=0.0)
        >>> s.batch_size, s.compute_s, s.steps, s.step_s
        (32, 2.0, 3, 2.0)
    """

    smoothing: float = 0.8
    batch_size: int = 0
    compute_s: float = nan
    wait_s: float = nan
    steps: int = 0
    full_steps: int = 0
    plan: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"`smoothing` must be in [0, 1), got {self.smoothing}.")
        self._compute_var, self._averaged = 0.0, 0  # EW variance of compute, steps in it
        self._step = _Moments()

    def reset(self) -> None:
        """Forget all samples."""
        self.batch_size, self.compute_s, self.wait_s = 0, nan, nan
        self.steps = self.full_steps = 0
        self._compute_var, self._averaged = 0.0, 0
        self._step = _Moments()

    def update(
        self, batch_size: int, compute_s: float, wait_s: float, full: bool = True, plan: int = 0
    ) -> None:
        """Add one step; a different ``batch_size`` restarts the average, a different
        ``plan`` (a key of the whole plan) the step time. ``full``: the step was timed from
        the previous step's end (its loading included)."""
        if batch_size != self.batch_size:
            self.reset()
            self.batch_size = batch_size
        if plan != self.plan:
            self.plan, self._step = plan, _Moments()
        if not (isfinite(compute_s) and isfinite(wait_s)):
            return
        if not full and self.full_steps:
            return  # a fully timed reading describes the step better
        if full and self.steps and not self.full_steps:
            self.steps = 1  # only partial readings so far: replace them (one-off costs paid)
        self.steps += 1
        self.full_steps += full
        if self.steps <= 2:  # the first step is replaced by the second
            self.compute_s, self.wait_s = compute_s, wait_s
            self._compute_var, self._averaged = 0.0, 1
            self._step = _Moments()
        else:
            a = self.smoothing
            change = compute_s - self.compute_s
            self.compute_s += (1.0 - a) * change
            self.wait_s = a * self.wait_s + (1.0 - a) * wait_s
            # exponentially weighted variance, with the average's own weights: it forgets a
            # past speed change as fast as the average does
            self._compute_var = a * (self._compute_var + (1.0 - a) * change * change)
            self._averaged += 1
        self._step.add(compute_s + wait_s)

    @property
    def compute_se(self) -> float:
        """Standard error of ``compute_s``: the per-step standard deviation (weighted
        as the average weighs the steps, so that old readings fade) over the square root of
        the steps the average holds (at most ``(1 + a) / (1 - a)`` for an EWMA of factor
        ``a``); ``nan`` below two steps."""
        if self._averaged < 2:
            return nan
        a = self.smoothing
        held = min(self._averaged, (1.0 + a) / (1.0 - a))
        return sqrt(self._compute_var / held)

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
