"""Synchronous data parallelism (BSP): DDP with gradients weighted by batch share."""

from collections.abc import Callable
from typing import Any, ClassVar

import torch
from torch.nn.parallel import DistributedDataParallel

from lightning_hetero.modes.base import Mode

__all__ = ["SynchronousMode"]


class SynchronousMode(Mode):
    """``mode="bsp"``: every rank steps together; rank ``k``'s gradient weighs ``b_k / B``.

    The model is wrapped in ``DistributedDataParallel`` as it comes, with DDP's own (C++)
    all-reduce, which averages the ranks' gradients. Each rank scales its loss by
    ``K * b_k / B`` before backward, so the average is ``sum_k (b_k / B) g_k``: exactly the
    gradient of the mean loss over the ``B`` samples of the step, with no Python on the
    communication path. A hook after each parameter's gradient accumulation marks when this
    rank's gradients are ready (the rest of the backward is waiting for the all-reduce).
    """

    name: ClassVar[str] = "bsp"
    steps_together: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True
    replans_within_epoch: ClassVar[bool] = True
    micro_batches: ClassVar[bool] = True
    takes_over_accumulation: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._handles: list[Any] = []

    def register_hooks(self, model: Any) -> None:
        assert isinstance(model, DistributedDataParallel)
        self._handles = mark_grads_ready(model.module, self.ctx.timer.grads_ready)

    def backward(self, loss: torch.Tensor, run: Callable[[torch.Tensor], None]) -> None:
        # DDP waits for the gradient all-reduce inside backward: a hung peer surfaces here
        # (the note names both, since backward can also fail on its own, e.g. out of memory).
        with self.ctx.comm.guarded("backward with its gradient all-reduce"):
            run(self.scale_loss(loss) if self.options.weighted else loss)

    def teardown(self) -> None:
        for handle in self._handles:
            handle.remove()
        self._handles = []
        super().teardown()


def mark_grads_ready(module: torch.nn.Module, ready: Callable[[], None]) -> list[Any]:
    """Call ``ready()`` after each trainable parameter's gradient is accumulated.

    The last call of a backward marks the moment all local gradients exist. Returns the
    hook handles (``handle.remove()`` takes a hook off).
    """

    def hook(_: torch.Tensor) -> None:
        ready()

    return [
        param.register_post_accumulate_grad_hook(hook)
        for param in module.parameters()
        if param.requires_grad
    ]
