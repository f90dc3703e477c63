"""A linear memory model of one training step, and the batch-size bound it implies.

Training memory is a fixed part (parameters, gradients, optimizer state) plus a part
that grows with the batch (activations, the batch itself): ``M(b) = fixed + per_sample
* b`` (paper 003, Eq. 9; paper 002, Eq. 9 splits the same sum into model, gradient,
optimizer, activation and batch memory). A few measured ``(b, M(b))`` pairs fix the
two coefficients by least squares, and the largest ``b`` whose prediction stays under
a safety fraction of the free memory is that worker's ``b_max``. The measuring side
lives in ``lightning_hetero.memory_probe``; this module is numbers only.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from math import floor, isfinite

from lightning_hetero.planning.split import PlanError

__all__ = ["MemoryModel", "least_squares_line", "probe_sizes"]


@dataclass(frozen=True)
class MemoryModel:
    """Peak memory of a training step as a linear function of the batch size.

    ``predict(b) = fixed_bytes + per_sample_bytes * b`` (paper 003, Eq. 9).

    Args:
        fixed_bytes: memory that does not depend on the batch size, in bytes.
        per_sample_bytes: memory each extra sample adds, in bytes.
        relative_error: the largest absolute residual of the fit divided by the largest
            measurement (0 for an exact line, or when built by hand).

    Example:
        >>> model = MemoryModel.fit([(10, 1125.0), (20, 1250.0), (30, 1375.0)])
        >>> model.fixed_bytes, model.per_sample_bytes, model.relative_error
        (1000.0, 12.5, 0.0)
        >>> model.max_batch_size(budget_bytes=2000, safety=0.9)
        64
    """

    fixed_bytes: float
    per_sample_bytes: float
    relative_error: float = 0.0

    def __post_init__(self) -> None:
        if not (isfinite(self.fixed_bytes) and isfinite(self.per_sample_bytes)):
            raise ValueError(
                "Memory model coefficients must be finite, got"
                f" fixed_bytes={self.fixed_bytes}, per_sample_bytes={self.per_sample_bytes}."
            )

    @classmethod
    def fit(cls, samples: Sequence[tuple[int, float]]) -> "MemoryModel":
        """Least-squares line through measured ``(batch_size, peak_bytes)`` pairs.

        Args:
            samples: at least two distinct positive batch sizes, each with the finite
                peak memory (bytes) one step took at that size. Repeated sizes are fine.

        Raises:
            PlanError: fewer than two distinct batch sizes, a batch size below 1, or a
                measurement that is not finite.
        """
        pairs = [(int(b), float(m)) for b, m in samples]
        if any(not isfinite(m) for _, m in pairs):
            raise PlanError(f"Memory measurements must be finite, got {[m for _, m in pairs]}.")
        intercept, slope = least_squares_line(pairs, "memory")
        worst_residual = max(abs(m - (intercept + slope * b)) for b, m in pairs)
        # Relative to the largest measurement, so a step that measured 0 bytes at a
        # small size (host RSS that did not grow) cannot divide by zero.
        scale = max(abs(m) for _, m in pairs)
        relative_error = worst_residual / scale if scale > 0 else 0.0
        return cls(intercept, slope, relative_error)

    def predict(self, batch_size: int) -> float:
        """Predicted peak memory in bytes of one step at ``batch_size``."""
        return self.fixed_bytes + self.per_sample_bytes * batch_size

    def max_batch_size(
        self, budget_bytes: float, safety: float = 0.9, cap: int | None = None
    ) -> int | None:
        """Largest batch size whose predicted memory stays within ``safety * budget_bytes``.

        Args:
            budget_bytes: the memory the step may use, in bytes, measured the same way as
                the samples of the fit (e.g. free memory before the probe).
            safety: fraction of the budget to plan for, in ``(0, 1]``; the rest absorbs
                allocator fragmentation and measurement noise.
            cap: an upper limit from elsewhere (e.g. the global batch); the result never
                exceeds it.

        Returns:
            The bound, at least 1. When ``per_sample_bytes <= 0`` memory does not limit
            the batch: the result is ``cap``, which is ``None`` (no bound) unless given.

        Raises:
            ValueError: ``safety`` outside ``(0, 1]``, a negative or non-finite budget, or
                a ``cap`` below 1.
            PlanError: not even a batch of one fits in the budget.

        Example:
            >>> MemoryModel(fixed_bytes=100.0, per_sample_bytes=10.0).max_batch_size(1000)
            80
            >>> MemoryModel(fixed_bytes=100.0, per_sample_bytes=0.0).max_batch_size(1000) is None
            True
        """
        if not 0.0 < safety <= 1.0:
            raise ValueError(f"`safety` must be in (0, 1], got {safety}.")
        if not (isfinite(budget_bytes) and budget_bytes >= 0):
            raise ValueError(f"`budget_bytes` must be finite and >= 0, got {budget_bytes}.")
        if cap is not None and cap < 1:
            raise ValueError(f"`cap` must be >= 1 or None, got {cap}.")
        usable = safety * budget_bytes
        if self.predict(1) > usable:
            raise PlanError(
                "Not even a batch of 1 fits in memory: the fixed cost is about"
                f" {_mib(self.fixed_bytes)} plus {_mib(self.per_sample_bytes)} per sample,"
                f" and the budget is {safety:g} x {_mib(budget_bytes)} = {_mib(usable)}."
            )
        if self.per_sample_bytes <= 0:
            return cap
        quotient = (usable - self.fixed_bytes) / self.per_sample_bytes
        if not isfinite(quotient):  # a slope too small to matter
            return cap
        largest = floor(quotient)
        # Rounding in the division can land one off either way; settle on the exact test.
        if self.predict(largest + 1) <= usable:
            largest += 1
        elif self.predict(largest) > usable:
            largest -= 1
        largest = max(largest, 1)
        return largest if cap is None else min(largest, cap)


def least_squares_line(
    pairs: Sequence[tuple[int, float]], what: str = "a measurement", relative: bool = False
) -> tuple[float, float]:
    """Intercept and slope of the least-squares line through ``(batch_size, y)`` pairs.

    ``relative=True`` minimizes the relative residuals (weights ``1 / y**2``; every ``y``
    must be non-zero), so that small measurements count as much as large ones.

    Raises:
        PlanError: a batch size below 1, or fewer than two distinct batch sizes (``what``
            names the measurement in the message).

    Example:
        >>> least_squares_line([(1, 3.0), (2, 5.0), (3, 7.0)])
        (1.0, 2.0)
    """
    if any(x < 1 for x, _ in pairs):
        raise PlanError(f"Batch sizes must be >= 1, got {[x for x, _ in pairs]}.")
    if len({x for x, _ in pairs}) < 2:
        raise PlanError(
            f"Fitting {what} against batch size needs at least two distinct batch sizes,"
            f" got {sorted({x for x, _ in pairs})}."
        )
    weights = [1.0 / (y * y) if relative else 1.0 for _, y in pairs]
    total = sum(weights)
    mean_x = sum(w * x for w, (x, _) in zip(weights, pairs)) / total
    mean_y = sum(w * y for w, (_, y) in zip(weights, pairs)) / total
    spread = sum(w * (x - mean_x) ** 2 for w, (x, _) in zip(weights, pairs))
    slope = sum(w * (x - mean_x) * (y - mean_y) for w, (x, y) in zip(weights, pairs)) / spread
    return mean_y - slope * mean_x, slope


def probe_sizes(largest: int, count: int = 4, ratio: float = 2.0) -> list[int]:
    """Geometrically spaced batch sizes to probe, ascending, ending at ``largest``.

    The sizes are ``largest / ratio**i`` for ``i < count``, rounded, at least 1, without
    repeats: wide spacing makes the slope of the fit insensitive to measurement noise.

    Args:
        largest: the biggest batch size worth knowing about (e.g. the global batch).
        count: how many sizes to return at most (fewer when small sizes coincide).
        ratio: the factor between neighbouring sizes, above 1.

    Example:
        >>> probe_sizes(256)
        [32, 64, 128, 256]
        >>> probe_sizes(3, count=4)
        [1, 2, 3]
    """
    if largest < 2:
        raise ValueError(f"`largest` must be >= 2 to give two distinct sizes, got {largest}.")
    if count < 2:
        raise ValueError(f"`count` must be >= 2 (a line needs two points), got {count}.")
    if not (isfinite(ratio) and ratio > 1.0):
        raise ValueError(f"`ratio` must be a finite number above 1, got {ratio}.")
    return sorted({max(1, round(largest / ratio**i)) for i in range(count)})


def _mib(num_bytes: float) -> str:
    return f"{num_bytes / 2**20:.1f} MiB"
