"""The same program through LightningCLI: every HeteroStrategy option from YAML or flags.

    python examples/cli.py fit --config examples/cli.yaml
    python examples/cli.py fit --config examples/cli.yaml --trainer.strategy.deadband=0.1
    python examples/cli.py fit --print_config     # every option, with its default

Needs the `cli` extra (``pip install 'lightning_hetero[cli]'``, jsonargparse).
"""

from lightning.pytorch.cli import LightningCLI
from train import Classifier  # the model of examples/train.py (same folder)

if __name__ == "__main__":
    LightningCLI(Classifier)
