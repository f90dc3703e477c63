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
        ({"shard_modules": [torch.nn.Linear]}, TypeError, "class names"),
        ({"controller": "dual"}, ValueError, "Dual batch size learning"),
        ({"adjust_every": 0}, ValueError, "adjust_every"),
        ({"memory_safety": 0}, ValueError, "memory_safety"),
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
