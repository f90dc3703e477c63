"""lightning_hetero: per-rank batch sizes for data-parallel training on unequal workers.

Importing the package registers ``Trainer(strategy="hetero")``.
"""

from lightning.pytorch.strategies import StrategyRegistry

from lightning_hetero.callback import HeteroCallback
from lightning_hetero.progressive import ProgressiveSchedule, Stage, SubStage
from lightning_hetero.strategy import HeteroStrategy

__all__ = [
    "HeteroCallback",
    "HeteroStrategy",
    "ProgressiveSchedule",
    "Stage",
    "SubStage",
    "__version__",
]
__version__ = "0.1.0"

if HeteroStrategy.strategy_name not in StrategyRegistry:
    HeteroStrategy.register_strategies(StrategyRegistry)
