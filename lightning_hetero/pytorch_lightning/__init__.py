"""lightning_hetero for programs written with ``import pytorch_lightning as pl``.

``pytorch_lightning`` is a separate copy of Lightning with its own classes and strategy
registry. This package holds the same public names as ``lightning_hetero``, built on
``pytorch_lightning``: its modules (``strategy``, ``callback``, ``emulate``, ``progressive``,
...) are generated from the package's Lightning-facing modules with ``lightning.pytorch`` ->
``pytorch_lightning`` and ``lightning.fabric`` -> ``lightning_fabric``, as Lightning builds
``pytorch_lightning`` itself (``make generate``; see ``lightning_hetero._namespaces``); e.g.
``lightning_hetero.pytorch_lightning.emulate.Throttle``. Pure modules are shared.

``import lightning_hetero`` registers ``"hetero"`` in ``pytorch_lightning``'s strategy registry
too (once the program imports ``pytorch_lightning``), so ``pl.Trainer(strategy="hetero")``
builds this package's ``HeteroStrategy``. An object built from ``lightning_hetero`` (on
``lightning.pytorch``) is refused by ``pl.Trainer``, with an error naming the import from here.
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

from lightning_hetero import __version__  # noqa: E402
from lightning_hetero.pytorch_lightning.callback import HeteroCallback  # noqa: E402
from lightning_hetero.pytorch_lightning.fsdp import HeteroFSDPStrategy  # noqa: E402
from lightning_hetero.pytorch_lightning.progressive import (  # noqa: E402
    ProgressiveSchedule,
    Stage,
    SubStage,
)
from lightning_hetero.pytorch_lightning.straggler import StragglerReport  # noqa: E402
from lightning_hetero.pytorch_lightning.strategy import HeteroStrategy  # noqa: E402

__all__ = [
    "HeteroCallback",
    "HeteroFSDPStrategy",
    "HeteroStrategy",
    "ProgressiveSchedule",
    "Stage",
    "StragglerReport",
    "SubStage",
    "__version__",
]


def __getattr__(name: str) -> Any:
    if name in _namespaces.TWINNED:  # a twin module not imported yet
        return importlib.import_module(f"{__name__}.{name}")
    if name.startswith("__"):
        raise AttributeError(name)
    return getattr(_base, name)  # pure modules are shared


def _register() -> None:
    """Register the strategies in ``pytorch_lightning``'s registry (``import lightning_hetero``
    registered builders of them already) and let ``lightning.pytorch``'s Trainer take their
    objects far enough to refuse them with the import to use."""
    registry = importlib.import_module("pytorch_lightning.strategies").StrategyRegistry
    for strategy in (HeteroStrategy, HeteroFSDPStrategy):
        _namespaces.register_strategy(registry, strategy)
        _namespaces.accept_in(_namespaces.LIGHTNING, strategy)


_register()
