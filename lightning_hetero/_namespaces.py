"""One source, two Lightning copies: ``lightning.pytorch`` and ``pytorch_lightning``.

``pytorch_lightning`` is a separate copy of Lightning with its own classes and strategy
registry: a strategy built on ``lightning.pytorch`` is rejected by ``pytorch_lightning.Trainer``
and vice versa. Lightning itself produces ``pytorch_lightning`` from ``lightning.pytorch`` by
rewriting ``lightning.pytorch`` -> ``pytorch_lightning`` and ``lightning.fabric`` ->
``lightning_fabric``; this module does the same for lightning_hetero, at import time:

- Twins. The package's *Lightning-facing* modules (those that import Lightning at run time,
  directly or through another Lightning-facing module; found from their source, not from a
  list) are loaded a second time from the same files, as
  ``lightning_hetero.pytorch_lightning.<name>``, with those imports rewritten and imports of
  other Lightning-facing modules pointed at their twins. Pure modules (``planning``,
  ``sampler``, ``_comm``, ...) are shared by both copies.
- Registration. ``import lightning_hetero`` registers ``"hetero"`` (and the class paths, for
  LightningCLI) in both copies' strategy registries; ``pytorch_lightning``'s entries build the
  twin, whose modules load only then.
- Late binding. An object built from either copy may go to either copy's Trainer. The
  Trainer's accelerator connector checks that the object is a ``Strategy`` of its copy
  (met by registering each ``HeteroStrategy`` as a virtual subclass, :meth:`abc.ABCMeta.register`,
  of the other copy's ``DDPStrategy``) and then sets ``strategy.accelerator`` before it calls
  anything else on it; a :class:`LateBinding` object that receives the other copy's
  accelerator becomes its twin in place, built again from the arguments it was created with.
  The package's callbacks in that Trainer follow when the run starts.

Nothing here imports Lightning with an import statement: this module is shared by both
copies.
"""

import ast
import importlib
import importlib.abc
import importlib.machinery
import re
import sys
from functools import cache
from pathlib import Path
from types import ModuleType
from typing import Any

PACKAGE = "lightning_hetero"
TWIN_PACKAGE = "lightning_hetero.pytorch_lightning"
LIGHTNING = "lightning"  # the namespace of lightning.pytorch / lightning.fabric
PYTORCH_LIGHTNING = "pytorch_lightning"  # the namespace of pytorch_lightning / lightning_fabric
#: The oldest pytorch_lightning the twins are built for (the same floor as ``lightning``).
PYTORCH_LIGHTNING_REQUIREMENT = "pytorch-lightning>=2.4"

_ROOT = Path(__file__).resolve().parent
_LIGHTNING_ROOTS = {"lightning", "pytorch_lightning", "lightning_fabric"}
# What Lightning's own build rewrites, plus the top-level ``lightning`` imports it implies.
_REWRITES = (
    (re.compile(r"\blightning\.pytorch\b"), "pytorch_lightning"),
    (re.compile(r"\blightning\.fabric\b"), "lightning_fabric"),
    (re.compile(r"^(\s*)from lightning import ", re.M), r"\1from pytorch_lightning import "),
    (re.compile(r"^(\s*)import lightning as ", re.M), r"\1import pytorch_lightning as "),
    (re.compile(r"^(\s*)from lightning_hetero import ", re.M), rf"\1from {TWIN_PACKAGE} import "),
)


# ---------------------------------------------------------------- which modules get twins
class _RuntimeImports(ast.NodeVisitor):
    """Modules a source imports when it runs (``if TYPE_CHECKING:`` blocks left out)."""

    def __init__(self, type_checking: bool = False) -> None:
        self.type_checking = type_checking  # count imports under `if TYPE_CHECKING:` too
        self.modules: set[str] = set()
        self.relative: list[int] = []

    def visit_If(self, node: ast.If) -> None:
        test = node.test
        name = test.attr if isinstance(test, ast.Attribute) else getattr(test, "id", None)
        if name == "TYPE_CHECKING" and not self.type_checking:
            for child in node.orelse:
                self.visit(child)
        else:
            self.generic_visit(node)

    def visit_Import(self, node: ast.Import) -> None:
        self.modules.update(alias.name for alias in node.names)

    def visit_ImportFrom(self, node: ast.ImportFrom) -> None:
        if node.level:
            self.relative.append(node.lineno)
            return
        module = node.module or ""
        self.modules.add(module)
        if module == PACKAGE:  # `from lightning_hetero import strategy` imports a submodule
            self.modules.update(f"{PACKAGE}.{alias.name}" for alias in node.names)


