"""Small optimizer helpers shared by the modes and the probes."""

from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

import torch

__all__ = ["optimizer_params", "patched", "scaled_lr"]


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


@contextmanager
def patched(obj: object, attributes: dict[str, Any]) -> Iterator[None]:
    """Set instance attributes of ``obj`` for the duration of the block (e.g. ``step``)."""
    for name, value in attributes.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name in attributes:
            delattr(obj, name)
