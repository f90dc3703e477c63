"""Small optimizer helpers shared by the async and local modes."""

from collections.abc import Iterator
from contextlib import contextmanager

import torch

__all__ = ["optimizer_params", "scaled_lr"]


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters ``optimizer`` steps, in parameter-group order."""
    return [param for group in optimizer.param_groups for param in group["params"]]


@contextmanager
def scaled_lr(optimizer: torch.optim.Optimizer, factor: float) -> Iterator[None]:
    """Multiply every group's learning rate by ``factor`` for the duration of the block."""
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * factor
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr
