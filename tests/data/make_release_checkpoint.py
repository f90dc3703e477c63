"""Writes tests/data/release_0.1.0.ckpt with lightning_hetero before the modes refactor."""
import sys
import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader
import lightning_hetero
from lightning_hetero import HeteroStrategy
print(lightning_hetero.__file__)
class _Model(BoringModel):
    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 32), batch_size=8)
pl.seed_everything(0)
out = sys.argv[1]
trainer = pl.Trainer(accelerator="cpu", devices=1, strategy=HeteroStrategy(controller="lbbsp", adjust_every=2),
    max_epochs=2, callbacks=[ModelCheckpoint(dirpath=out, save_last=True)], logger=False,
    enable_model_summary=False, limit_val_batches=0)
trainer.fit(_Model())
