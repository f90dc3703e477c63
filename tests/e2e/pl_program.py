"""A program written against ``pytorch_lightning`` (the tutorials' ``import pytorch_lightning as
pl``), run on 2 gloo ranks with HeteroStrategy. Nothing here imports ``lightning``.

Lightning's defaults stay on (progress bar, checkpointing, logger); the model logs
``sync_dist=True`` scalars at epoch and validation level.

usage: python pl_program.py OUT_JSON --form name|object|twin [--callbacks none|lightning|twin]

``--form``: ``strategy="hetero"``; a ``lightning_hetero.HeteroStrategy`` object (the import
users write first, built on ``lightning.pytorch``: refused); or a
``lightning_hetero.pytorch_lightning.HeteroStrategy`` object. ``--callbacks``: also pass a
``HeteroCallback`` and a ``Throttle`` (rank 1 slower), imported from ``lightning_hetero``
(refused) or from ``lightning_hetero.pytorch_lightning``.

A refused object stops the program with a ``TypeError``; it writes ``{"error": message,
"raised_by": "Trainer" or "fit", "kept_types": ...}`` instead of the run's results.
"""

import argparse
import json
import sys
from datetime import timedelta
from pathlib import Path

import pytorch_lightning as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

import lightning_hetero
import lightning_hetero.emulate
import lightning_hetero.pytorch_lightning


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Sequential(
            torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 2)
        )

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("train_loss", loss, on_step=True, on_epoch=True, sync_dist=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("val_loss", loss, on_epoch=True, sync_dist=True, prog_bar=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def _loader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(64, 8, generator=generator)
        y = (x.sum(dim=1) > 0).long()
        return DataLoader(TensorDataset(x, y), batch_size=8)

    def train_dataloader(self):
        return self._loader()

    def val_dataloader(self):
        return self._loader()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--form", choices=["name", "object", "twin"], required=True)
    parser.add_argument("--callbacks", choices=["none", "lightning", "twin"], default="none")
    args = parser.parse_args()
    torch.set_num_threads(1)

    if args.form == "name":
        strategy = "hetero"
    else:
        package = lightning_hetero if args.form == "object" else lightning_hetero.pytorch_lightning
        strategy = package.HeteroStrategy(timeout=timedelta(seconds=60))
    callbacks = []
    if args.callbacks != "none":
        package = (
            lightning_hetero
            if args.callbacks == "lightning"
            else lightning_hetero.pytorch_lightning
        )
        # rank 1's 8 samples sleep 128 ms a step: the first boundary, after 4 steps, moves
        # the plan even when the noise of a busy machine raises the auto dead-band to its cap
        throttle = package.emulate.Throttle(sample_cost=[0.0, 0.016])
        callbacks = [package.HeteroCallback(), throttle]
    given = list(callbacks)
    types = [type(obj) for obj in [strategy, *given]]
    raised_by = "Trainer"
    try:
        trainer = pl.Trainer(
            accelerator="cpu",
            devices=2,
            strategy=strategy,
            max_epochs=2,
            callbacks=callbacks,
            default_root_dir=args.out + ".logs",
            # TensorBoard (Lightning's default when installed; HeteroCallback adds its layout)
            # and CSV, read below: the loggers of pytorch_lightning
            logger=[
                pl.loggers.TensorBoardLogger(args.out + ".logs"),
                pl.loggers.CSVLogger(args.out + ".logs"),
            ],
            log_every_n_steps=1,
        )
        raised_by = "fit"
        trainer.fit(Classifier())
    except TypeError as error:  # an object built on lightning.pytorch, refused
        if raised_by == "Trainer" or trainer.global_rank == 0:
            kept = types == [type(obj) for obj in [strategy, *given]]
            with open(args.out, "w") as f:
                json.dump({"error": str(error), "raised_by": raised_by, "kept_types": kept}, f)
        return
    used = trainer.strategy
    if trainer.global_rank == 0:
        csv_columns = (
            Path(trainer.loggers[1].log_dir, "metrics.csv").read_text().splitlines()[0].split(",")
        )
        ours = [
            cb for cb in trainer.callbacks if type(cb).__module__.startswith("lightning_hetero")
        ]
        result = {
            "strategy": f"{type(used).__module__}.{type(used).__qualname__}",
            "same_object": used is strategy,
            "history": used.history,
            "batch_sizes": used.batch_sizes,
            "global_step": trainer.global_step,
            "callbacks": [f"{type(cb).__module__}.{type(cb).__qualname__}" for cb in ours],
            "given_callbacks_used": all(
                any(cb is mine for cb in trainer.callbacks) for mine in given
            ),
            "metrics": sorted(trainer.callback_metrics),
            "logged": sorted(csv_columns),
            # callbacks still built on lightning.pytorch (not rebound): must be none
            "foreign_callbacks": [
                type(cb).__name__
                for cb in trainer.callbacks
                if isinstance(cb, sys.modules["lightning.pytorch.callbacks"].Callback)
            ],
        }
        with open(args.out, "w") as f:
            json.dump(result, f, default=float)


if __name__ == "__main__":
    main()
