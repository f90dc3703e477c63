"""The benchmarks' one way of printing a spread over repeats."""

import statistics
from collections.abc import Iterable

__all__ = ["spread"]


def spread(values: Iterable[float], fmt: str = ".3g", scale: float = 1.0) -> str:
    """``"min / median / max"`` of ``values`` times ``scale``, each formatted with ``fmt``.

    Example:
        >>> spread([0.002, 0.001, 0.004], ".0f", scale=1e6)
        '1000 / 2000 / 4000'
    """
    ordered = sorted(v * scale for v in values)
    low, mid, high = ordered[0], statistics.median(ordered), ordered[-1]
    return f"{low:{fmt}} / {mid:{fmt}} / {high:{fmt}}"
