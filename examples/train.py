"""A plain Lightning program trained with HeteroStrategy: copy it and swap in your model.

    python examples/train.py                          # 2 CPU ranks, rank 1 emulated 3x slower
    python examples/train.py --devices 4 --epochs 5
    # several machines (run on each; rank 0's address as --rdzv-endpoint):
    torchrun --nnodes 2 --nproc-per-node 2 --rdzv-backend c10d --rdzv-endpoint HOST:29400 \\
        examples/train.py --devices 2 --num-nodes 2 --no-throttle

The model and the data know nothing of the strategy. ``Throttle`` makes the ranks unequal on
one machine (each sleeps ``sample_cost[k]`` seconds per sample of its batch); on a real
heterogeneous cluster leave it out (``--no-throttle``).
"""

import argparse

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy
from lightning_hetero.emulate import Throttle


def blobs(n: int, seed: int) -> TensorDataset:
    """``n`` points of 4 Gaussian classes in 16 dimensions (generated: no download)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=generator)
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 0.5
    return TensorDataset(centers[labels] + torch.randn(n, 16, generator=generator), labels)


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 4)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.head(self.body(x)), y)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y = batch
        accuracy = (self.head(self.body(x)).argmax(1) == y).float().mean()
        self.log("val_acc", accuracy, prog_bar=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self):
        return DataLoader(blobs(2048, seed=1), batch_size=32, shuffle=True)  # per rank

    def val_dataloader(self):
        return DataLoader(blobs(512, seed=2), batch_size=64)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--num-nodes", type=int, default=1)
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--no-throttle", action="store_true", help="ranks as they are")
    args = parser.parse_args()
    torch.set_num_threads(1)
    callbacks = []
    if not args.no_throttle:  # rank k costs sample_cost[k] s per sample: the last is slowest
        costs = [0.0005] * (args.devices * args.num_nodes - 1) + [0.0015]
        callbacks.append(Throttle(sample_cost=costs))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=HeteroStrategy(adjust_every=8),  # re-plan every 8 steps
        max_epochs=args.epochs,
        callbacks=callbacks,
    )
    trainer.fit(Classifier())
    if trainer.global_rank == 0:
        print(f"final batch sizes per rank: {trainer.strategy.batch_sizes}")


if __name__ == "__main__":
    main()