def _imports(source: str, filename: str, type_checking: bool = False) -> _RuntimeImports:
    visitor = _RuntimeImports(type_checking)
    visitor.visit(ast.parse(source, filename))
    return visitor


def _top_level_modules() -> dict[str, Path]:
    return {path.stem: path for path in sorted(_ROOT.glob("*.py")) if path.stem != "__init__"}


# A cheap first look (parsing every module costs more than the rest of the import): a source
# is parsed only when it mentions an import of Lightning or of a module found so far.
_MENTIONS_LIGHTNING = re.compile(
    r"^\s*(?:from|import)\s+(?:lightning\b|pytorch_lightning|lightning_fabric)", re.M
)


@cache
def lightning_facing() -> frozenset[str]:
    """Names of the package's top-level modules that need a ``pytorch_lightning`` twin.

    A module needs one when it imports Lightning at run time, or imports the package itself
    or another module that needs one. Sub-packages (``planning``, ``bench``) are not
    twinned: ``planning`` is pure, ``bench`` runs its own ``lightning`` programs.
    """
    sources = {
        name: (str(path), path.read_text(encoding="utf-8"))
        for name, path in _top_level_modules().items()
    }
    imports = cache(lambda name: _imports(sources[name][1], sources[name][0]).modules)
    facing = {
        name
        for name, (_, source) in sources.items()
        if _MENTIONS_LIGHTNING.search(source)
        and any(module.split(".")[0] in _LIGHTNING_ROOTS for module in imports(name))
    }
    changed = True
    while changed:
        changed = False
        names = "|".join(sorted(facing, key=len, reverse=True))
        mentions = re.compile(rf"^\s*(?:from|import)\s+{PACKAGE}(?:\.(?:{names})\b|\s)", re.M)
        for name, (_, source) in sources.items():
            if name in facing or not mentions.search(source):
                continue
            found = imports(name)
            if PACKAGE in found or any(f"{PACKAGE}.{other}" in found for other in facing):
                facing.add(name)
                changed = True
    return frozenset(facing)


def twin_source(name: str) -> str:
    """The source of module ``name``'s ``pytorch_lightning`` twin: the file, imports rewritten.

    Line numbers are kept, so tracebacks through a twin point at the right line of the file.
    """
    path = _top_level_modules()[name]
    source = path.read_text(encoding="utf-8")
    for pattern, replacement in _REWRITES:
        source = pattern.sub(replacement, source)
    facing = "|".join(sorted(lightning_facing(), key=len, reverse=True))
    source = re.sub(rf"\b{PACKAGE}\.({facing})\b", rf"{TWIN_PACKAGE}.\1", source)
    every_import = _imports(source, str(path), type_checking=True)
    left = sorted(m for m in every_import.modules if m == "lightning" or m.startswith("lightning."))
    problems = []
    if left:
        problems.append(f"imports {left} in a form the rewrite does not know")
    if every_import.relative:
        problems.append(f"uses relative imports (lines {every_import.relative})")
    if PACKAGE in every_import.modules:
        problems.append(f"imports `{PACKAGE}` itself")
    if problems:
        raise ImportError(
            f"Cannot build the pytorch_lightning twin of {PACKAGE}.{name} ({path}): it "
            + "; ".join(problems)
            + ". Lightning-facing modules must import `lightning.pytorch...` and"
            f" `lightning.fabric...`, and other {PACKAGE} modules, by absolute name."
        )
    return source


class _TwinLoader(importlib.abc.Loader):
    def __init__(self, name: str, path: Path) -> None:
        self.name = name
        self.path = path

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> None:
        return None  # the default module

    def exec_module(self, module: ModuleType) -> None:
        code = compile(twin_source(self.name), str(self.path), "exec", dont_inherit=True)
        exec(code, module.__dict__)

    def get_source(self, fullname: str) -> str:
        return twin_source(self.name)


