"""Logged values that average per-batch means, which unequal batches make differ from DDP's.

A torchmetrics ``MeanMetric`` fed one batch mean per step without a weight counts each
batch once, whatever its size: under the plan ``[114, 14]`` a 14-sample batch weighs as
much as a 114-sample one, and the logged value is not the per-sample mean DDP's equal
batches give. Its states tell how it was fed: the sum of the weights equals the number of
updates only where every update was one value of weight 1.
"""

from typing import Any

import torch

__all__ = ["per_batch_means", "per_batch_means_message"]


def _mean_metric_type() -> type | None:
    try:
        from torchmetrics.aggregation import MeanMetric
    except ImportError:  # pragma: no cover - Lightning installs torchmetrics
        return None
    return MeanMetric


def per_batch_means(module: torch.nn.Module) -> tuple[list[str], list[str]]:
    """``module``'s ``MeanMetric`` submodules (in ``MetricCollection``s too), by name:
    (those updated so far with one unweighted value per update, i.e. averaging per-batch
    means; those not updated yet, whose feeding cannot be told). Weighted ones (a
    ``weight`` other than 1, or per-sample values) are in neither."""
    mean_metric = _mean_metric_type()
    if mean_metric is None:
        return [], []
    unweighted: list[str] = []
    unknown: list[str] = []
    for name, child in module.named_modules():
        if not name or not isinstance(child, mean_metric):
            continue
        updates = int(getattr(child, "_update_count", 0))
        weight: Any = getattr(child, "weight", None)
        if updates == 0 or not isinstance(weight, torch.Tensor) or weight.numel() != 1:
            unknown.append(name)
        elif abs(float(weight) - updates) < 1e-6 * max(updates, 1):
            unweighted.append(name)
    return unweighted, unknown


def per_batch_means_message(module: torch.nn.Module, plan: list[int]) -> str | None:
    """What to tell the user about ``module``'s per-batch means when ``plan`` first makes
    the ranks' batches unequal; ``None`` where there is nothing to say."""
    unweighted, unknown = per_batch_means(module)
    if not unweighted and not unknown:
        return None
    how = (
        " Weight each update by its batch, `metric.update(value, weight=batch_size)`"
        " (the same in `metric(value, weight=batch_size)`), or update it with the per-sample"
        " values. See docs/logging.md, 'Your own training metrics with unequal batches'."
    )
    said = []
    if unweighted:
        names = ", ".join(f"`{name}`" for name in unweighted)
        said.append(
            f"{names} (torchmetrics MeanMetric) took one value of weight 1 per update, so it"
            " averages per-batch means: each rank's batch counts once whatever its size, and"
            " the value logged from it now differs from DDP's per-sample mean."
        )
    if unknown:
        names = ", ".join(f"`{name}`" for name in unknown)
        said.append(
            f"{names} (torchmetrics MeanMetric) has not been updated yet: if it takes one"
            " per-batch mean per update without a weight, the value logged from it will"
            " differ from DDP's per-sample mean, as each batch counts once whatever its size."
        )
    return f"hetero: the plan {plan} gives the ranks unequal batches. {' '.join(said)}{how}"
