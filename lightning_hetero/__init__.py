"""lightning_hetero: per-rank batch sizes for data-parallel training on unequal workers.

Importing the package registers ``Trainer(strategy="hetero")`` (and the class paths
``lightning_hetero.HeteroStrategy`` etc., for LightningCLI's bare ``--trainer.strategy=...``) in
``lightning.pytorch``'s strategy registry and, when ``pytorch_lightning`` is installed, in
``pytorch_lightning``'s (see ``lightning_hetero.pytorch_lightning``) once the program imports
it: importing the package does not import ``pytorch_lightning``.
"""

from lightning.pytorch.strategies import StrategyRegistry
from lightning_utilities.core.imports import RequirementCache

from lightning_hetero import _namespaces
from lightning_hetero.callback import HeteroCallback
from lightning_hetero.fsdp import HeteroFSDPStrategy
from lightning_hetero.progressive import ProgressiveSchedule, Stage, SubStage
from lightning_hetero.straggler import StragglerReport
from lightning_hetero.strategy import HeteroStrategy

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
__version__ = "0.1.0"

_namespaces.register_strategy(StrategyRegistry, HeteroStrategy)
_namespaces.register_strategy(StrategyRegistry, HeteroFSDPStrategy)
if RequirementCache(_namespaces.PYTORCH_LIGHTNING_REQUIREMENT):  # metadata: no import
    # by name (building the twins of lightning_hetero.pytorch_lightning, loaded only then), when
    # the program imports pytorch_lightning; an object of this package given to pl.Trainer is
    # refused, with the import to use
    _namespaces.register_when_imported([HeteroStrategy, HeteroFSDPStrategy])
