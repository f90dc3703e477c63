"""Both copies of Lightning: ``lightning.pytorch`` and ``pytorch_lightning`` (a separate copy
with its own classes and registry). Training runs through both are in
``tests/e2e/test_pytorch_lightning.py``; these check the machinery without a run."""

import difflib
import operator
import os
import pickle
import re
import subprocess
import sys
from datetime import timedelta
from pathlib import Path
from types import ModuleType
from unittest import mock

import lightning.pytorch as L
import pytest
import pytorch_lightning as pl  # a dev extra (lightning 2.6 installs it too): never skipped
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning_utilities.core.imports import compare_version
from pytorch_lightning.demos.boring_classes import BoringModel

import lightning_hetero
import lightning_hetero.pytorch_lightning as twin
from lightning_hetero import _generate, _namespaces
from lightning_hetero.emulate import Throttle

PACKAGE_MODULES = ("strategy", "callback", "emulate", "progressive", "_lightning", "_data")


def _trainer(trainer_class: type, strategy: object) -> object:
    return trainer_class(strategy=strategy, accelerator="cpu", devices=2, logger=False)


# ---------------------------------------------------------------- the generated twins
def test_the_checked_in_twins_are_generated_from_the_current_sources(tmp_path: Path) -> None:
    _generate.generate(tmp_path)
    stale = []
    for name in _namespaces.TWINNED:
        checked_in = _generate.TWIN_DIR / f"{name}.py"
        expected = (tmp_path / f"{name}.py").read_text(encoding="utf-8")
        found = checked_in.read_text(encoding="utf-8") if checked_in.exists() else ""
        if found != expected:
            diff = difflib.unified_diff(
                found.splitlines(), expected.splitlines(), str(checked_in), "generated", n=1
            )
            stale.append("\n".join(list(diff)[:20]))
    leftover = [
        path.name
        for path in _generate.TWIN_DIR.glob("*.py")
        if path.read_text(encoding="utf-8").startswith("# Generated from")
        and path.stem not in _namespaces.TWINNED
    ]
    assert not stale and not leftover, (
        f"lightning_hetero/pytorch_lightning is stale (left over: {leftover}): run"
        " `make generate` and commit the result.\n" + "\n".join(stale)
    )


# ---------------------------------------------------------------- the part options' declarations
def test_the_part_options_keywords_docstring_entries_and_rows_are_generated_from_their_fields():
    stale = [
        path.name
        for path, text in _generate.option_declarations().items()
        if path.read_text(encoding="utf-8") != text
    ]
    assert not stale, f"{stale} are stale: run `make generate` and commit the result."
    # read from the fields, in group order: the type and default as written there
    options = {option.name: option for option in _generate.part_options()}
    assert list(options)[:3] == ["lookahead", "epoch_average", "rpc_timeout"]
    assert options["local_steps"].annotation == 'Literal["equal", "proportional"]'
    assert options["local_steps"].default == '"proportional"'
    assert options["outer_lr"].doc.startswith("local: DiLoCo's outer optimizer")
    assert "\n" not in options["lookahead"].doc  # one paragraph


def test_a_new_part_option_is_written_into_all_three_declarations(monkeypatch) -> None:
    # the three edits of a new option (field, check, use) and `make generate`: nothing else
    real = _generate.part_options()
    new = _generate.PartOption("merge_every", "int", "2", "local: merge every N [x](../a.md).")
    monkeypatch.setattr(_generate, "part_options", lambda: [*real, new])
    texts = _generate.option_declarations()
    strategy, page = texts[_generate.STRATEGY], texts[_generate.OPTIONS_PAGE]
    assert "        merge_every: int = 2,\n        **kwargs: Any," in strategy
    assert "        merge_every: local: merge every N [x](../a.md).\n        **kwargs:" in strategy
    assert "| `merge_every` | `2` | local: merge every N [x](a.md). |" in page


