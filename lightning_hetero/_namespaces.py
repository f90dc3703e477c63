"""One source, two Lightning copies: ``lightning.pytorch`` and ``pytorch_lightning``.

``pytorch_lightning`` is a separate copy of Lightning with its own classes and strategy
registry: a strategy built on ``lightning.pytorch`` is no strategy to ``pytorch_lightning``'s
Trainer, and vice versa. Lightning itself produces ``pytorch_lightning`` from
``lightning.pytorch`` by rewriting ``lightning.pytorch`` -> ``pytorch_lightning`` and
``lightning.fabric`` -> ``lightning_fabric``; lightning_hetero does the same:

- Twins. The modules of ``TWINNED`` (those that use Lightning) have generated copies,
  ``lightning_hetero/pytorch_lightning/<name>.py``, with those imports rewritten (``make
  generate``, ``lightning_hetero._generate``). Pure modules (``planning``, ``sampler``,
  ``_comm``, ...) are shared by both copies.
- Registration. ``import lightning_hetero`` registers ``"hetero"`` (and the class paths, for
  LightningCLI) in both copies' strategy registries; ``pytorch_lightning``'s entries build the
  twin, whose modules load only then. The import does not import ``pytorch_lightning`` (whose
  import takes over Lightning's shared rank-zero logger): its entries are registered when
  the program imports it (``register_when_imported``), or at once where it already has.
- One copy per object. An object goes to its own copy's Trainer only; given to the other
  copy's, it raises an error that names the import to use (``SameCopy``). The Trainer's
  accelerator connector checks that a strategy object is a ``Strategy`` of its copy (met by
  registering each strategy as a virtual subclass, ``abc.ABCMeta.register``, of the other
  copy's base class, ``accept_in``) and then sets ``strategy.accelerator`` before it calls
  anything else on it: the strategy refuses the other copy's accelerator there, untouched.

Nothing here imports Lightning with an import statement: this module is shared by both
copies.
"""

import importlib
import importlib.abc
import importlib.machinery
import importlib.util
import re
import sys
from collections.abc import Callable, Sequence
from types import ModuleType
from typing import Any

PACKAGE = "lightning_hetero"
TWIN_PACKAGE = "lightning_hetero.pytorch_lightning"
LIGHTNING = "lightning"  # the namespace of lightning.pytorch / lightning.fabric
PYTORCH_LIGHTNING = "pytorch_lightning"  # the namespace of pytorch_lightning / lightning_fabric
#: The oldest pytorch_lightning the twins are built for (the same floor as ``lightning``).
PYTORCH_LIGHTNING_REQUIREMENT = "pytorch-lightning>=2.4"
#: The top-level modules generated again on ``pytorch_lightning`` (``make generate``): those
#: that import Lightning at run time, directly or through another module of the list
#: (``tests/test_namespaces.py`` checks that none is missing).
TWINNED = (
    "_data",
    "_lightning",
    "callback",
    "emulate",
    "engine",
    "fsdp",
    "microbatch",
    "progressive",
    "straggler",
    "strategy",
)

_LIGHTNING_ROOTS = {"lightning", "pytorch_lightning", "lightning_fabric"}


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


def _copy(namespace: str | None) -> str:
    return "pytorch_lightning" if namespace == PYTORCH_LIGHTNING else "lightning.pytorch"


def _twinned_module(cls: type) -> str | None:
    """The ``TWINNED`` module that defines ``cls`` in either copy; ``None`` when ``cls``
    is not one of the package's own Lightning classes (e.g. a user's subclass)."""
    for prefix in (f"{TWIN_PACKAGE}.", f"{PACKAGE}."):
        if cls.__module__.startswith(prefix):
            name = cls.__module__[len(prefix) :]
            return name if name in TWINNED else None
    return None


def import_in(cls: type, namespace: str | None) -> str:
    """The documented import of the package's class ``cls`` built on ``namespace``, e.g.
    ``lightning_hetero.pytorch_lightning.HeteroStrategy`` or
    ``lightning_hetero.pytorch_lightning.emulate.Throttle`` (without importing it)."""
    package = TWIN_PACKAGE if namespace == PYTORCH_LIGHTNING else PACKAGE
    if cls.__name__ in importlib.import_module(PACKAGE).__all__:
        return f"{package}.{cls.__name__}"
    return f"{package}.{_twinned_module(cls)}.{cls.__qualname__}"


