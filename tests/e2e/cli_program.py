"""A LightningCLI program that does not import lightning_hetero: users choose the strategy on
the command line or in YAML. Each form is parsed in turn, in this order, in one process.

usage: python cli_program.py lightning|pytorch_lightning OUT_JSON

Writes ``{form: {"strategy": class path, "adjust_every": ...} or {"error": message}}``.
"""

import json
import sys
import traceback
from pathlib import Path


def main() -> None:
    copy, out = sys.argv[1], Path(sys.argv[2])
    sys.argv[1:] = []  # each CLI below gets its own `args`
    if copy == "pytorch_lightning":
        from pytorch_lightning.cli import LightningCLI
        from pytorch_lightning.demos.boring_classes import BoringDataModule, BoringModel
    else:
        from lightning.pytorch.cli import LightningCLI
        from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

    package = "lightning_hetero" + (".pytorch_lightning" if copy == "pytorch_lightning" else "")
    config = out.with_suffix(".yaml")
    config.write_text(
        "trainer:\n"
        "  strategy:\n"
        "    class_path: lightning_hetero.HeteroStrategy\n"
        "    init_args:\n"
        "      adjust_every: 5\n"
        "      timeout: 0:01:00\n"
    )
    forms = {
        # before anything imported lightning_hetero: Lightning's own error (no code of ours runs)
        "bare_not_imported": ["--trainer.strategy=lightning_hetero.HeteroStrategy"],
        # jsonargparse imports the class path (which registers "hetero" and the aliases)
        "class_path": [
            "--trainer.strategy.class_path=lightning_hetero.HeteroStrategy",
            "--trainer.strategy.init_args.adjust_every=3",
        ],
        "yaml": [f"--config={config}"],
        "bare_with_arguments": [
            "--trainer.strategy=lightning_hetero.HeteroStrategy",
            "--trainer.strategy.adjust_every=4",
        ],
        "twin_class_path": [
            "--trainer.strategy.class_path=lightning_hetero.pytorch_lightning.HeteroStrategy",
        ],
        # once the package is imported (here by the forms above; usually by the user's script)
        "bare": ["--trainer.strategy=lightning_hetero.HeteroStrategy"],
        "name": ["--trainer.strategy=hetero"],
        # callbacks are checked against the Trainer's copy: pytorch_lightning programs name
        # the twin
        "callback": [
            "--trainer.strategy=hetero",
            f"--trainer.callbacks+={package}.emulate.Throttle",
            "--trainer.callbacks.sample_cost=[0.0,0.01]",
        ],
    }

    results = {}
    for form, args in forms.items():
        try:
            cli = LightningCLI(
                BoringModel,
                BoringDataModule,
                run=False,
                args=[
                    *args,
                    "--trainer.accelerator=cpu",
                    "--trainer.devices=2",
                    "--trainer.logger=false",
                ],
            )
        except BaseException as error:  # jsonargparse exits with SystemExit on a parse error
            results[form] = {
                "error": f"{type(error).__name__}: {error}",
                "trace": traceback.format_exc(),
            }
            continue
        strategy = cli.trainer.strategy
        results[form] = {
            "strategy": f"{type(strategy).__module__}.{type(strategy).__qualname__}",
            "adjust_every": getattr(strategy, "adjust_every", None),
            "callbacks": [
                f"{type(cb).__module__}.{type(cb).__qualname__}"
                for cb in cli.trainer.callbacks
                if type(cb).__module__.startswith("lightning_hetero")
            ],
        }
    out.write_text(json.dumps(results))


if __name__ == "__main__":
    main()