class TwinFinder(importlib.abc.MetaPathFinder):
    """Finds ``lightning_hetero.pytorch_lightning.<name>`` for each Lightning-facing module."""

    def find_spec(self, fullname: str, path: Any = None, target: Any = None) -> Any:
        prefix = TWIN_PACKAGE + "."
        if not fullname.startswith(prefix):
            return None
        name = fullname[len(prefix) :]
        if name not in lightning_facing():
            return None
        file = _top_level_modules()[name]
        spec = importlib.machinery.ModuleSpec(
            fullname, _TwinLoader(name, file), origin=str(file), is_package=False
        )
        spec.has_location = True
        return spec


def install_finder() -> None:
    if not any(isinstance(finder, TwinFinder) for finder in sys.meta_path):
        sys.meta_path.insert(0, TwinFinder())


# ---------------------------------------------------------------- which copy an object is for
def namespace_of(obj: Any) -> str | None:
    """``"lightning"`` or ``"pytorch_lightning"``: the Lightning copy a class (or an object's
    class) is built on; ``None`` for anything else (a plain ``torch.nn.Module``, a number)."""
    cls = obj if isinstance(obj, type) else type(obj)
    for klass in cls.__mro__:
        module = getattr(klass, "__module__", "") or ""
        if module.startswith(("pytorch_lightning.", "lightning_fabric.")):
            return PYTORCH_LIGHTNING
        if module.startswith("lightning.") or module == "lightning":
            return LIGHTNING
    return None


def import_path(cls: type) -> str:
    """The documented import of one of our classes: ``lightning_hetero[.pytorch_lightning].X``."""
    prefix = TWIN_PACKAGE if namespace_of(cls) == PYTORCH_LIGHTNING else PACKAGE
    public = importlib.import_module(prefix)
    if getattr(public, cls.__name__, None) is cls:
        return f"{prefix}.{cls.__name__}"
    return f"{cls.__module__}.{cls.__qualname__}"


def twin_class(cls: type, namespace: str) -> type | None:
    """``cls``'s counterpart built on ``namespace``; ``None`` when ``cls`` is not one of the
    package's own classes (e.g. a user's subclass)."""
    module = cls.__module__
    if module.startswith(TWIN_PACKAGE + "."):
        name = module[len(TWIN_PACKAGE) + 1 :]
    elif module.startswith(PACKAGE + "."):
        name = module[len(PACKAGE) + 1 :]
    else:
        return None
    if name not in lightning_facing():
        return None
    target = importlib.import_module(
        f"{TWIN_PACKAGE}.{name}" if namespace == PYTORCH_LIGHTNING else f"{PACKAGE}.{name}"
    )
    twin = getattr(target, cls.__qualname__, None)
    return twin if isinstance(twin, type) else None


def _other_import(cls: type, namespace: str) -> str:
    twin = twin_class(cls, namespace)
    if twin is not None:
        return import_path(twin)
    return f"{TWIN_PACKAGE if namespace == PYTORCH_LIGHTNING else PACKAGE}.{cls.__name__}"


def _foreign_objects(values: Any, namespace: str) -> list[str]:
    return [
        f"{type(value).__module__}.{type(value).__qualname__}"
        for value in values
        if namespace_of(value) not in (None, namespace)
    ]


