"""The static controller: keep the initial plan."""

from collections.abc import Sequence

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats

__all__ = ["StaticController"]


class StaticController(Controller):
    """Never changes the plan; timings are still measured and logged.

    Use it for an open-loop split (``batch_sizes="cores"``, ``"flops"`` or a list)
    or as the baseline of an ablation.

    Example:
        >>> from lightning_hetero.planning import BatchLimits
        >>> StaticController().update([8, 8], [1.0, 3.0], BatchLimits.build(2, 16))
        [8, 8]
    """

    name = "static"
    replicable = True
    adapts = False

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        return list(batch_sizes)
