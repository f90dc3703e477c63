"""``HeteroStrategy.set_input_scale``: the batch follows the per-sample input size."""

import lightning.pytorch as pl
import pytest
from lightning.pytorch.demos.boring_classes import RandomDataset
from torch.utils.data import DataLoader

from lightning_hetero import HeteroStrategy
from tests.test_strategy import _fit


class _Rescale(pl.Callback):
    """Calls ``set_input_scale`` with ``scales[e]`` at the end of epoch ``e`` (``-1``: at fit
    start) and records the batch sizes each epoch trains on."""

    def __init__(self, scales):
        self.scales = scales
        self.sizes: dict[int, set[int]] = {}

    def on_fit_start(self, trainer, pl_module):
        if -1 in self.scales:
            trainer.strategy.set_input_scale(*self.scales[-1])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.sizes.setdefault(trainer.current_epoch, set()).add(len(batch))

    def on_train_epoch_end(self, trainer, pl_module):
        if trainer.current_epoch in self.scales:
            trainer.strategy.set_input_scale(*self.scales[trainer.current_epoch])


def _loader():
    return DataLoader(RandomDataset(32, 64), batch_size=8)


def _run(scales, **kwargs):
    """Two epochs with ``_Rescale(scales)``."""
    record = _Rescale(scales)
    trainer = _fit(_loader, callbacks=[record], **kwargs)
    return record, trainer


def test_smaller_inputs_get_a_proportionally_larger_batch_from_the_next_epoch():
    record, trainer = _run({0: (0.25,)})
    assert record.sizes == {0: {8}, 1: {32}}
    assert trainer.strategy.limits.global_batch_size == 32
    assert trainer.strategy.batch_sizes == [32]


def test_an_explicit_global_batch_wins_and_scale_one_goes_back():
    record = _Rescale({0: (0.25, 16), 1: (1.0,)})
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=HeteroStrategy(),
        max_epochs=3,
        callbacks=[record],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    from tests.test_strategy import _Model

    trainer.fit(_Model(_loader))
    assert record.sizes == {0: {8}, 1: {16}, 2: {8}}


def test_a_scale_set_before_the_first_loader_applies_from_epoch_zero():
    record, _ = _run({-1: (0.5,)})
    assert record.sizes == {0: {16}, 1: {16}}


def test_measured_memory_maximums_follow_the_scale():
    record, trainer = _run({0: (0.5,)}, max_batch_size="auto", probe_batch_sizes=[2, 4, 8])
    probe = trainer.strategy.memory_probe
    assert probe["max_batch_sizes"] == [8]  # measured at scale 1 (capped at B)
    assert trainer.strategy.limits.max_batch_size == [16]
    assert record.sizes[1] == {16}


def test_given_maximums_stay_and_cap_an_explicit_batch_with_an_error():
    from lightning_hetero.planning import PlanError

    with pytest.raises(PlanError, match="between the sum"):
        _run({0: (0.25, 32)}, max_batch_size=16)


@pytest.mark.parametrize("scale", [0.0, -1.0, float("nan"), float("inf")])
def test_bad_scales_are_refused(scale):
    with pytest.raises(ValueError, match="`scale`"):
        HeteroStrategy().set_input_scale(scale)


def test_bad_global_batch_is_refused():
    with pytest.raises(ValueError, match="global_batch_size"):
        HeteroStrategy().set_input_scale(0.5, global_batch_size=0)


def test_a_restored_plan_for_another_global_batch_keeps_its_proportions():
    from lightning.fabric.plugins.environments import LightningEnvironment

    environment = LightningEnvironment()
    environment.set_world_size(2)
    strategy = HeteroStrategy(cluster_environment=environment)
    strategy.restore_plan([12, 36])  # saved in a sub-stage with another input scale
    strategy.set_input_scale(0.5)  # this run starts at twice the batch of the loader's 2 x 8
    assert strategy.plan_state.resolve(8, strategy.world_size) == [8, 24]
    strategy.restore_plan([8, 24])
    assert strategy.plan_state.resolve(8, strategy.world_size) == [8, 24]  # same total: kept as is


def _two_ranks(**kwargs) -> HeteroStrategy:
    from lightning.fabric.plugins.environments import LightningEnvironment

    environment = LightningEnvironment()
    environment.set_world_size(2)
    return HeteroStrategy(cluster_environment=environment, **kwargs)


def test_an_explicit_plan_keeps_its_proportions_at_another_scale():
    strategy = _two_ranks(batch_sizes=[8, 24])
    strategy.set_input_scale(0.5)  # twice the global batch, split as the plan says
    assert strategy.plan_state.resolve(None, strategy.world_size) == [16, 48]


def test_a_derived_global_batch_never_falls_below_the_minimums():
    strategy = _two_ranks(batch_sizes=[2, 2], min_batch_size=2)
    strategy.set_input_scale(4.0)  # 4 / 4 = 1 sample, but each rank needs 2
    with pytest.warns(UserWarning, match="below the per-rank minimums' sum; using 4"):
        assert strategy.plan_state.resolve(None, strategy.world_size) == [2, 2]
