"""Small optimizer helpers shared by the modes and the probes."""

import math
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any, Literal

import torch

__all__ = [
    "LR_SCALING",
    "check_lr_scaling",
    "is_adaptive",
    "lr_factor",
    "lr_rule",
    "optimizer_params",
    "patched",
    "scaled_lr",
]

#: ``lr_scaling`` values: ``"auto"`` picks ``"linear"`` or ``"sqrt"`` by the optimizer;
#: ``True`` and ``False`` (before ``"auto"``) mean ``"linear"`` and ``"none"``.
LR_SCALING = ("auto", "linear", "sqrt", "none")
Rule = Literal["linear", "sqrt", "none"]

# Optimizers whose step barely scales with the gradient's size: Adam and its kin divide by a
# running gradient norm, Rprop and Muon normalize the step outright.
_ADAPTIVE_NAMES = (
    "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
    "SparseAdam", "Adafactor", "Rprop", "Muon",
)  # fmt: skip
_ADAPTIVE = tuple(getattr(torch.optim, n) for n in _ADAPTIVE_NAMES if hasattr(torch.optim, n))
# Parameter-group keys only adaptive optimizers have (third-party ones included: Lion, LAMB,
# Adan, AdaBelief take ``betas``); SGD, ASGD, LARS and LBFGS have none of them.
_ADAPTIVE_KEYS = frozenset(
    {"betas", "beta1", "beta2", "beta2_decay", "rho", "centered", "lr_decay",
     "initial_accumulator_value", "etas", "ns_steps"}
)  # fmt: skip


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters ``optimizer`` steps, in parameter-group order."""
    return [param for group in optimizer.param_groups for param in group["params"]]


def check_lr_scaling(value: Any) -> Literal["auto", "linear", "sqrt", "none"]:
    """``lr_scaling`` as one of ``LR_SCALING`` (``True``: ``"linear"``, ``False``:
    ``"none"``); anything else is refused naming the option.

    Examples:
        >>> check_lr_scaling(True), check_lr_scaling("sqrt")
        ('linear', 'sqrt')
    """
    if value is True:
        return "linear"
    if value is False:
        return "none"
    if isinstance(value, str) and value in LR_SCALING:
        return value  # type: ignore[return-value]
    raise ValueError(
        f"`lr_scaling` must be one of {list(LR_SCALING)} (or True for 'linear', False for"
        f" 'none'), got {value!r}."
    )


def is_adaptive(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` (or the one a ``LightningOptimizer`` wraps) is adaptive: one of
    torch's Adam/RMSprop/Adagrad family, or any optimizer whose parameter groups carry one
    of their keys (``betas``, ``rho``, ...)."""
    raw = getattr(optimizer, "_optimizer", optimizer)
    if isinstance(raw, _ADAPTIVE):
        return True
    return any(_ADAPTIVE_KEYS.intersection(group) for group in raw.param_groups)


def lr_rule(lr_scaling: Any, optimizer: torch.optim.Optimizer) -> Rule:
    """The scaling rule ``lr_scaling`` means for ``optimizer``: ``"auto"`` is ``"sqrt"`` for
    adaptive optimizers (``is_adaptive``), ``"linear"`` for the SGD family."""
    rule = check_lr_scaling(lr_scaling)
    if rule == "auto":
        return "sqrt" if is_adaptive(optimizer) else "linear"
    return rule


def lr_factor(rule: str, share: float) -> float:
    """The learning-rate factor of a step on ``share`` of the reference batch: ``share``
    (linear scaling rule, SGD), ``sqrt(share)`` (square-root rule, adaptive methods), or 1.

    Examples:
        >>> lr_factor("linear", 0.25), lr_factor("sqrt", 0.25), lr_factor("none", 0.25)
        (0.25, 0.5, 1.0)
    """
    if not (math.isfinite(share) and share > 0):
        raise ValueError(f"a batch share must be a positive number, got {share}.")
    if rule == "linear":
        return share
    if rule == "sqrt":
        return math.sqrt(share)
    if rule == "none":
        return 1.0
    raise ValueError(f"Unknown learning-rate scaling rule {rule!r}; expected linear, sqrt or none.")


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


_ABSENT = object()


@contextmanager
def patched(obj: object, attributes: dict[str, Any]) -> Iterator[None]:
    """Set instance attributes of ``obj`` for the duration of the block (e.g. ``step``), then
    restore exactly what was there: an instance attribute set before (such as the wrapper an
    LR scheduler puts on ``optimizer.step``) gets its value back, others are deleted."""
    saved = {name: vars(obj).get(name, _ABSENT) for name in attributes}
    for name, value in attributes.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, value)
