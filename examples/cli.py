"""The same program through LightningCLI: every HeteroStrategy option from YAML or flags.

    python examples/cli.py fit --config examples/cli.yaml
    python examples/cli.py fit --config examples/cli.yaml --trainer.strategy.deadband=0.1
    python examples/cli.py fit --print_config     # every option, with its default

Needs the `cli` extra (``pip install 'lightning_hetero[cli]'``, jsonargparse).
"""

from lightning.pytorch.cli import ArgsType, LightningCLI
from train import Classifier  # the model of examples/train.py (same folder)

# The strategy by class path, so that --print_config lists its options with their defaults
# (a strategy name such as "hetero" is a plain string to jsonargparse: it would print only that)
TRAINER_DEFAULTS = {"strategy": {"class_path": "lightning_hetero.HeteroStrategy"}}


def main(args: ArgsType = None) -> None:
    LightningCLI(Classifier, trainer_defaults=TRAINER_DEFAULTS, args=args)


if __name__ == "__main__":
    main()