def test_part_options_out_of_one_block_or_declared_otherwise_are_refused(
    monkeypatch, tmp_path: Path
) -> None:
    text = "        gamma: 1,\n        mode: 2,\n        delta: 3,"
    with pytest.raises(ValueError, match="must stand together"):
        _generate._replace_entries(
            text, _generate._KEYWORD, None, {"gamma", "delta"}, [], "the signature"
        )
    source = _generate._GROUPS_SOURCE.read_text(encoding="utf-8")
    plain = tmp_path / "base.py"
    plain.write_text(
        source.replace("delta: float = option(0.1, example=0.2)", "delta: float = 0.1")
    )
    assert plain.read_text() != source
    monkeypatch.setattr(_generate, "_GROUPS_SOURCE", plain)
    with pytest.raises(ValueError, match=r"MergeOptions.delta .* must be declared as `option"):
        _generate.part_options()


def test_every_module_that_uses_lightning_is_twinned() -> None:
    facing = _generate.lightning_facing()
    twinned = {f"lightning_hetero.{name}" for name in _namespaces.TWINNED}
    missing = {name: why for name, why in facing.items() if name not in twinned}
    assert not missing, (
        f"{missing} use Lightning but have no pytorch_lightning twin: add them to"
        " lightning_hetero._namespaces.TWINNED and run `make generate`."
    )
    assert not twinned - set(facing), f"{twinned - set(facing)} no longer use Lightning"
    assert set(PACKAGE_MODULES) <= set(_namespaces.TWINNED)
    # pure modules are shared by both copies, never generated twice
    pure = {"sampler", "_comm", "_namespaces", "_generate", "cursor", "planning", "modes"}
    pure |= {"collectives", "plan_state", "replan", "_probes", "resources", "paramserver"}
    pure |= {"memory_probe", "_cgroup"}
    assert not pure & set(_namespaces.TWINNED)


def test_a_submodule_import_is_pure_and_a_public_name_is_not(tmp_path: Path) -> None:
    pure, public = tmp_path / "pure.py", tmp_path / "public.py"
    pure.write_text("from lightning_hetero import _cgroup, planning\n")
    public.write_text("from lightning_hetero import HeteroStrategy\n")
    assert _generate.runtime_imports(pure).modules == {
        "lightning_hetero._cgroup",
        "lightning_hetero.planning",
    }
    assert _generate.runtime_imports(public).modules == {"lightning_hetero"}


@pytest.mark.parametrize("name", _namespaces.TWINNED)
def test_twin_source_imports_only_pytorch_lightning(name: str) -> None:
    source = _generate.twin_source(name)
    assert source.startswith(
        f"# Generated from lightning_hetero/{name}.py by `make generate`; do not edit."
    )
    assert not re.search(r"\blightning\.(pytorch|fabric)\b", source)
    facing = "|".join(_namespaces.TWINNED)
    assert not re.search(rf"^\s*(from|import) lightning_hetero\.({facing})\b", source, re.M)
    original = (_generate.ROOT / f"{name}.py").read_text()
    # after the two header lines, line for line: a twin's line N + 2 is the source's line N
    assert source.count("\n") == original.count("\n") + 2


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
        assert Path(copy.__file__) == _generate.TWIN_DIR / f"{name}.py"
        for attribute, value in vars(original).items():
            module = value if isinstance(value, ModuleType) else None
            home = getattr(value, "__module__", None) if module is None else module.__name__
            shared = isinstance(home, str) and (
                home.split(".")[0] in ("torch", "typing", "collections")
                or home.startswith("lightning_hetero.")
                and home.split(".")[1] not in _namespaces.TWINNED
                and home.split(".")[1] != "pytorch_lightning"
            )
            if shared and isinstance(value, (type, ModuleType)):
                assert getattr(copy, attribute) is value, (name, attribute)


# ---------------------------------------------------------------- registries
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


_IMPORT_CHANGES_NOTHING = """
import logging, sys
import lightning.pytorch
import lightning_utilities.core.rank_zero as rank_zero
before = (rank_zero.log, rank_zero.rank_zero_deprecation_category)
import lightning_hetero
assert "pytorch_lightning" not in sys.modules  # its import takes over the rank-zero logger
assert (rank_zero.log, rank_zero.rank_zero_deprecation_category) == before
logging.getLogger("lightning.pytorch").setLevel(logging.ERROR)
assert not rank_zero.log.isEnabledFor(logging.INFO)  # the user's level quiets Lightning
"""