def rebind(obj: Any, namespace: str) -> None:
    """Make ``obj`` (one of the package's Lightning-facing objects) the object it would be had
    it been built from ``namespace``'s classes: same identity, same constructor arguments.

    Objects that recorded their arguments (:class:`LateBinding`) are built again; others
    (callbacks, which hold only plain settings before a run) change class.
    """
    cls = type(obj)
    current = namespace_of(cls)
    if current in (None, namespace):
        return
    twin = twin_class(cls, namespace)
    if twin is None:
        base = _our_base(cls)
        raise TypeError(
            f"{cls.__qualname__} (a subclass of {import_path(base)}) is built on"
            f" {_copy(current)}; {_copy(namespace)}'s Trainer cannot take it. In"
            f" {_copy(namespace)} programs subclass {_other_import(base, namespace)}, the same"
            f" class built on {_copy(namespace)}."
        )
    state = vars(obj)
    recorded = state.get("_hetero_init_args")
    values = [*recorded[0], *recorded[1].values()] if recorded is not None else list(state.values())
    foreign = _foreign_objects(values, namespace)
    if foreign:
        raise TypeError(
            f"This {cls.__name__} holds objects of {_copy(current)} ({', '.join(foreign)}) and"
            f" cannot be moved to {_copy(namespace)}'s Trainer. Import {import_path(twin)} and"
            f" give it {_copy(namespace)}'s objects."
        )
    if recorded is None:
        obj.__class__ = twin
        return
    args, kwargs = recorded
    before = dict(state)
    obj.__class__ = twin
    state.clear()
    state["_hetero_init_args"] = recorded
    twin.__init__(obj, *args, **kwargs)
    for name, value in before.items():  # what the user set on it after construction
        if namespace_of(value) in (None, namespace):
            state.setdefault(name, value)


def rebind_callbacks(callbacks: list[Any], namespace: str) -> None:
    """Rebind the package's own callbacks in ``callbacks`` (e.g. a ``HeteroCallback`` or a
    ``Throttle`` imported from ``lightning_hetero`` in a ``pytorch_lightning`` program)."""
    for callback in callbacks:
        if twin_class(type(callback), namespace) is not None:
            rebind(callback, namespace)


def _copy(namespace: str | None) -> str:
    return "pytorch_lightning" if namespace == PYTORCH_LIGHTNING else "lightning.pytorch"


def _our_base(cls: type) -> type:
    """The first of the package's own classes in ``cls``'s MRO (``cls`` itself if none)."""
    for klass in cls.__mro__:
        if klass.__module__.startswith(PACKAGE + ".") and twin_class(klass, LIGHTNING):
            return klass
    return cls


class LateBinding:
    """Mixin for the package's strategies: usable by either Lightning copy's Trainer.

    Records the constructor's arguments; when the Trainer's accelerator connector hands the
    strategy an accelerator of the other copy (the first thing it does with a strategy
    object), the object becomes its twin from that copy (see :func:`rebind`). The package's
    callbacks in the Trainer are rebound when the run starts, in ``setup_environment``.
    """

    def __new__(cls, *args: Any, **kwargs: Any) -> Any:
        obj = super().__new__(cls)
        obj.__dict__["_hetero_init_args"] = (args, kwargs)
        return obj

    @property
    def accelerator(self) -> Any:
        return _next_attribute(self, "accelerator").__get__(self, type(self))

    @accelerator.setter
    def accelerator(self, accelerator: Any) -> None:
        namespace = namespace_of(accelerator)
        if namespace is not None and namespace != namespace_of(type(self)):
            rebind(self, namespace)
        _next_attribute(self, "accelerator").__set__(self, accelerator)

    def connect(self, model: Any) -> Any:
        namespace, mine = namespace_of(model), namespace_of(type(self))
        if namespace is not None and namespace != mine:
            raise TypeError(
                f"{type(model).__qualname__} is a {_copy(namespace)} LightningModule but this"
                f" {type(self).__name__} is built on {_copy(mine)}. Use"
                f" {_other_import(_our_base(type(self)), namespace)} with {_copy(namespace)}'s"
                " Trainer."
            )
        return super().connect(model)  # type: ignore[misc]

    def setup_environment(self) -> None:
        module = self.lightning_module  # type: ignore[attr-defined]
        if module is not None and getattr(module, "_trainer", None) is not None:
            rebind_callbacks(module.trainer.callbacks, namespace_of(type(self)))
        super().setup_environment()  # type: ignore[misc]


def _next_attribute(obj: Any, name: str) -> Any:
    mro = type(obj).__mro__
    for klass in mro[mro.index(LateBinding) + 1 :]:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(name)


