"""The engine: the one run context it makes at set-up and hands to the re-planner, the mode
and the probes, and what it keeps for the user (one process, a real Trainer)."""

import dataclasses
import inspect
import subprocess
import sys
import typing

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from lightning.pytorch.strategies import Strategy
from torch.utils.data import DataLoader

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy
from lightning_hetero._comm import HostStepTimer
from lightning_hetero.bench.run import child_env
from lightning_hetero.context import RunContext
from lightning_hetero.engine import HeteroOptions, hetero_parts
from lightning_hetero.modes import ModeOptions
from lightning_hetero.modes.bsp import SynchronousMode
from lightning_hetero.plan_state import PlanState
from lightning_hetero.planning import PlanError


class _Recording(BoringModel):
    """Notes, at each training batch, where the run context says training is."""

    def __init__(self) -> None:
        super().__init__()
        self.positions: list[tuple[int, int]] = []
        self.expected: list[tuple[int, int]] = []

    def train_dataloader(self) -> DataLoader:
        return DataLoader(RandomDataset(32, 24), batch_size=4)

    def on_train_batch_start(self, batch, batch_idx) -> None:
        ctx = self.trainer.strategy.context
        assert ctx.position() == (ctx.epoch, ctx.global_step)
        self.positions.append((ctx.epoch, ctx.global_step))
        self.expected.append((self.trainer.current_epoch, self.trainer.global_step))


def _fit(strategy: Strategy, epochs: int = 2) -> tuple[pl.Trainer, _Recording]:
    model = _Recording()
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return trainer, model


def _holders_of(obj: object, kind: type, seen: set[int] | None = None, depth: int = 0) -> list:
    """Paths to attributes of ``obj`` (through its fields, lists and dicts) of ``kind``."""
    seen = set() if seen is None else seen
    if id(obj) in seen or depth > 4:
        return []
    seen.add(id(obj))
    found = []
    if isinstance(obj, dict):
        children = obj.items()
    elif isinstance(obj, (list, tuple)):
        children = enumerate(obj)
    elif hasattr(obj, "__dict__") and not isinstance(obj, (torch.nn.Module, type)):
        children = vars(obj).items()
    else:
        return []
    for key, value in children:
        if isinstance(value, kind):
            found.append(key)
            continue  # what it holds is its own (a strategy holds its micro-batch executor)
        found += [f"{key}.{p}" for p in _holders_of(value, kind, seen, depth + 1)]
    return found


def test_options_are_checked_and_the_parts_built_before_lightning_builds_the_strategy():
    mode, state = hetero_parts("bsp", ModeOptions(), HeteroOptions(batch_sizes=[3, 5]))
    assert isinstance(mode, SynchronousMode) and mode.context is None
    assert isinstance(state, PlanState) and state.initial == [3, 5]
    with pytest.raises(ValueError, match="smoothing"):
        hetero_parts("bsp", ModeOptions(), HeteroOptions(smoothing=1.0))


def test_collectives_and_timer_before_set_up_fail_naming_the_step_that_makes_them():
    strategy = HeteroStrategy()
    assert strategy.context is None
    with pytest.raises(RuntimeError, match="HeteroStrategy has no run yet.*setup_environment"):
        strategy.comm  # noqa: B018
    with pytest.raises(RuntimeError, match="setup_environment"):
        strategy.timer  # noqa: B018


@pytest.mark.parametrize("strategy_class", [HeteroStrategy, HeteroFSDPStrategy])
def test_one_context_is_shared_by_the_re_planner_and_the_mode_and_none_holds_the_strategy(
    strategy_class,
):
    strategy = strategy_class()
    trainer, model = _fit(strategy)
    ctx = strategy.context
    assert isinstance(ctx, RunContext)
    assert (ctx.rank, ctx.world_size, ctx.local_rank) == (0, 1, 0)
    assert ctx.device == torch.device("cpu") and ctx.devices == [torch.device("cpu")]
    assert ctx.plan_state is strategy.plan_state and ctx.module is model
    assert ctx.optimizers == trainer.optimizers and len(ctx.optimizers) == 1
    assert strategy.replanner.context is ctx and strategy.training_mode.context is ctx
    assert strategy.comm is ctx.comm is strategy.comm  # one collectives object for the run
    assert strategy.timer is ctx.timer and isinstance(ctx.timer, HostStepTimer)
    # training is where the trainer says, at every batch: the epoch and the global step (12
    # optimizer steps over two epochs of 6 batches, where a batch index restarts each epoch)
    assert model.positions == model.expected and len(model.positions) == 12
    assert model.positions[-1] == (1, 11)
    # the parts reach the run through the context only: no reference back to the strategy
    for part in (strategy.replanner, strategy.training_mode, ctx):
        assert _holders_of(part, Strategy) == [], type(part).__name__


