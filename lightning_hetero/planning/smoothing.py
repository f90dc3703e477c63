"""Per-rank smoothing of step timings between two plan changes."""

from dataclasses import dataclass
from math import isfinite

__all__ = ["TimingSmoother"]


@dataclass
class TimingSmoother:
    """Exponentially weighted moving average of one rank's step times at one batch size.

    ``value <- smoothing * value + (1 - smoothing) * new``: ``smoothing=0`` keeps only
    the latest step, values near 1 average over many steps (papers 000 and 002 smooth
    iteration times since the last batch change). The average restarts whenever the
    batch size changes, so it always describes the batch size it reports. The first
    step after a restart is discarded when later steps arrive: it pays one-off costs
    (allocator growth, DDP bucket rebuilding, cold caches).

    Example:
        >>> s = TimingSmoother(smoothing=0.5)
        >>> for t in (9.0, 1.0, 3.0):
        ...     s.update(batch_size=32, compute_s=t, wait_s=0.0)
        >>> s.batch_size, s.compute_s, s.steps
        (32, 2.0, 3)
    """

    smoothing: float = 0.8
    batch_size: int = 0
    compute_s: float = float("nan")
    wait_s: float = float("nan")
    steps: int = 0

    def __post_init__(self) -> None:
        if not 0.0 <= self.smoothing < 1.0:
            raise ValueError(f"`smoothing` must be in [0, 1), got {self.smoothing}.")

    def reset(self) -> None:
        """Forget all samples."""
        self.batch_size, self.compute_s, self.wait_s, self.steps = 0, float("nan"), float("nan"), 0

    def update(self, batch_size: int, compute_s: float, wait_s: float) -> None:
        """Add one step; a different ``batch_size`` restarts the average."""
        if batch_size != self.batch_size:
            self.reset()
            self.batch_size = batch_size
        if not (isfinite(compute_s) and isfinite(wait_s)):
            return
        self.steps += 1
        if self.steps <= 2:  # the first step is replaced by the second
            self.compute_s, self.wait_s = compute_s, wait_s
            return
        a = self.smoothing
        self.compute_s = a * self.compute_s + (1.0 - a) * compute_s
        self.wait_s = a * self.wait_s + (1.0 - a) * wait_s