@pytest.mark.parametrize("order", ["package first", "pytorch_lightning first"])
def test_import_loads_the_twins_only_when_used(order: str) -> None:
    # issue 40, failure 8: importing the package imports no pytorch_lightning and leaves
    # Lightning's logging as it was; the twins are registered when the program imports it
    code = _IMPORT_CHANGES_NOTHING if order == "package first" else "import lightning_hetero\n"
    if order != "package first":
        code = "import pytorch_lightning\n" + code
    code += (
        "import pytorch_lightning as pl\n"
        "assert 'hetero' in pl.strategies.StrategyRegistry\n"
        "assert 'lightning_hetero.pytorch_lightning.strategy' not in sys.modules\n"
        "s = pl.strategies.StrategyRegistry.get('hetero')\n"
        "assert type(s).__module__ == 'lightning_hetero.pytorch_lightning.strategy'\n"
        "assert pl.__spec__.loader is pl.__loader__\n"
        "t = pl.Trainer(strategy='hetero', accelerator='cpu', devices=2, logger=False)\n"
        "assert type(t.strategy).__module__ == 'lightning_hetero.pytorch_lightning.strategy'\n"
    )
    subprocess.run([sys.executable, "-c", "import sys\n" + code], check=True, timeout=120)


# ---------------------------------------------------------------- one copy per object
@pytest.mark.parametrize(
    ("trainer_class", "built"),
    [(pl.Trainer, twin.HeteroStrategy), (L.Trainer, lightning_hetero.HeteroStrategy)],
)
def test_a_strategy_object_is_taken_as_it_is_by_its_copys_trainer(trainer_class, built):
    strategy = built(batch_sizes=[3, 5], adjust_every=2, timeout=timedelta(seconds=60))
    strategy.note = "kept"  # set by the user after construction
    trainer = _trainer(trainer_class, strategy)
    assert trainer.strategy is strategy
    assert type(strategy) is built
    assert strategy.batch_sizes == [3, 5]
    assert strategy.adjust_every == 2
    assert strategy._timeout == timedelta(seconds=60)
    assert strategy.note == "kept"
    assert trainer.world_size == 2
    assert strategy.launcher is not None
    assert _namespaces.namespace_of(strategy.launcher) == _namespaces.namespace_of(trainer)
    # ddp_spawn pickles the strategy
    assert type(pickle.loads(pickle.dumps(strategy))) is built


@pytest.mark.parametrize(
    ("trainer_class", "built", "message"),
    [
        (
            pl.Trainer,
            lightning_hetero.HeteroStrategy,
            "HeteroStrategy from `lightning_hetero` is built on lightning.pytorch;"
            " pytorch_lightning's Trainer needs"
            " `lightning_hetero.pytorch_lightning.HeteroStrategy`",
        ),
        (
            L.Trainer,
            twin.HeteroStrategy,
            "HeteroStrategy from `lightning_hetero.pytorch_lightning` is built on"
            " pytorch_lightning; lightning.pytorch's Trainer needs"
            " `lightning_hetero.HeteroStrategy`",
        ),
        (
            pl.Trainer,
            lightning_hetero.HeteroFSDPStrategy,
            "pytorch_lightning's Trainer needs"
            " `lightning_hetero.pytorch_lightning.HeteroFSDPStrategy` (or pass"
            " `strategy='hetero_fsdp'`",
        ),
    ],
)
def test_a_strategy_object_of_the_other_copy_is_refused_with_the_import_to_use(
    trainer_class, built, message
):
    strategy = built(batch_sizes=[3, 5], timeout=timedelta(seconds=60))
    before = dict(vars(strategy))
    with pytest.raises(TypeError, match=re.escape(message)):
        _trainer(trainer_class, strategy)
    assert type(strategy) is built
    assert vars(strategy) == before  # untouched: still usable with its own copy's Trainer


