"""Emulated heterogeneous workers on one machine."""

import time
from collections.abc import Mapping, Sequence
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.data import extract_batch_size
from typing_extensions import override

__all__ = ["Throttle"]


class Throttle(Callback):
    """Make rank ``k`` slower by ``sample_cost[k]`` seconds per sample of its batch.

    The delay is added after the forward pass and before backward, so it counts as
    compute time (before the gradients are ready), exactly as a slower device would.
    Works with any strategy, which makes it the way to compare plain DDP with
    :class:`~lightning_hetero.HeteroStrategy` on one machine.

    Args:
        sample_cost: seconds per sample, one entry per global rank; or a mapping
            ``{epoch: [costs]}`` whose latest entry at or before the current epoch
            applies (epochs before the first entry run unthrottled).
        unit: what the keys of a ``sample_cost`` mapping count: ``"epoch"``, or ``"step"``
            (the trainer's ``global_step``, i.e. optimizer steps), to change speeds in the
            middle of an epoch.

    Example:
        >>> Throttle(sample_cost=[0.004, 0.004, 0.006, 0.0015]).cost(rank=2, epoch=0)
        0.006
        >>> Throttle(sample_cost={0: [0.001, 0.001], 3: [0.001, 0.01]}).cost(rank=1, epoch=5)
        0.01
        >>> Throttle({0: [0.001, 0.001], 40: [0.001, 0.01]}, unit="step").cost(rank=1, epoch=39)
        0.001
    """

    def __init__(
        self,
        sample_cost: Sequence[float] | Mapping[int, Sequence[float]],
        unit: Literal["epoch", "step"] = "epoch",
    ) -> None:
        if unit not in ("epoch", "step"):
            raise ValueError(f"`unit` must be 'epoch' or 'step', got {unit!r}.")
        self.unit = unit
        schedule = dict(sample_cost) if isinstance(sample_cost, Mapping) else {0: sample_cost}
        if not schedule:
            raise ValueError("`sample_cost` is empty.")
        self.schedule: dict[int, list[float]] = {}
        for epoch, costs in sorted(schedule.items()):
            costs = [float(c) for c in costs]
            if int(epoch) < 0 or not costs or any(c < 0 for c in costs):
                raise ValueError(
                    f"{unit.capitalize()}s and costs must be >= 0 and non-empty,"
                    f" got {epoch}: {costs}."
                )
            self.schedule[int(epoch)] = costs
        sizes = {len(c) for c in self.schedule.values()}
        if len(sizes) != 1:
            raise ValueError("Every entry of `sample_cost` needs one cost per rank.")
        self._batch_size = 0

    def cost(self, rank: int, epoch: int) -> float:
        """Seconds per sample for ``rank`` during ``epoch`` (a step when ``unit="step"``)."""
        costs: list[float] | None = None
        for start, entry in self.schedule.items():
            if start <= epoch:
                costs = entry
        if costs is None:
            return 0.0
        if rank >= len(costs):
            raise ValueError(f"Throttle has costs for {len(costs)} ranks; rank {rank} has none.")
        return costs[rank]

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        width = len(next(iter(self.schedule.values())))
        if width != trainer.world_size:
            raise ValueError(
                f"Throttle has costs for {width} ranks but the run has {trainer.world_size}."
            )

    @override
    def on_train_batch_start(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int
    ) -> None:
        self._batch_size = extract_batch_size(batch)

    @override
    def on_before_backward(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", loss: Any
    ) -> None:
        self._sleep(trainer, self._batch_size)

    def emulate_step(self, trainer: "pl.Trainer", batch: Any) -> None:
        """Sleep what a step on ``batch`` costs this rank now: what a probe that times
        training steps outside the loop adds to each, as the loop's hooks would."""
        self._sleep(trainer, extract_batch_size(batch))

    def _sleep(self, trainer: "pl.Trainer", batch_size: int) -> None:
        when = trainer.current_epoch if self.unit == "epoch" else trainer.global_step
        delay = self.cost(trainer.global_rank, when) * batch_size
        if delay > 0:
            time.sleep(delay)