def _our_base(cls: type) -> type | None:
    """The first of the package's own Lightning classes in ``cls``'s MRO."""
    return next((klass for klass in cls.__mro__ if _twinned_module(klass)), None)


def wrong_copy(obj: Any, namespace: str) -> TypeError:
    """The error for ``obj`` (built on one Lightning copy from the package's classes) given to
    the Trainer of the copy ``namespace``: what it is, and the import that copy needs."""
    cls = type(obj)
    mine = namespace_of(cls)
    base = _our_base(cls)
    assert base is not None, cls
    if base is not cls:
        return TypeError(
            f"{cls.__qualname__} subclasses `{import_in(base, mine)}`, which is built on"
            f" {_copy(mine)}; for {_copy(namespace)}'s Trainer, subclass"
            f" {import_in(base, namespace)} instead."
        )
    module, _, name = import_in(cls, mine).rpartition(".")
    hint = ""
    if getattr(cls, "strategy_name", None):
        hint = f" (or pass `strategy={cls.strategy_name!r}`, which builds it)"
    return TypeError(
        f"{name} from `{module}` is built on {_copy(mine)}; {_copy(namespace)}'s Trainer needs"
        f" `{import_in(cls, namespace)}`{hint}."
    )


def check_callbacks(callbacks: list[Any], namespace: str) -> None:
    """Refuse the package's callbacks built on the other copy (e.g. a ``Throttle`` imported from
    ``lightning_hetero`` in a ``pytorch_lightning`` program): Lightning takes any object as a
    callback and calls its hooks."""
    for callback in callbacks:
        found = namespace_of(callback)
        if _our_base(type(callback)) and found not in (None, namespace):
            raise wrong_copy(callback, namespace)


class SameCopy:
    """Mixin for the package's strategies: refuses the other Lightning copy's Trainer (its
    accelerator, the first thing the Trainer's accelerator connector sets), LightningModule and
    the package's callbacks built on the other copy, with the import to use."""

    @property
    def accelerator(self) -> Any:
        return _inherited(self, "accelerator").__get__(self, type(self))

    @accelerator.setter
    def accelerator(self, accelerator: Any) -> None:
        namespace = namespace_of(accelerator)
        if namespace is not None and namespace != namespace_of(type(self)):
            raise wrong_copy(self, namespace)
        _inherited(self, "accelerator").__set__(self, accelerator)

    def connect(self, model: Any) -> Any:
        namespace, mine = namespace_of(model), namespace_of(type(self))
        if namespace is not None and namespace != mine:
            raise TypeError(
                f"{type(model).__qualname__} is a {_copy(namespace)} LightningModule but this"
                f" {type(self).__name__} is built on {_copy(mine)}. Use"
                f" {import_in(_our_base(type(self)) or type(self), namespace)} with"
                f" {_copy(namespace)}'s Trainer."
            )
        return super().connect(model)  # type: ignore[misc]

    def setup_environment(self) -> None:
        module = self.lightning_module  # type: ignore[attr-defined]
        if module is not None and getattr(module, "_trainer", None) is not None:
            check_callbacks(module.trainer.callbacks, namespace_of(type(self)) or LIGHTNING)
        super().setup_environment()  # type: ignore[misc]


def _inherited(obj: Any, name: str) -> Any:
    """``name`` as the class after ``SameCopy`` in ``obj``'s MRO defines it."""
    mro = type(obj).__mro__
    for klass in mro[mro.index(SameCopy) + 1 :]:
        if name in vars(klass):
            return vars(klass)[name]
    raise AttributeError(name)


# ---------------------------------------------------------------- the registries
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
    """Let the copy ``namespace``'s Trainer take ``cls``'s objects (built on the other copy)
    far enough to refuse them with the import to use (``SameCopy``): ``cls`` becomes a
    virtual subclass of its Lightning base class in that copy, which is what the Trainer checks
    first (without it, Lightning reports an invalid strategy name)."""
    counterpart(_lightning_base(cls), namespace).register(cls)


