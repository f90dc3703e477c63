"""The package's shape: no import cycles, no mode names outside the modes, Lightning's private
attributes in one module."""

import ast
import importlib
import inspect
import re
import textwrap
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from lightning_utilities.core.imports import compare_version

import lightning_hetero
from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy, _lightning
from lightning_hetero._namespaces import SameCopy
from lightning_hetero.engine import HeteroEngine
from lightning_hetero.modes import MODES, VARIANTS

ROOT = Path(lightning_hetero.__file__).resolve().parent
PACKAGE = "lightning_hetero"


def _module_name(path: Path) -> str:
    parts = path.relative_to(ROOT.parent).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _sources() -> dict[str, Path]:
    return {_module_name(path): path for path in sorted(ROOT.rglob("*.py"))}


def _imports_of(path: Path, modules: set[str]) -> set[str]:
    """Our modules ``path`` imports anywhere: at the top, inside functions, under
    ``TYPE_CHECKING``."""
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
        names: list[str] = []
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names = [node.module] + [f"{node.module}.{alias.name}" for alias in node.names]
        found |= {name for name in names if name in modules}
    return found


def test_the_import_graph_has_no_cycle() -> None:
    sources = _sources()
    graph = {name: _imports_of(path, set(sources)) - {name} for name, path in sources.items()}
    assert graph["lightning_hetero.strategy"] >= {"lightning_hetero.modes"}  # the test sees edges
    done: set[str] = set()

    def visit(name: str, path: list[str]) -> None:
        if name in path:
            cycle = path[path.index(name) :] + [name]
            pytest.fail(f"import cycle: {' -> '.join(cycle)}")
        if name in done:
            return
        for other in sorted(graph[name]):
            visit(other, [*path, name])
        done.add(name)

    for name in sorted(graph):
        visit(name, [])


# the names that would mean a module branches on the mode it runs
_MODE_CLASSES = {cls.__name__ for cls in [*MODES.values(), *VARIANTS.values()]}
_MODE_OBJECTS = {
    "GlobalBatchSampler",
    "MegaBatchSampler",
    "PartitionBatchSampler",
    "DualBatchController",
    "ParameterServer",
    "ServerClient",
    "SharedCursor",
    "ReplicaMerger",
}


@pytest.mark.parametrize("module", ["strategy", "engine", "fsdp", "callback", "replan"])
def test_the_strategy_callback_and_replanner_know_no_mode(module: str) -> None:
    tree = ast.parse((ROOT / f"{module}.py").read_text(encoding="utf-8"))
    mode_names = set(MODES)
    problems = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Compare):
            operands = [node.left, *node.comparators]
            constants = {o.value for o in operands if isinstance(o, ast.Constant)}
            if constants & mode_names:
                problems.append(f"line {node.lineno}: compares with {constants & mode_names}")
        if isinstance(node, ast.Name) and node.id in _MODE_CLASSES | _MODE_OBJECTS:
            problems.append(f"line {node.lineno}: uses {node.id}")
        # storing the `mode` option is fine; reading it to branch is not (strategy.py names
        # it in an error message)
        reads = isinstance(node, ast.Attribute) and isinstance(node.ctx, ast.Load)
        if reads and node.attr == "mode" and module != "strategy":
            problems.append(f"line {node.lineno}: reads .mode")
    assert not problems, f"{module}.py tests the mode: {problems}"


def test_modes_import_no_lightning() -> None:
    """Modes are shared by both Lightning copies: they see the run through its context."""
    for path in sorted((ROOT / "modes").glob("*.py")):
        source = path.read_text(encoding="utf-8")
        assert not re.search(
            r"^\s*(from|import)\s+(lightning|pytorch_lightning)\b", source, re.M
        ), path.name


# ---------------------------------------------------------------- Lightning's internals
@pytest.mark.parametrize("package", ["lightning", "pytorch_lightning"])
def test_the_installed_lightning_is_a_supported_version(package: str) -> None:
    pytest.importorskip(package)
    for requirement in _lightning.SUPPORTED:
        op, version = re.match(r"([<>=!]+)(.+)", requirement).groups()
        assert compare_version(package, getattr(__import__("operator"), _OPS[op]), version), (
            f"{package} is outside lightning_hetero's supported range {_lightning.SUPPORTED}:"
            " check every helper of lightning_hetero/_lightning.py against it, then widen"
            " SUPPORTED."
        )


_OPS = {">=": "ge", "<": "lt", "<=": "le", ">": "gt"}
#: attributes that only newer Lightning releases have, with the release from which on they
#: must be there; the helper that uses each does without it before (its docstring says how)
_SINCE = {"_broadcast_sigterm_tensor": "2.6"}  # check_own_sigterm_only; 2.5.0 lacks it


