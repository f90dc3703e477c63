"""Lightning's ModelCheckpoint and EarlyStopping monitor ``hetero/*`` metrics, 2 gloo ranks.

The callbacks are passed as users pass them (``Trainer(callbacks=[...])``; the strategy
attaches its HeteroCallback itself), with a validation loop, so a missing monitored key at
an epoch end raises: ModelCheckpoint's ``MisconfigurationException`` once validation has
run, EarlyStopping's ``RuntimeError`` (``strict=True``). Rank 0 writes, per checkpoint
saved, the epoch and the score ModelCheckpoint read, and the strategy's history
(``balance`` and batch sizes of each boundary) to OUT_JSON; checkpoints go to OUT_JSON's
folder.

usage: python monitor_program.py OUT_JSON
"""

import json
import sys
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import EarlyStopping, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy

EPOCHS = 2


class Classifier(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.net = torch.nn.Linear(8, 2)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def validation_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("val_loss", loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def _loader(self) -> DataLoader:
        generator = torch.Generator().manual_seed(0)
        x = torch.randn(32, 8, generator=generator)
        return DataLoader(TensorDataset(x, (x.sum(dim=1) > 0).long()), batch_size=4)

    def train_dataloader(self):
        return self._loader()

    def val_dataloader(self):
        return self._loader()


if __name__ == "__main__":
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    checkpoint = ModelCheckpoint(
        dirpath=out.parent, monitor="hetero/balance", mode="max", save_top_k=-1, filename="{epoch}"
    )
    early_stopping = EarlyStopping(
        monitor="hetero/batch_size/rank0", mode="max", patience=EPOCHS, strict=True
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=HeteroStrategy(timeout=timedelta(seconds=60)),
        max_epochs=EPOCHS,
        callbacks=[early_stopping, checkpoint],
        logger=False,
        default_root_dir=out.parent,
        enable_model_summary=False,
        num_sanity_val_steps=0,
    )
    trainer.fit(Classifier())
    if trainer.global_rank == 0:
        saved = [
            {"path": Path(path).name, "score": float(score)}
            for path, score in sorted(checkpoint.best_k_models.items())
        ]
        history = [
            {"balance": entry["balance"], "batch_sizes": list(entry["batch_sizes"])}
            for entry in trainer.strategy.history
        ]
        result = {
            "saved": saved,
            "history": history,
            "early_stopping_best": float(early_stopping.best_score),
            "order": [type(cb).__name__ for cb in trainer.callbacks],
        }
        with open(out, "w") as f:
            json.dump(result, f)
    torch.distributed.destroy_process_group()
