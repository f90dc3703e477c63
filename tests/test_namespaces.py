"""Both copies of Lightning: ``lightning.pytorch`` and ``pytorch_lightning`` (a separate copy
with its own classes and registry). Training runs through both are in
``tests/e2e/test_pytorch_lightning.py``; these check the machinery without a run."""

import pickle
import re
import subprocess
import sys
from datetime import timedelta
from types import ModuleType

import lightning.pytorch as L
import pytest
import pytorch_lightning as pl  # a dev extra (lightning 2.6 installs it too): never skipped
from lightning.fabric.plugins.environments import LightningEnvironment

import lightning_hetero
import lightning_hetero.pytorch_lightning as twin
from lightning_hetero import _namespaces
from lightning_hetero.emulate import Throttle
from lightning_hetero.progressive import Stage, SubStage

PACKAGE_MODULES = ("strategy", "callback", "emulate", "progressive", "_lightning", "_data")


def _trainer(trainer_class: type, strategy: object) -> object:
    return trainer_class(strategy=strategy, accelerator="cpu", devices=2, logger=False)


def test_lightning_facing_modules_are_found_from_their_source() -> None:
    facing = _namespaces.lightning_facing()
    assert set(PACKAGE_MODULES) <= facing
    # pure modules are shared by both copies, never loaded twice
    pure = {"sampler", "_comm", "_namespaces", "cursor", "planning", "modes"}
    pure |= {"collectives", "plan_state", "replan", "_probes", "resources", "paramserver"}
    assert not pure & facing


@pytest.mark.parametrize("name", sorted(_namespaces.lightning_facing()))
def test_twin_source_imports_only_pytorch_lightning(name: str) -> None:
    source = _namespaces.twin_source(name)
    assert not re.search(r"\blightning\.(pytorch|fabric)\b", source)
    facing = "|".join(_namespaces.lightning_facing())
    assert not re.search(rf"^\s*(from|import) lightning_hetero\.({facing})\b", source, re.M)
    original = (_namespaces._ROOT / f"{name}.py").read_text()
    assert source.count("\n") == original.count("\n")  # tracebacks point at the right lines


def test_twins_are_built_on_pytorch_lightning_and_share_pure_modules() -> None:
    assert issubclass(twin.HeteroStrategy, pl.strategies.DDPStrategy)
    assert issubclass(twin.HeteroCallback, pl.Callback)
    assert issubclass(twin.emulate.Throttle, pl.Callback)
    assert issubclass(twin.ProgressiveSchedule, pl.Callback)
    assert not issubclass(twin.HeteroCallback, L.Callback)
    assert set(twin.__all__) == set(lightning_hetero.__all__)
    assert twin.__version__ == lightning_hetero.__version__
    assert twin.planning is lightning_hetero.planning
    for name in PACKAGE_MODULES:
        original = sys.modules[f"lightning_hetero.{name}"]
        copy = sys.modules[f"lightning_hetero.pytorch_lightning.{name}"]
        assert copy.__file__ == original.__file__
        for attribute, value in vars(original).items():
            module = value if isinstance(value, ModuleType) else None
            home = getattr(value, "__module__", None) if module is None else module.__name__
            shared = isinstance(home, str) and (
                home.split(".")[0] in ("torch", "typing", "collections")
                or home.startswith("lightning_hetero.")
                and home.split(".")[1] not in _namespaces.lightning_facing()
                and home.split(".")[1] != "pytorch_lightning"
            )
            if shared and isinstance(value, (type, ModuleType)):
                assert getattr(copy, attribute) is value, (name, attribute)


def test_hetero_is_registered_in_both_registries() -> None:
    for registry, expected in [
        (L.strategies.StrategyRegistry, lightning_hetero.HeteroStrategy),
        (pl.strategies.StrategyRegistry, twin.HeteroStrategy),
    ]:
        for name in ["hetero", *_namespaces.strategy_aliases(lightning_hetero.HeteroStrategy)]:
            assert type(registry.get(name)) is expected, name
    assert "lightning_hetero.heterostrategy" in _namespaces.strategy_aliases(
        lightning_hetero.HeteroStrategy
    )