@pytest.mark.parametrize(
    ("own_trainer", "other_trainer", "package"),
    [(L.Trainer, pl.Trainer, lightning_hetero), (pl.Trainer, L.Trainer, twin)],
)
def test_state_set_before_fit_is_kept(own_trainer, other_trainer, package) -> None:
    strategy = package.HeteroStrategy()
    strategy.restore_plan([3, 5])
    plan_state, replanner, history = strategy.plan_state, strategy.replanner, strategy.history
    with pytest.raises(TypeError, match="Trainer needs"):
        _trainer(other_trainer, strategy)
    assert type(strategy) is package.HeteroStrategy
    trainer = _trainer(own_trainer, strategy)
    assert trainer.strategy is strategy
    assert strategy.plan_state is plan_state and strategy.replanner is replanner
    assert strategy.history is history
    assert strategy.plan_state.restored == [3, 5]


def _callbacks(package: ModuleType) -> list[object]:
    return [
        package.HeteroCallback(tensorboard_layout=False),
        package.emulate.Throttle(sample_cost=[0.0, 0.01]),
        package.ProgressiveSchedule([package.Stage(0.1, [package.SubStage(1, 8, 0.1)])]),
    ]


@pytest.mark.parametrize(
    ("index", "expected"),
    [
        (0, "lightning_hetero.pytorch_lightning.HeteroCallback"),
        (1, "lightning_hetero.pytorch_lightning.emulate.Throttle"),
        (2, "lightning_hetero.pytorch_lightning.ProgressiveSchedule"),
    ],
)
def test_callbacks_of_the_other_copy_are_refused_with_the_import_to_use(index, expected):
    callback = _callbacks(lightning_hetero)[index]
    with pytest.raises(TypeError, match=rf"Trainer needs `{re.escape(expected)}`"):
        _namespaces.check_callbacks([callback], _namespaces.PYTORCH_LIGHTNING)
    assert _namespaces.namespace_of(callback) == _namespaces.LIGHTNING
    _namespaces.check_callbacks(_callbacks(lightning_hetero), _namespaces.LIGHTNING)
    _namespaces.check_callbacks(_callbacks(twin), _namespaces.PYTORCH_LIGHTNING)


def test_a_callback_of_the_other_copy_stops_the_run_before_it_starts(tmp_path: Path) -> None:
    callback = Throttle(sample_cost=[0.0, 0.01])
    options = dict(
        strategy=twin.HeteroStrategy(),
        callbacks=[callback],
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        default_root_dir=tmp_path,
    )
    if compare_version("pytorch_lightning", operator.lt, "2.6"):
        # before 2.6, pytorch_lightning's Trainer(...) refuses any callback that is not its own
        # Callback itself, before lightning_hetero sees it, with its own message
        with pytest.raises(ValueError, match="Expected a parent"):
            pl.Trainer(**options)
        return
    trainer = pl.Trainer(**options)
    with (
        mock.patch.dict(os.environ),  # the launcher exports the ranks' variables
        pytest.raises(TypeError, match=r"`lightning_hetero\.pytorch_lightning\.emulate\.Throttle`"),
    ):
        trainer.fit(BoringModel())
    assert type(callback) is Throttle


def test_a_users_subclass_cannot_change_copy_and_says_what_to_import() -> None:
    class MyStrategy(lightning_hetero.HeteroStrategy):
        pass

    with pytest.raises(
        TypeError, match=r"subclass lightning_hetero\.pytorch_lightning\.HeteroStrategy"
    ):
        _trainer(pl.Trainer, MyStrategy())


def test_a_strategy_holding_plugins_of_its_copy_is_refused_with_the_import_to_use() -> None:
    # the Trainer reads the strategy's plugins before it sets the accelerator
    strategy = lightning_hetero.HeteroStrategy(cluster_environment=LightningEnvironment())
    with pytest.raises(TypeError, match=r"needs `lightning_hetero\.pytorch_lightning\."):
        _trainer(pl.Trainer, strategy)
    assert isinstance(strategy.cluster_environment, LightningEnvironment)


def test_a_module_of_the_other_copy_is_refused_with_the_import_to_use() -> None:
    with pytest.raises(TypeError, match=r"lightning_hetero\.pytorch_lightning\.HeteroStrategy"):
        lightning_hetero.HeteroStrategy().connect(pl.LightningModule())
    with pytest.raises(TypeError, match=r"Use lightning_hetero\.HeteroStrategy with"):
        twin.HeteroStrategy().connect(L.LightningModule())
