"""LitData through StreamingView on 2 gloo ranks: a plan change mid-epoch, checkpoints.

usage: python streaming_program.py DATA_DIR OUT_JSON CKPT_DIR [--epochs N] [--resume CKPT]

Rank 0 writes the samples each rank trained per step, the final weights and the order's
seed to OUT_JSON.
"""

import argparse
import json
from datetime import timedelta

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from litdata import StreamingDataset
from torch.utils.data import DataLoader

from lightning_hetero import HeteroStrategy
from lightning_hetero.streaming import StreamingView

PLAN, CHANGED, CHANGE_AT, WINDOW, LR = [10, 6], [4, 12], 5, 2, 0.05


def initial_layer() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(4, 1)


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = initial_layer()
        self.seen: list[list[int]] = []  # per step: epoch, batch index, then the samples

    def training_step(self, batch, batch_idx):
        self.seen.append([self.current_epoch, batch_idx, *batch["index"].tolist()])
        return torch.nn.functional.mse_loss(self.layer(batch["x"]), batch["y"])

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=LR)


class ChangePlan(Callback):
    """Switch to CHANGED from step CHANGE_AT of epoch 0 (scheduled at step 2)."""

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        if trainer.current_epoch == 0 and batch_idx == 2:
            trainer.strategy.apply_plan(CHANGED, from_step=CHANGE_AT)

    def on_train_end(self, trainer, pl_module):
        # the strategy's order (after `fit` the Trainer holds Lightning's loader again)
        self.order = trainer.train_dataloader.batch_sampler.sampler


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("data")
    parser.add_argument("out")
    parser.add_argument("checkpoints")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--resume")
    args = parser.parse_args()
    torch.set_num_threads(1)
    view = StreamingView(StreamingDataset(args.data), window=WINDOW)
    strategy = HeteroStrategy(batch_sizes=PLAN, controller="static", timeout=timedelta(seconds=60))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=args.epochs,
        logger=False,
        enable_model_summary=False,
        callbacks=[
            change := ChangePlan(),
            ModelCheckpoint(args.checkpoints, every_n_train_steps=4, save_top_k=-1),
        ],
    )
    model = Regression()
    trainer.fit(model, DataLoader(view, batch_size=8), ckpt_path=args.resume)
    seen = strategy.gather_objects(model.seen)
    if trainer.global_rank == 0:
        state = {k: v.tolist() for k, v in model.layer.state_dict().items()}
        order = change.order
        result = {"seen": seen, "weights": state, "seed": order.seed, "group": order.group}
        with open(args.out, "w") as f:
            json.dump(result, f)
    torch.distributed.destroy_process_group()