def counterpart(cls: type, namespace: str) -> type:
    """Lightning's class ``cls`` (e.g. ``lightning.pytorch.strategies.DDPStrategy``) in the copy
    ``namespace`` (``pytorch_lightning.strategies.ddp.DDPStrategy``)."""
    module = cls.__module__
    if namespace == PYTORCH_LIGHTNING:
        module = re.sub(r"^lightning\.pytorch\b", "pytorch_lightning", module)
        module = re.sub(r"^lightning\.fabric\b", "lightning_fabric", module)
    else:
        module = re.sub(r"^pytorch_lightning\b", "lightning.pytorch", module)
        module = re.sub(r"^lightning_fabric\b", "lightning.fabric", module)
    return getattr(importlib.import_module(module), cls.__qualname__)


def _lightning_base(cls: type) -> type:
    """The first of Lightning's own classes in ``cls``'s MRO."""
    return next(
        klass
        for klass in cls.__mro__
        if namespace_of(klass) and klass.__module__.split(".")[0] in _LIGHTNING_ROOTS
    )


def accept_in(namespace: str, cls: type) -> None:
    """Let the copy ``namespace``'s Trainer take ``cls``'s objects (built on the other copy):
    ``cls`` becomes a virtual subclass of its Lightning base class in that copy, which is what
    the Trainer checks; the object rebinds itself (:class:`LateBinding`) before it is used."""
    counterpart(_lightning_base(cls), namespace).register(cls)


class _BuildTwin:
    """A registry entry for ``cls``'s twin in ``namespace``, built (and the twin modules
    loaded) only when a Trainer asks for it."""

    def __init__(self, cls: type, namespace: str) -> None:
        self.cls = cls
        self.namespace = namespace

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        twin = twin_class(self.cls, self.namespace)
        assert twin is not None
        return twin(*args, **kwargs)


def register_in_pytorch_lightning(strategies: list[type]) -> None:
    """Make the ``lightning.pytorch`` strategies ``strategies`` usable by ``pytorch_lightning``'s
    Trainer, by name and as objects, without loading their twins until one is used."""
    registry = importlib.import_module("pytorch_lightning.strategies").StrategyRegistry
    for cls in strategies:
        register_strategy(registry, cls, factory=_BuildTwin(cls, PYTORCH_LIGHTNING))
        accept_in(PYTORCH_LIGHTNING, cls)


def strategy_aliases(cls: type) -> list[str]:
    """The names a Trainer may receive for ``cls`` besides its ``strategy_name``: its import
    paths, lowercased as Lightning lowercases strategy names. ``LightningCLI`` passes a bare
    ``--trainer.strategy=lightning_hetero.HeteroStrategy`` to the Trainer as that string."""
    name = cls.__name__
    return [
        f"{prefix}.{name}".lower()
        for prefix in (
            PACKAGE,
            f"{PACKAGE}.strategy",
            TWIN_PACKAGE,
            f"{TWIN_PACKAGE}.strategy",
        )
    ]


def register_strategy(registry: Any, cls: type, factory: Any = None) -> None:
    """Register ``cls`` in one copy's ``StrategyRegistry``: what its ``register_strategies``
    registers (built by ``factory`` when given) and its class paths (:func:`strategy_aliases`)."""
    own = type(registry)()
    cls.register_strategies(own)  # type: ignore[attr-defined]
    for name, data in own.items():
        if name not in registry:
            registry.register(
                name,
                factory or data["strategy"],
                description=data["description"],
                **data["init_params"],
            )
    for alias in strategy_aliases(cls):
        if alias not in registry:
            registry.register(
                alias,
                factory or cls,
                description=f"{cls.strategy_name!r} under its class path",  # type: ignore[attr-defined]
            )


def twin_exports(base: ModuleType) -> dict[str, Any]:
    """``base.__all__`` for the ``pytorch_lightning`` copy: the twins of what the
    Lightning-facing modules define, the rest (plain values, pure modules' names) as is."""
    exports = {}
    for name in base.__all__:
        value = getattr(base, name)
        module = getattr(value, "__module__", None)
        if isinstance(module, str) and module.startswith(PACKAGE + "."):
            short = module[len(PACKAGE) + 1 :]
            if short in lightning_facing():
                value = getattr(importlib.import_module(f"{TWIN_PACKAGE}.{short}"), name)
        exports[name] = value
    return exports
