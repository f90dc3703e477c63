"""A map-style dataset on 2 gloo ranks, uneven plan, checkpoints inside an epoch.

usage: python resume_program.py OUT_JSON CKPT_DIR [--resume CKPT]

``val_check_interval=0.5`` validates (and ModelCheckpoint saves) in the middle of each
epoch; the plan changes from step CHANGE_AT of epoch 0, scheduled before that checkpoint.
Rank 0 writes the sample indices each rank trained per step to OUT_JSON.
"""

import argparse
import json
from datetime import timedelta

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, Dataset

from lightning_hetero import HeteroStrategy

SAMPLES, PLAN, CHANGED, CHANGE_AT = 100, [10, 6], [4, 12], 5  # 7 steps: 6 of 16, one of 4


class Indexed(Dataset):
    """Sample ``i`` carries its index, so the program can record what each rank trained."""

    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        x = torch.randn(4, generator=torch.Generator().manual_seed(index))
        return {"index": index, "x": x, "y": x.sum(0, keepdim=True)}


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[list[int]] = []  # per step: epoch, batch index, then the samples

    def training_step(self, batch, batch_idx):
        self.seen.append([self.current_epoch, batch_idx, *batch["index"].tolist()])
        return torch.nn.functional.mse_loss(self.layer(batch["x"]), batch["y"])

    def validation_step(self, batch, batch_idx):
        loss = torch.nn.functional.mse_loss(self.layer(batch["x"]), batch["y"])
        self.log("val_loss", loss, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        return DataLoader(Indexed(), batch_size=8)

    def val_dataloader(self):
        return DataLoader(Indexed(), batch_size=16)


class ChangePlan(Callback):
    """Switch to CHANGED from step CHANGE_AT of epoch 0 (scheduled at step 1)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 0 and batch_idx == 1:
            trainer.strategy.apply_plan(CHANGED, from_step=CHANGE_AT)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("checkpoints")
    parser.add_argument("--resume")
    args = parser.parse_args()
    torch.set_num_threads(1)
    strategy = HeteroStrategy(batch_sizes=PLAN, controller="static", timeout=timedelta(seconds=60))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=2,
        val_check_interval=0.5,
        logger=False,
        enable_model_summary=False,
        callbacks=[ChangePlan(), ModelCheckpoint(args.checkpoints, save_top_k=-1)],
    )
    model = Regression()
    trainer.fit(model, ckpt_path=args.resume)
    seen = strategy.gather_objects(model.seen)
    if trainer.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump({"seen": seen}, f)
    torch.distributed.destroy_process_group()
