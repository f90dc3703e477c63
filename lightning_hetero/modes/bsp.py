"""Synchronous data parallelism (BSP): DDP with gradients weighted by batch share."""

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from lightning_hetero._comm import WeightedHookState, weighted_allreduce_hook
from lightning_hetero.modes.base import Mode

__all__ = ["SynchronousMode"]


class SynchronousMode(Mode):
    """``mode="bsp"``: every rank steps together; rank ``k``'s gradient weighs ``b_k / B``.

    The model is wrapped in ``DistributedDataParallel`` with a communication hook that scales
    each gradient bucket by this step's ``b_k / B`` before the all-reduce sums it, which is
    exactly the gradient of the mean loss over the ``B`` samples of the step.
    """

    name: ClassVar[str] = "bsp"
    steps_together: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True
    replans_within_epoch: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.hook_state: WeightedHookState | None = None

    def register_hooks(self, model: Any) -> None:
        # DDPStrategy registers hooks on CUDA only; ours must run on every device.
        assert isinstance(model, DistributedDataParallel)
        host = self._host()
        self.hook_state = WeightedHookState(
            process_group=None,
            world_size=host.world_size,
            timer=host.timer,
            weighted=self.options.weighted,
            weight=1.0 / host.world_size,  # plain mean until the first step sets b_k / B
        )
        model.register_comm_hook(self.hook_state, weighted_allreduce_hook)

    def on_train_batch_start(self, batch_idx: int) -> None:
        super().on_train_batch_start(batch_idx)
        if self.hook_state is not None:
            local, total = self.share
            self.hook_state.weight = local / total

    def backward(
        self, loss: torch.Tensor, run: Callable[[torch.Tensor], torch.Tensor]
    ) -> torch.Tensor:
        # DDP waits for the gradient all-reduce inside backward: a hung peer surfaces here
        # (the note names both, since backward can also fail on its own, e.g. out of memory).
        with self._host().comm.guarded("backward with its gradient all-reduce"):
            return run(loss)
