"""Synchronous data parallelism over a sharded model (FSDP2), gradients weighted by share."""

from collections.abc import Callable
from typing import Any, ClassVar

import torch

from lightning_hetero._fsdp import CollectiveWaitMeter
from lightning_hetero.modes.base import Mode

__all__ = ["ShardedMode"]


class ShardedMode(Mode):
    """``HeteroFSDPStrategy(mode="bsp")``: every rank steps together on its own batch.

    FSDP2 averages each gradient over the ``K`` ranks when it reduce-scatters it. Scaling rank
    ``k``'s loss by ``K * b_k / B`` before backward turns that average into
    ``sum_k (b_k / B) g_k``: the gradient of the mean loss over the step's ``B`` samples,
    whatever the split (gradient clipping and accumulation then see the exact gradient).

    Timing: under FSDP every rank waits for the others inside forward and backward (each
    layer's all-gather, each reduce-scatter). The time this rank spends blocked in those
    waits is measured (:class:`~lightning_hetero._fsdp.CollectiveWaitMeter`) and counted as
    waiting, so a rank's compute time is its own however slow the others are.
    """

    name: ClassVar[str] = "bsp"
    steps_together: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True  # ``wrap`` shards it
    replans_within_epoch: ClassVar[bool] = True
    probe_steps_communicate: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.meter: CollectiveWaitMeter | None = None

    def register_hooks(self, model: Any) -> None:
        self.meter = CollectiveWaitMeter()
        self.meter.install(model)

    def on_train_batch_start(self, batch_idx: int) -> None:
        if self.meter is not None:
            self.meter.take()  # waits before the step (e.g. validation's) are not this step's
        super().on_train_batch_start(batch_idx)

    def backward(
        self, loss: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        with self._host().comm.guarded("backward with its gradient reduce-scatter"):
            return run(self.scale_loss(loss))

    def post_backward(self) -> None:
        host = self._host()
        if self.meter is not None:
            host.timer.add_wait(self.meter.take())
        host.timer.backward_done()

    def teardown(self) -> None:
        if self.meter is not None:
            self.meter.remove()
            self.meter = None
