"""The warning about logged per-batch means when the plan first makes batches unequal."""

from types import SimpleNamespace

import pytest
import torch
from torchmetrics import MetricCollection
from torchmetrics.aggregation import MeanMetric, SumMetric

from lightning_hetero import HeteroCallback
from lightning_hetero._logged_means import per_batch_means, per_batch_means_message


class _Module(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.train_loss = MeanMetric()  # the template's: one batch mean per step
        self.weighted = MeanMetric()
        self.per_sample = MeanMetric()
        self.fresh = MeanMetric()
        self.total = SumMetric()  # not a mean
        self.more = MetricCollection({"nested": MeanMetric()})


def _fed() -> _Module:
    module = _Module()
    for size in (114, 14):
        loss = torch.tensor(0.5)
        module.train_loss(loss)  # forward updates the running state too
        module.weighted.update(loss, weight=size)
        module.per_sample.update(torch.full((size,), 0.5))
        module.total.update(loss)
        module.more["nested"].update(loss)
    return module


def test_unweighted_weighted_and_untold_means_are_told_apart():
    unweighted, unknown = per_batch_means(_fed())
    assert unweighted == ["train_loss", "more.nested"]
    assert unknown == ["fresh"]


def test_the_message_names_the_metrics_and_how_to_weight_them():
    message = per_batch_means_message(_fed(), [114, 14])
    assert message is not None
    assert message.startswith("hetero: the plan [114, 14] gives the ranks unequal batches.")
    assert "`train_loss`, `more.nested` (torchmetrics MeanMetric) took one value" in message
    assert "`fresh` (torchmetrics MeanMetric) has not been updated yet: if it" in message
    assert "weight=batch_size" in message and "weighted" not in message
    assert per_batch_means_message(torch.nn.Linear(2, 2), [114, 14]) is None


def _trainer(module, plan):
    return SimpleNamespace(lightning_module=module, strategy=SimpleNamespace(batch_sizes=plan))


def test_the_callback_warns_once_when_the_plan_first_makes_batches_unequal(monkeypatch):
    from lightning_hetero import callback

    said: list[str] = []
    monkeypatch.setattr(callback, "rank_zero_warn", said.append)
    hook = HeteroCallback()
    module = _fed()
    hook._say_per_batch_means(_trainer(module, [64, 64]), [64, 64])  # equal: nothing
    assert said == []
    hook._say_per_batch_means(_trainer(module, [114, 14]), [114, 14])
    hook._say_per_batch_means(_trainer(module, [100, 28]), [100, 28])  # once per fit
    assert len(said) == 1 and "[114, 14]" in said[0] and "`train_loss`" in said[0]


def test_weighted_means_make_no_warning(monkeypatch):
    from lightning_hetero import callback

    said: list[str] = []
    monkeypatch.setattr(callback, "rank_zero_warn", said.append)
    module = torch.nn.Module()
    module.loss = MeanMetric()
    module.loss.update(torch.tensor(1.0), weight=32)
    HeteroCallback()._say_per_batch_means(_trainer(module, [40, 24]), [40, 24])
    assert said == []


@pytest.mark.parametrize("batch_sizes", [[3, 1], [1, 1]])
def test_only_weights_summing_to_the_update_count_read_as_unweighted(batch_sizes):
    # weighted by batch size, a 1-sample batch has weight 1: only where every batch had one
    # sample (a case without unequal batches to warn about) do the states look unweighted
    module = torch.nn.Module()
    module.loss = MeanMetric()
    for size in batch_sizes:
        module.loss.update(torch.tensor(1.0), weight=size)
    unweighted, _ = per_batch_means(module)
    assert unweighted == ([] if batch_sizes == [3, 1] else ["loss"])