def test_the_checker_finds_a_strategy_held_anywhere_in_a_part():
    # the check above would pass vacuously if it could not see a held strategy
    strategy = HeteroStrategy()
    part = type("Part", (), {})()
    part.hooks = {"on_end": [strategy]}
    assert _holders_of(part, Strategy) == ["hooks.on_end.0"]


def test_a_plan_applied_through_the_strategy_is_checked_and_applied_by_the_re_planner():
    strategy = HeteroStrategy()
    _fit(strategy, epochs=1)
    strategy.apply_plan([4])  # from the next epoch
    assert strategy.batch_sizes == [4] and strategy.training_mode.sampler.plan_at(0) == [4]
    with pytest.raises(PlanError, match="sums to 5"):
        strategy.apply_plan([5])
    assert strategy.batch_sizes == [4]


def test_a_new_fit_makes_a_new_context_and_keeps_what_the_user_set_before():
    strategy = HeteroStrategy()
    strategy.restore_plan([4])
    state = strategy.plan_state
    trainer, model = _fit(strategy, epochs=1)
    first = strategy.context
    assert state.restored == [4] and strategy.plan_state is state
    trainer.fit_loop.max_epochs = 2
    trainer.fit(model)  # a second run of the same trainer sets up again
    assert strategy.context is not first and strategy.context.plan_state is state
    assert strategy.replanner.context is strategy.context
    assert strategy.training_mode.context is strategy.context


def test_a_bare_strategy_that_was_never_set_up_reduces_as_ddp():
    strategy = HeteroStrategy()
    assert strategy.reduce(torch.tensor(2.0)).item() == 2.0


@pytest.mark.parametrize("strategy_class", [HeteroStrategy, HeteroFSDPStrategy])
def test_each_strategy_takes_the_shared_options_with_their_defaults_and_types(strategy_class):
    parameters = inspect.signature(strategy_class.__init__).parameters
    hints = typing.get_type_hints(strategy_class.__init__)
    shared = typing.get_type_hints(HeteroOptions)
    for option in dataclasses.fields(HeteroOptions):
        parameter = parameters[option.name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, option.name
        assert parameter.default == option.default, option.name
        assert hints[option.name] == shared[option.name], option.name
    # and what is given arrives: the strategy keeps each option as given
    with pytest.warns(FutureWarning, match=r"^hetero: `smoothing=0.25` has no effect"):
        strategy = strategy_class(smoothing=0.25, shuffle=False, deadband=0.1)
    assert (strategy.smoothing, strategy.shuffle, strategy.deadband) == (0.25, False, 0.1)
    assert strategy.replanner.smoothing == 0.25


def test_a_process_group_of_another_size_made_by_another_launcher_is_refused():
    # as under Ray Train without its prepare_trainer: the group exists before Lightning's
    # set-up, with another number of ranks than the strategy counts
    code = """
import torch, torch.distributed as dist
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.accelerators import CPUAccelerator
from lightning_hetero import HeteroStrategy

dist.init_process_group("gloo", init_method="tcp://127.0.0.1:29517", rank=0, world_size=1)
devices = [torch.device("cpu")] * 2
strategy = HeteroStrategy(CPUAccelerator(), devices, LightningEnvironment())
try:
    strategy.setup_environment()
except RuntimeError as err:
    print("refused:", err)
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert "refused: HeteroStrategy counts 2 rank(s)" in proc.stdout, proc.stdout
    assert "has 1: another launcher made it" in proc.stdout
    assert "RayHeteroStrategy" in proc.stdout
