"""lightning_hetero for programs written with ``import pytorch_lightning as pl``.

``pytorch_lightning`` is a separate copy of Lightning with its own classes and strategy
registry. This package holds the same public names as ``lightning_hetero``, built on
``pytorch_lightning``: the package's Lightning-facing modules (``strategy``, ``callback``,
``emulate``, ``progressive``, ...) are loaded a second time from the same source files with
``lightning.pytorch`` -> ``pytorch_lightning`` and ``lightning.fabric`` -> ``lightning_fabric``,
as Lightning builds ``pytorch_lightning`` itself (see ``lightning_hetero._namespaces``); e.g.
``lightning_hetero.pytorch_lightning.emulate.Throttle``. Pure modules are shared.

``import lightning_hetero`` imports this package when ``pytorch_lightning`` is installed, so
``pl.Trainer(strategy="hetero")`` works in either copy; so does
``pl.Trainer(strategy=lightning_hetero.HeteroStrategy(...))``: the object becomes this
copy's ``HeteroStrategy`` when the Trainer takes it.
"""

import importlib
from typing import Any

from lightning_utilities.core.imports import RequirementCache

import lightning_hetero as _base
from lightning_hetero import _namespaces

_PYTORCH_LIGHTNING = RequirementCache(
    _namespaces.PYTORCH_LIGHTNING_REQUIREMENT, "pytorch_lightning"
)
if not _PYTORCH_LIGHTNING:
    raise ModuleNotFoundError(
        f"lightning_hetero.pytorch_lightning is lightning_hetero for `pytorch_lightning`"
        f" programs: {_PYTORCH_LIGHTNING}"
    )

_namespaces.install_finder()
globals().update(_namespaces.twin_exports(_base))
__all__ = list(_base.__all__)


def __getattr__(name: str) -> Any:
    if name in _namespaces.lightning_facing():  # a twin module not imported yet
        return importlib.import_module(f"{__name__}.{name}")
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_base, name)  # pure modules and names are shared


def _register() -> None:
    """Register the twin strategies in ``pytorch_lightning``'s registry (``import
    lightning_hetero`` registered builders of them already) and let ``lightning.pytorch``'s
    Trainer take their objects."""
    registry = importlib.import_module("pytorch_lightning.strategies").StrategyRegistry
    for name in __all__:
        twin, original = globals()[name], getattr(_base, name)
        if twin is not original and hasattr(twin, "register_strategies"):
            _namespaces.register_strategy(registry, twin)
            _namespaces.accept_in(_namespaces.LIGHTNING, twin)


_register()
