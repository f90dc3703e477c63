"""HeteroFSDPStrategy's construction: registered, typed, and bad input refused at once."""

import pytest
import torch
from lightning.pytorch.strategies import StrategyRegistry

from lightning_hetero import HeteroFSDPStrategy
from lightning_hetero.modes import ShardedMode


def test_it_is_registered_as_hetero_fsdp_and_runs_the_sharded_mode():
    assert StrategyRegistry["hetero_fsdp"]["strategy"] is HeteroFSDPStrategy
    strategy = HeteroFSDPStrategy(batch_sizes=[3, 5], adjust_every=2, deadband=0.1)
    assert type(strategy.training_mode) is ShardedMode
    assert strategy.controller.deadband == 0.1 and strategy.batch_sizes == [3, 5]


@pytest.mark.parametrize(
    ("options", "error", "message"),
    [
        ({"tensor_parallel_size": 2}, ValueError, "tensor_parallel_size=2.*not supported"),
        ({"mode": "async"}, ValueError, r"mode='bsp' only.*HeteroStrategy\(mode='async'\)"),
        ({"weighted": False}, TypeError, r"\['weighted'\].*HeteroStrategy's DDP modes"),
        ({"gamma": 0.5, "delta": 0}, TypeError, r"\['delta', 'gamma'\]"),
        ({"lookahead": False}, TypeError, r"\['lookahead'\].*HeteroStrategy's DDP modes"),
        ({"shard_modules": [torch.nn.Linear]}, TypeError, "class names"),
        ({"controller": "dual"}, ValueError, "DualBatchController runs under mode='async' only"),
        ({"adjust_every": 0}, ValueError, "adjust_every"),
        ({"memory_safety": 0}, ValueError, "memory_safety"),
        ({"shard_module": ["Block"]}, TypeError, "'shard_module'. Did you mean 'shard_modules'"),
        ({"bogus": 1}, TypeError, r"unknown option 'bogus'\. Its options"),
    ],
)
def test_bad_options_are_refused_at_construction(options, error, message):
    with pytest.raises(error, match=message):
        HeteroFSDPStrategy(**options)


def test_a_model_in_another_parallelism_is_refused_with_its_name():
    strategy = HeteroFSDPStrategy()
    wrapped = torch.nn.Sequential(torch.nn.Linear(2, 2))
    wrapped.inner = torch.nn.parallel.DistributedDataParallel.__new__(
        torch.nn.parallel.DistributedDataParallel
    )
    torch.nn.Module.__init__(wrapped.inner)
    with pytest.raises(TypeError, match="Sequential holds a DistributedDataParallel"):
        strategy._shard(wrapped)


def test_lightning_cli_builds_it_by_name_and_by_class_path_with_options():
    from tests.test_strategy import _cli

    cli = _cli(
        ["--trainer.strategy=hetero_fsdp", "--trainer.accelerator=cpu", "--trainer.devices=1"]
    )
    assert isinstance(cli.trainer.strategy, HeteroFSDPStrategy)
    cli = _cli(
        [
            "--trainer.strategy=lightning_hetero.HeteroFSDPStrategy",
            "--trainer.strategy.shard_modules=[Linear]",
            "--trainer.strategy.max_batch_size=auto",
            "--trainer.strategy.adjust_every=4",
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
        ]
    )
    strategy = cli.trainer.strategy
    assert isinstance(strategy, HeteroFSDPStrategy)
    assert strategy.shard_modules == ["Linear"] and strategy.adjust_every == 4
    assert strategy.plan_state.max_batch_size == "auto"


def test_sync_batchnorm_is_applied_before_sharding_not_dropped(tmp_path):
    # ModelParallelStrategy leaves `Trainer(sync_batchnorm=True)` unapplied; SyncBatchNorm
    # computes statistics over the union batch whatever each rank's share. It runs on GPUs
    # only (it raises on CPU), so the run stops once set up.
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset

    class Normed(BoringModel):
        def __init__(self) -> None:
            super().__init__()
            self.layer = torch.nn.Sequential(torch.nn.Linear(32, 2), torch.nn.BatchNorm1d(2))

        def train_dataloader(self):
            return torch.utils.data.DataLoader(RandomDataset(32, 16), batch_size=4)

        def on_train_start(self) -> None:
            raise _SetUp(type(self.layer[1]))

    trainer = pl.Trainer(
        strategy=HeteroFSDPStrategy(),
        accelerator="cpu",
        devices=1,
        sync_batchnorm=True,
        max_steps=1,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
    )
    with pytest.raises(_SetUp) as stopped:
        trainer.fit(Normed())
    assert stopped.value.args[0] is torch.nn.SyncBatchNorm


class _SetUp(Exception):
    pass


def test_every_rank_gets_the_launchers_cpu_threads(monkeypatch):
    # ModelParallelStrategy sets cores // processes threads on the launching rank only (its
    # launcher): the ranks it starts kept every core and equal ranks computed at unequal speeds
    from lightning.fabric.plugins.environments import LightningEnvironment
    from lightning.fabric.utilities.distributed import _suggested_max_num_threads
    from lightning.pytorch.strategies import ModelParallelStrategy

    monkeypatch.setenv("OMP_NUM_THREADS", "1")  # restored (or removed again) afterwards
    monkeypatch.delenv("OMP_NUM_THREADS")  # a started rank's environment
    monkeypatch.setenv("LOCAL_RANK", "1")
    monkeypatch.setattr(ModelParallelStrategy, "setup_environment", lambda self: None)
    threads = []
    monkeypatch.setattr(torch, "set_num_threads", threads.append)
    strategy = HeteroFSDPStrategy()
    strategy.cluster_environment = LightningEnvironment()
    strategy.parallel_devices = [torch.device("cpu")] * 2
    strategy.setup_environment()
    assert threads == [_suggested_max_num_threads(2)]