def test_every_private_attribute_we_use_still_exists(tmp_path: Path) -> None:
    trainer = pl.Trainer(
        default_root_dir=tmp_path, max_epochs=1, limit_train_batches=1, logger=False
    )
    trainer.fit(BoringModel())  # after a fit, as our helpers see the loops
    for where, attribute in _lightning.PRIVATE_ATTRIBUTES:
        owner = trainer
        for part in filter(None, where.split(".")):
            owner = getattr(owner, part)
        since = _SINCE.get(attribute)
        if since is not None and compare_version("lightning", __import__("operator").lt, since):
            continue
        assert hasattr(owner, attribute), (
            f"Lightning {pl.__version__} has no {type(owner).__name__}.{attribute}, which"
            " lightning_hetero/_lightning.py relies on: adapt the helper that uses it."
        )
    strategies = {"DDPStrategy": DDPStrategy(), "ModelParallelStrategy": ModelParallelStrategy()}
    for owner, attribute in _lightning.SUBCLASS_ATTRIBUTES:
        assert hasattr(strategies[owner], attribute), (
            f"{owner} has no {attribute}, which our strategy built on it overrides or reads."
        )
    for module, name in _lightning.PRIVATE_FUNCTIONS:
        assert callable(getattr(importlib.import_module(module), name, None)), (
            f"Lightning {pl.__version__} has no {module}.{name}, which _lightning.py uses."
        )


_PRIVATE = {
    "fit_loop",
    "epoch_loop",
    "_logger_connector",
    "_data_connector",
    "_combined_loader",
    "_broadcast_sigterm_tensor",
    "_accelerator_connector",
    "_checkpoint_connector",
}


def test_lightning_private_attributes_are_used_in_one_module() -> None:
    users = {}
    for name, path in _sources().items():
        if name in (f"{PACKAGE}._lightning", f"{PACKAGE}.pytorch_lightning._lightning"):
            continue  # the module and its generated pytorch_lightning twin
        tree = ast.parse(path.read_text(encoding="utf-8"))
        used = {n.attr for n in ast.walk(tree) if isinstance(n, ast.Attribute)} & _PRIVATE
        if used:
            users[name] = sorted(used)
    assert not users, f"Lightning internals used outside lightning_hetero/_lightning.py: {users}"


