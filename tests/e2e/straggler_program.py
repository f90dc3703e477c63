"""StragglerReport under an unchanged ``strategy="ddp"`` job on 2 gloo ranks: every rank runs
``--busy`` seconds of work in each step's forward; ``--delay`` adds seconds to one rank's
backward only, in the first ``--delay-epochs`` epochs (inside an autograd function's
backward, so DDP's all-reduce spreads it over every rank's backward wall time). Rank 0 writes
the report's history to OUT_PATH as JSON.

usage: python straggler_program.py OUT_PATH [--busy S] [--delay S] [--slow-rank K] [--epochs N]
       [--delay-epochs N]
"""

import argparse
import json
import time

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import StragglerReport

BATCH_SIZE = 8  # per rank
STEPS = 12  # per epoch


def _spin(seconds: float) -> None:
    """Busy work (a device's compute holds the thread; a sleep would not)."""
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class SlowBackward(torch.autograd.Function):
    """The identity, whose backward spends ``delay`` seconds more."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, delay: float) -> torch.Tensor:
        ctx.delay = delay
        return x.view_as(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        _spin(ctx.delay)
        return grad, None


class Model(pl.LightningModule):
    def __init__(self, busy: float, delay: float, slow_rank: int, delay_epochs: int) -> None:
        super().__init__()
        self.busy, self.delay, self.slow_rank = busy, delay, slow_rank
        self.delay_epochs = delay_epochs
        self.first = torch.nn.Linear(8, 16)
        self.second = torch.nn.Linear(16, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        _spin(self.busy)
        slow = self.global_rank == self.slow_rank and self.current_epoch < self.delay_epochs
        delay = self.delay if slow else 0.0
        hidden = SlowBackward.apply(self.first(x), delay)  # before `first`'s gradients
        loss = torch.nn.functional.mse_loss(self.second(torch.relu(hidden)), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        samples = 2 * BATCH_SIZE * STEPS
        x = torch.randn(samples, 8, generator=generator)
        y = torch.randn(samples, 1, generator=generator)
        return DataLoader(TensorDataset(x, y), batch_size=BATCH_SIZE)


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--busy", type=float, default=0.0)
    parser.add_argument("--delay", type=float, default=0.0)
    parser.add_argument("--slow-rank", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=1)
    parser.add_argument("--delay-epochs", type=int, default=None, help="default: all")
    args = parser.parse_args()
    torch.set_num_threads(1)
    report = StragglerReport()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy="ddp",
        max_epochs=args.epochs,
        callbacks=[report],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    delay_epochs = args.epochs if args.delay_epochs is None else args.delay_epochs
    trainer.fit(Model(args.busy, args.delay, args.slow_rank, delay_epochs))
    if trainer.global_rank == 0:
        with open(args.out, "w") as f:
            json.dump(report.history, f)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
