"""Sharded training (FSDP2) with per-rank batch sizes: HeteroFSDPStrategy.

    python examples/fsdp.py                  # 2 CPU ranks (gloo), rank 1 emulated 3x slower
    python examples/fsdp.py --accelerator gpu --devices 2 --no-throttle   # two unequal GPUs

A small transformer classifier written as LightningModules usually are: the step calls its
submodules directly. Each ``Block`` is sharded on its own (``shard_modules``), then the
whole model; ``max_batch_size="auto"`` measures each rank's memory bound under sharding, so
a GPU with less memory gets a smaller batch.
"""

import argparse

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroFSDPStrategy
from lightning_hetero.emulate import Throttle


class Block(torch.nn.Module):
    def __init__(self, width: int) -> None:
        super().__init__()
        self.attention = torch.nn.MultiheadAttention(width, num_heads=4, batch_first=True)
        self.mlp = torch.nn.Sequential(
            torch.nn.Linear(width, 4 * width), torch.nn.GELU(), torch.nn.Linear(4 * width, width)
        )
        self.norm1, self.norm2 = torch.nn.LayerNorm(width), torch.nn.LayerNorm(width)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = self.norm1(x)
        x = x + self.attention(h, h, h, need_weights=False)[0]
        return x + self.mlp(self.norm2(x))


class SequenceClassifier(pl.LightningModule):
    def __init__(self, vocab: int = 64, width: int = 64, depth: int = 2) -> None:
        super().__init__()
        self.embed = torch.nn.Embedding(vocab, width)
        self.blocks = torch.nn.ModuleList(Block(width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 2)

    def training_step(self, batch, batch_idx):
        tokens, labels = batch
        x = self.embed(tokens)
        for block in self.blocks:  # submodules called directly, not through self(x)
            x = block(x)
        loss = torch.nn.functional.cross_entropy(self.head(x.mean(1)), labels)
        self.log("train_loss", loss, prog_bar=True, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-3)

    def train_dataloader(self):
        # label: whether token 0 occurs in the sequence (generated: no download), with 10% of
        # the labels flipped: the model learns the rule within an epoch, and without the noise
        # its loss would fall to 0.000 instead of a floor near the noise's entropy (0.33)
        generator = torch.Generator().manual_seed(1)
        tokens = torch.randint(0, 64, (1024, 32), generator=generator)
        flipped = torch.rand(1024, generator=generator) < 0.1
        labels = ((tokens == 0).any(1) ^ flipped).long()
        return DataLoader(TensorDataset(tokens, labels), batch_size=16, shuffle=True)


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--accelerator", default="cpu")
    parser.add_argument("--devices", type=int, default=2)
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--no-throttle", action="store_true", help="ranks as they are")
    args = parser.parse_args()
    torch.set_num_threads(1)
    callbacks = []
    if not args.no_throttle:
        callbacks.append(Throttle(sample_cost=[0.002] * (args.devices - 1) + [0.006]))
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.devices,
        strategy=HeteroFSDPStrategy(shard_modules=["Block"], max_batch_size="auto", adjust_every=8),
        max_epochs=args.epochs,
        callbacks=callbacks,
    )
    trainer.fit(SequenceClassifier())
    if trainer.global_rank == 0:
        print(f"final batch sizes per rank: {trainer.strategy.batch_sizes}")
        loss = trainer.callback_metrics["train_loss_epoch"]
        print(f"rank 0's mean train_loss in the last epoch: {loss:.3f}")


if __name__ == "__main__":
    main()
