"""Writes release_0.1.0_lbbsp.ckpt: run it with the release to keep on PYTHONPATH.

PYTHONPATH=<checkout of that release> python tests/data/make_release_checkpoint.py OUT_DIR
"""

import sys

import lightning.pytorch as pl
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

from lightning_hetero import HeteroStrategy


class _Model(BoringModel):
    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 32), batch_size=8)


if __name__ == "__main__":
    pl.seed_everything(0)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=HeteroStrategy(controller="lbbsp", adjust_every=2),
        max_epochs=2,
        callbacks=[ModelCheckpoint(dirpath=sys.argv[1], save_last=True)],
        logger=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer.fit(_Model())
