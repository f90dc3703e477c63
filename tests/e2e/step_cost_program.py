"""What a rank's step cost holds, on 2 gloo ranks: a tiny model on a dataset whose
``__getitem__`` sleeps ``--sleep`` seconds per sample, loaded on the training thread
(``--workers 0``) or in worker processes, with an optional :class:`Throttle` for the device.
Rank 0 writes the strategy's history to OUT_PATH as JSON, and the end-of-fit summary
(``HeteroCallback.summary``) to OUT_PATH.summary.

The plan is fixed (``controller="static"``) unless ``--adaptive``: every rank keeps
``BATCH_SIZE`` samples per step, so each boundary's ``compute_times`` describe that batch.

usage: python step_cost_program.py OUT_PATH [--sleep S] [--workers N]
       [--sample-cost C0,C1] [--load-cost L] [--adaptive]
"""

import argparse
import datetime
import json
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, Dataset

from lightning_hetero import HeteroCallback, HeteroStrategy
from lightning_hetero.emulate import Throttle

BATCH_SIZE = 8  # per rank, every step
STEPS = 12  # per epoch: one-off costs (worker start, the first steps) weigh little in a mean
EPOCHS = 2


class SlowDataset(Dataset):
    """Random features and targets; reading a sample sleeps ``sleep_s`` (decoding, disk)."""

    def __init__(self, samples: int, sleep_s: float) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, 8, generator=generator)
        self.y = torch.randn(samples, 1, generator=generator)
        self.sleep_s = sleep_s

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        if self.sleep_s:
            time.sleep(self.sleep_s)
        return self.x[index], self.y[index]


class Tiny(pl.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        self.layer = torch.nn.Linear(8, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        workers = self.args.workers
        return DataLoader(
            SlowDataset(2 * BATCH_SIZE * STEPS, self.args.sleep),
            batch_size=BATCH_SIZE,
            shuffle=True,
            num_workers=workers,
            persistent_workers=workers > 0,
        )


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--sleep", type=float, default=0.0)
    parser.add_argument("--workers", type=int, default=0)
    parser.add_argument("--sample-cost", default=None)
    parser.add_argument("--load-cost", type=float, default=0.0)
    parser.add_argument("--adaptive", action="store_true")
    args = parser.parse_args()
    torch.set_num_threads(1)

    hetero = HeteroCallback()  # the strategy attaches one; this one is kept after fit
    callbacks: list[pl.Callback] = [hetero]
    if args.sample_cost is not None or args.load_cost:
        costs = [float(c) for c in (args.sample_cost or "0,0").split(",")]
        callbacks.append(Throttle(sample_cost=costs, load_cost=args.load_cost))
    controller = {} if args.adaptive else {"controller": "static"}
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=HeteroStrategy(timeout=datetime.timedelta(seconds=60), **controller),
        max_epochs=EPOCHS,
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(Tiny(args))
    if trainer.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump(trainer.strategy.history, f)
        with open(f"{args.out}.summary", "w") as f:
            json.dump(hetero.summary, f)  # the end-of-fit summary
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