class _BuildTwin:
    """A registry entry for ``cls``'s twin in ``pytorch_lightning``, built (and the twin modules
    loaded) only when a Trainer asks for it."""

    def __init__(self, cls: type) -> None:
        self.module = f"{TWIN_PACKAGE}.{_twinned_module(cls)}"
        self.name = cls.__qualname__

    def __call__(self, *args: Any, **kwargs: Any) -> Any:
        return getattr(importlib.import_module(self.module), self.name)(*args, **kwargs)


def register_in_pytorch_lightning(strategies: list[type]) -> None:
    """Register the twins of the ``lightning.pytorch`` strategies ``strategies`` in
    ``pytorch_lightning``'s registry, without loading them until one is used; the objects of
    ``strategies`` reach the Trainer's check (``accept_in``)."""
    registry = importlib.import_module("pytorch_lightning.strategies").StrategyRegistry
    for cls in strategies:
        register_strategy(registry, cls, factory=_BuildTwin(cls))
        accept_in(PYTORCH_LIGHTNING, cls)


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``then`` once the top-level module ``name`` has been imported (its ``__init__``
    run to the end), then leaves ``sys.meta_path``."""

    def __init__(self, name: str, then: Callable[[], None]) -> None:
        self.name, self.then = name, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname != self.name:
            return None
        sys.meta_path.remove(self)  # the other finders find it; this one fires once
        spec = importlib.util.find_spec(fullname)
        if spec is not None and spec.loader is not None:
            spec.loader = _ThenLoader(spec.loader, self.then)
        return spec


class _ThenLoader(importlib.abc.Loader):
    """``loader``, calling ``then`` after it has executed the module."""

    def __init__(self, loader: Any, then: Callable[[], None]) -> None:
        self._loader, self._then = loader, then

    def create_module(self, spec: importlib.machinery.ModuleSpec) -> ModuleType | None:
        return self._loader.create_module(spec)

    def exec_module(self, module: ModuleType) -> None:
        module.__loader__ = self._loader  # the module keeps its own loader
        if module.__spec__ is not None:
            module.__spec__.loader = self._loader
        self._loader.exec_module(module)
        self._then()

    def __getattr__(self, name: str) -> Any:  # get_resource_reader, is_package, ...
        return getattr(self._loader, name)


def register_when_imported(strategies: list[type]) -> None:
    """``register_in_pytorch_lightning(strategies)`` now where ``pytorch_lightning`` is
    imported, else once the program imports it: importing ``lightning_hetero`` imports no
    copy of Lightning the program did not (``pytorch_lightning``'s import sets its own logger
    as the rank-zero logger ``lightning.pytorch`` shares)."""
    if PYTORCH_LIGHTNING in sys.modules:
        register_in_pytorch_lightning(strategies)
        return
    if not any(
        isinstance(finder, _AfterImport) and finder.name == PYTORCH_LIGHTNING
        for finder in sys.meta_path
    ):
        then = lambda: register_in_pytorch_lightning(strategies)  # noqa: E731
        sys.meta_path.insert(0, _AfterImport(PYTORCH_LIGHTNING, then))


def strategy_aliases(cls: type) -> list[str]:
    """The names a Trainer may receive for ``cls`` besides its ``strategy_name``: its import
    paths, lowercased as Lightning lowercases strategy names. ``LightningCLI`` passes a bare
    ``--trainer.strategy=lightning_hetero.HeteroStrategy`` to the Trainer as that string."""
    name = cls.__name__
    return [
        f"{prefix}.{name}".lower()
        for prefix in (
            PACKAGE,
            f"{PACKAGE}.{_twinned_module(cls)}",
            TWIN_PACKAGE,
            f"{TWIN_PACKAGE}.{_twinned_module(cls)}",
        )
    ]


def register_strategy(registry: Any, cls: type, factory: Any = None) -> None:
    """Register ``cls`` in one copy's ``StrategyRegistry``: what its ``register_strategies``
    registers (built by ``factory`` when given) and its class paths (``strategy_aliases``)."""
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