def test_import_loads_the_twins_only_when_used() -> None:
    code = (
        "import sys, lightning_hetero, pytorch_lightning as pl;"
        "assert 'hetero' in pl.strategies.StrategyRegistry;"
        "assert 'lightning_hetero.pytorch_lightning.strategy' not in sys.modules;"
        "s = pl.strategies.StrategyRegistry.get('hetero');"
        "assert type(s).__module__ == 'lightning_hetero.pytorch_lightning.strategy'"
    )
    subprocess.run([sys.executable, "-c", code], check=True, timeout=120)


@pytest.mark.parametrize(
    ("trainer_class", "built", "bound"),
    [
        (pl.Trainer, lightning_hetero.HeteroStrategy, twin.HeteroStrategy),
        (L.Trainer, twin.HeteroStrategy, lightning_hetero.HeteroStrategy),
        (pl.Trainer, twin.HeteroStrategy, twin.HeteroStrategy),
        (L.Trainer, lightning_hetero.HeteroStrategy, lightning_hetero.HeteroStrategy),
    ],
)
def test_a_strategy_object_binds_to_the_trainer_that_takes_it(trainer_class, built, bound):
    strategy = built(batch_sizes=[3, 5], adjust_every=2, timeout=timedelta(seconds=60))
    strategy.note = "kept"  # set by the user after construction
    trainer = _trainer(trainer_class, strategy)
    assert trainer.strategy is strategy
    assert type(strategy) is bound
    assert strategy.batch_sizes == [3, 5]
    assert strategy.adjust_every == 2
    assert strategy._timeout == timedelta(seconds=60)
    assert strategy.note == "kept"
    assert trainer.world_size == 2
    assert strategy.launcher is not None
    assert _namespaces.namespace_of(strategy.launcher) == _namespaces.namespace_of(trainer)
    # ddp_spawn pickles the strategy; a bound one unpickles as its new class
    assert type(pickle.loads(pickle.dumps(strategy))) is bound


def test_callbacks_follow_the_strategy() -> None:
    callbacks = [
        lightning_hetero.HeteroCallback(tensorboard_layout=False),
        Throttle(sample_cost=[0.0, 0.01]),
        lightning_hetero.ProgressiveSchedule([Stage(0.1, [SubStage(1, 8, 0.1)])]),
    ]
    _namespaces.rebind_callbacks(callbacks, _namespaces.PYTORCH_LIGHTNING)
    assert [type(cb) for cb in callbacks] == [
        twin.HeteroCallback,
        twin.emulate.Throttle,
        twin.ProgressiveSchedule,
    ]
    assert callbacks[0].tensorboard_layout is False
    assert callbacks[1].cost(rank=1, epoch=0) == 0.01


def test_a_users_subclass_cannot_change_copy_and_says_what_to_import() -> None:
    class MyStrategy(lightning_hetero.HeteroStrategy):
        pass

    with pytest.raises(
        TypeError, match=r"subclass lightning_hetero\.pytorch_lightning\.HeteroStrategy"
    ):
        _trainer(pl.Trainer, MyStrategy())


def test_plugins_of_the_other_copy_are_refused_with_the_import_to_use() -> None:
    strategy = lightning_hetero.HeteroStrategy(cluster_environment=LightningEnvironment())
    with pytest.raises(
        TypeError, match=r"LightningEnvironment.*lightning_hetero\.pytorch_lightning"
    ):
        _trainer(pl.Trainer, strategy)


def test_a_module_of_the_other_copy_is_refused_with_the_import_to_use() -> None:
    with pytest.raises(TypeError, match=r"lightning_hetero\.pytorch_lightning\.HeteroStrategy"):
        lightning_hetero.HeteroStrategy().connect(pl.LightningModule())
    with pytest.raises(TypeError, match=r"Use lightning_hetero\.HeteroStrategy with"):
        twin.HeteroStrategy().connect(L.LightningModule())
