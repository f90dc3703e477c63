"""Dual batch size learning in HeteroStrategy: options, the partition sampler, the checks."""

from datetime import timedelta
from types import SimpleNamespace

import pytest
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hetero import HeteroStrategy
from lightning_hetero._data import refuse_step_counting
from lightning_hetero.planning import PlanError
from lightning_hetero.planning.dual import DualBatchController
from lightning_hetero.sampler import EpochPermutation, PartitionBatchSampler


def test_dual_runs_on_the_parameter_server_only():
    strategy = HeteroStrategy(mode="async", controller="dual")
    assert isinstance(strategy.controller, DualBatchController)
    for mode in ("bsp", "local"):
        with pytest.raises(ValueError, match="mode='async' with controller='dual'"):
            HeteroStrategy(mode=mode, controller="dual")
    with pytest.raises(ValueError, match="update_factor='none'"):
        HeteroStrategy(mode="async", controller=DualBatchController(), lr_scaling=False)


@pytest.mark.parametrize(
    ("trainer", "named"),
    [
        (dict(max_steps=10), "max_steps=10"),
        (dict(limit_train_batches=0.5), "limit_train_batches=0.5"),
        (dict(val_check_interval=0.25), "val_check_interval=0.25"),
        (
            dict(callbacks=[ModelCheckpoint(every_n_train_steps=5)]),
            r"ModelCheckpoint\(every_n_train_steps=5\)",
        ),
        (
            dict(callbacks=[ModelCheckpoint(train_time_interval=timedelta(minutes=1))]),
            r"ModelCheckpoint\(train_time_interval=0:01:00\)",
        ),
    ],
)
def test_step_counted_trainer_options_are_refused_with_dual(trainer, named):
    options = dict(max_steps=-1, limit_train_batches=1.0, val_check_interval=1.0, callbacks=[])
    fake_trainer = SimpleNamespace(**{**options, **trainer})
    strategy = HeteroStrategy(mode="async", controller="dual")
    with pytest.raises(ValueError, match=f"controller='dual'.*remove {named}"):
        refuse_step_counting(fake_trainer, strategy.training_mode.option_text())
    local = HeteroStrategy(mode="local")
    with pytest.raises(ValueError, match=f"mode='local'.*remove {named}"):
        refuse_step_counting(fake_trainer, local.training_mode.option_text())


@pytest.mark.parametrize("shuffle", [False, True])
@pytest.mark.parametrize("drop_last", [False, True])
def test_partition_sampler_covers_each_sample_once_in_each_ranks_own_batches(shuffle, drop_last):
    samples, batch_sizes = [40, 40, 31, 32], [16, 16, 7, 7]
    epoch = EpochPermutation(sum(samples), shuffle=shuffle, seed=3)
    seen: list[int] = []
    for rank, (count, size) in enumerate(zip(samples, batch_sizes)):
        sampler = PartitionBatchSampler(epoch, samples, batch_sizes, rank, drop_last=drop_last)
        batches = list(sampler)
        assert len(batches) == len(sampler)
        assert [len(b) for b in batches] == [sampler.size_at(s) for s in range(len(batches))]
        assert all(len(b) == size for b in batches[:-1])
        if drop_last:
            assert len(batches[-1]) == size and len(batches) == count // size
        else:
            assert sum(map(len, batches)) == count
        seen += [i for batch in batches for i in batch]
    if drop_last:
        assert len(set(seen)) == len(seen)
    else:
        assert sorted(seen) == list(range(sum(samples)))


def test_partition_sampler_follows_the_epoch():
    epoch = EpochPermutation(20, shuffle=True, seed=0)
    sampler = PartitionBatchSampler(epoch, [12, 8], [4, 4], rank=0)
    first = list(sampler)
    epoch.set_epoch(1)
    assert list(sampler) != first


@pytest.mark.parametrize(
    ("samples", "batch_sizes", "rank", "error", "message"),
    [
        ([10, 10], [4], 0, ValueError, "one of each per rank"),
        ([10, 10], [4, 4], 2, ValueError, "outside the plan"),
        ([20, 0], [4, 4], 0, PlanError, ">= 1 sample"),
        ([10, 9], [4, 4], 0, PlanError, "sum to 19"),
    ],
)
def test_partition_sampler_refuses_bad_shares(samples, batch_sizes, rank, error, message):
    with pytest.raises(error, match=message):
        PartitionBatchSampler(EpochPermutation(20), samples, batch_sizes, rank)