def _statements(function: object, rename_self: bool = False) -> list[str]:
    """The statements of ``function``'s body as source (no comments; ``self`` read as
    ``strategy`` with ``rename_self``)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(function)))  # type: ignore[arg-type]
    if rename_self:
        for node in ast.walk(tree):
            if isinstance(node, ast.Name) and node.id == "self":
                node.id = "strategy"
    body = tree.body[0].body  # type: ignore[attr-defined]
    return [ast.unparse(statement) for statement in body]


def test_model_parallel_setup_is_lightnings_sequence_but_for_its_refusals() -> None:
    # `_lightning.model_parallel_setup` copies ModelParallelStrategy.setup, with `parallelize`
    # where Lightning demands a `configure_model` and refuses FSDP1: when Lightning changes a
    # step there, this fails, so that ours gets the change too
    theirs = _statements(ModelParallelStrategy.setup, rename_self=True)
    refusals = [s for s in theirs if s.startswith("if ") and "raise TypeError" in s]
    assert len(refusals) == 2, refusals  # is_overridden("configure_model"), FSDP1 modules
    imports = [s for s in theirs if s.startswith("from ")]
    expected = [s for s in theirs if s not in refusals and s not in imports]
    ours = _statements(_lightning.model_parallel_setup)
    assert ours[0].startswith(("'", '"'))  # the docstring
    parallelize = "strategy.model = parallelize(strategy.model)"
    assert parallelize in ours
    assert [s for s in ours[1:] if s != parallelize] == expected
    assert ours.index(parallelize) == theirs.index(refusals[0]) - len(imports) + 1


def test_both_strategies_have_the_same_shape_a_lightning_strategy_under_our_two_mixins() -> None:
    def own(cls: type) -> list[type]:
        return [klass for klass in cls.__mro__ if klass.__module__.startswith(PACKAGE)]

    assert own(HeteroFSDPStrategy) == [HeteroFSDPStrategy, SameCopy, HeteroEngine]
    assert own(HeteroStrategy) == [HeteroStrategy, SameCopy, HeteroEngine]
    assert HeteroFSDPStrategy.__bases__[-1] is ModelParallelStrategy
    assert HeteroStrategy.__bases__[-1] is DDPStrategy


# ---------------------------------------------------------------- modes as composed parts
@pytest.mark.parametrize("module", ["strategy", "engine", "fsdp", "callback", "replan"])
def test_the_engine_reads_no_mode_attribute_by_getattr(module: str) -> None:
    # a mode's parts (server, merger, merges, dual plan) are typed attributes of `Mode`
    tree = ast.parse((ROOT / f"{module}.py").read_text(encoding="utf-8"))
    problems = [
        f"line {node.lineno}: {ast.unparse(node)}"
        for node in ast.walk(tree)
        if isinstance(node, ast.Call)
        and isinstance(node.func, ast.Name)
        and node.func.id in ("getattr", "hasattr")
        and node.args
        and "mode" in ast.unparse(node.args[0])
    ]
    assert not problems, f"{module}.py reads the mode by name: {problems}"


def test_the_modes_test_no_mode_names() -> None:
    # what differs between modes is in their parts and option groups, not `name` tests
    problems = []
    for path in sorted((ROOT / "modes").glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if not isinstance(node, ast.Compare):
                continue
            if not all(isinstance(op, (ast.Eq, ast.NotEq, ast.Is, ast.IsNot)) for op in node.ops):
                continue
            operands = [node.left, *node.comparators]
            names = [o for o in operands if isinstance(o, ast.Attribute) and o.attr == "name"]
            constants = {o.value for o in operands if isinstance(o, ast.Constant)} & set(MODES)
            if names or constants:
                problems.append(f"{path.name}:{node.lineno}: {ast.unparse(node)}")
    assert not problems, problems


def test_a_mode_option_is_one_field_that_the_strategies_pick() -> None:
    """A new mode option is its field (in its part's group, with its docstring and example),
    its check and its use: the strategies neither list nor copy it one by one, and its keyword,
    docstring entry and options row are generated (``tests/test_namespaces.py``)."""
    import dataclasses
    import typing

    from lightning_hetero.engine import MODE_OPTIONS
    from lightning_hetero.modes import OPTION_GROUPS, ModeOptions

    names = [f.name for group in OPTION_GROUPS for f in dataclasses.fields(group)]
    assert len(names) == len(set(names)), "an option in two groups"
    assert set(names) <= set(MODE_OPTIONS)
    for cls in [*MODES.values(), *VARIANTS.values()]:
        assert set(cls.option_groups) <= set(OPTION_GROUPS), cls.__name__
    # the public declaration: HeteroStrategy's keyword, default, type and docstring
    parameters = inspect.signature(HeteroStrategy.__init__).parameters
    hints = typing.get_type_hints(HeteroStrategy.__init__)
    own = typing.get_type_hints(ModeOptions)
    docs = (ROOT.parent / "docs" / "options.md").read_text(encoding="utf-8")
    for option in dataclasses.fields(ModeOptions):
        name = option.name
        parameter = parameters[name]
        assert parameter.kind is inspect.Parameter.KEYWORD_ONLY, name
        assert parameter.default == option.default and hints[name] == own[name], name
        assert re.search(rf"^        {name}:", HeteroStrategy.__doc__ or "", re.M), name
        assert f"| `{name}` |" in docs, name
    # and nothing else names them: no hand-written list, copy or keyword per option
    for module in ("strategy", "fsdp", "engine"):
        tree = ast.parse((ROOT / f"{module}.py").read_text(encoding="utf-8"))
        for node in ast.walk(tree):
            listed = isinstance(node, ast.Constant) and node.value in MODE_OPTIONS
            passed = isinstance(node, ast.keyword) and node.arg in MODE_OPTIONS
            copied = (
                isinstance(node, ast.Attribute)
                and isinstance(node.ctx, ast.Store)
                and node.attr in MODE_OPTIONS
            )
            assert not (listed or passed or copied), f"{module}.py: {ast.unparse(node)}"


def test_the_engine_stays_small_and_the_micro_batch_executor_lives_apart():
    """Issue 40: ``HeteroEngine`` hands each step to ``MicroBatches`` and holds at most 42
    methods of its own; none of the executor's (split, rest, abort, take-over) is back."""
    from lightning_hetero.microbatch import MicroBatches

    tree = ast.parse(inspect.getsource(HeteroEngine))
    own = [node.name for node in tree.body[0].body if isinstance(node, ast.FunctionDef)]
    assert len(own) <= 42, sorted(own)  # properties included
    executor = {"first", "run_rest", "abort", "after", "take_over", "loop_counts", "plan_step"}
    assert executor <= set(vars(MicroBatches)) and not executor & set(own)
