"""Step timing on 2 gloo ranks where rank 1 sleeps ``COST[k]`` seconds per sample of its batch
at a point the timer must get right. Rank 0 writes the strategy's history to OUT_PATH as JSON.

MODE ``manual``: manual optimization with two backward passes per step; rank 1 sleeps between
them, so it is slow only in its second backward.
MODE ``logged``: automatic optimization; rank 1 sleeps in ``training_step`` before a
``self.log(..., sync_dist=True)``, where rank 0 waits for it.

usage: python step_timing.py MODE OUT_PATH
"""

import datetime
import json
import sys
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy

# seconds per sample: rank 1's 16 samples sleep 128 ms a step, well above what the timing
# noise of a busy machine moves between the two ranks
COST = [0.0, 0.008]
BATCH_SIZE = 16  # per rank, at the start
STEPS = 8  # per epoch


class TwoBackwards(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        optimizer = self.optimizers()
        optimizer.zero_grad()
        self.manual_backward(torch.nn.functional.mse_loss(self.layer(x), y))
        time.sleep(COST[self.global_rank] * len(x))  # the second backward is the slow one
        self.manual_backward(torch.nn.functional.mse_loss(self.layer(2 * x), y))
        optimizer.step()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        n = 2 * BATCH_SIZE * STEPS
        data = TensorDataset(
            torch.randn(n, 8, generator=generator), torch.randn(n, 1, generator=generator)
        )
        return DataLoader(data, batch_size=BATCH_SIZE, shuffle=True)


class LoggedLoss(TwoBackwards):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = True

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        time.sleep(COST[self.global_rank] * len(x))
        self.log("loss", loss, sync_dist=True)  # a collective: rank 0 waits here
        return loss


if __name__ == "__main__":
    mode, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=HeteroStrategy(timeout=datetime.timedelta(seconds=60)),
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
    )
    trainer.fit(TwoBackwards() if mode == "manual" else LoggedLoss())
    if trainer.global_rank == 0:
        with open(out, "w") as f:
            json.dump(trainer.strategy.history, f)
    torch.distributed.destroy_process_group()
