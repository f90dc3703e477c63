"""2 ranks under Lightning's own launcher: what a data library that reads the process's rank
variables when it is built (MosaicML's ``StreamingDataset``) sees in ``train_dataloader``.

usage: python rank_env_program.py OUT_JSON

Rank 0 writes each rank's variables and the samples it trained, per epoch, to OUT_JSON, and
what is left after ``fit`` (the variables the strategy set, its callback).
"""

import json
import os
import sys
from datetime import timedelta

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader

from lightning_hetero import HeteroStrategy
from lightning_hetero.streaming import StreamingView

SAMPLES, SHARD = 40, 8
NAMES = ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE")


class Shards:
    """Reads the variables when built, as MosaicML's ``World.detect()`` does (a missing one
    means a single process), and its samples by ``get_item``, in shards."""

    def __init__(self) -> None:
        self.seen_env = {name: os.environ.get(name) for name in NAMES}
        self.samples_per_shard = [SHARD] * (SAMPLES // SHARD)

    def __len__(self) -> int:
        return SAMPLES

    def get_item(self, index: int) -> dict:
        x = torch.full((4,), float(index))
        return {"index": index, "x": x}


class Model(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.seen: list[list[int]] = []
        self.shards: Shards | None = None

    def train_dataloader(self) -> DataLoader:
        self.shards = Shards()  # built here, as in the guides
        return DataLoader(StreamingView(self.shards, window=2), batch_size=4)

    def training_step(self, batch, batch_idx):
        self.seen.append([self.current_epoch, *batch["index"].tolist()])
        return self.layer(batch["x"]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.0)


if __name__ == "__main__":
    torch.set_num_threads(1)
    strategy = HeteroStrategy(batch_sizes=[5, 3], controller="static", timeout=timedelta(60))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    model = Model()
    trainer.fit(model)
    after = {name: os.environ.get(name) for name in ("RANK", "LOCAL_WORLD_SIZE")}
    hetero = [type(cb).__name__ for cb in trainer.callbacks if "Hetero" in type(cb).__name__]
    row = {"env": model.shards.seen_env, "seen": model.seen, "after": after, "hetero": hetero}
    rows = strategy.gather_objects(row)
    if trainer.global_rank == 0:
        with open(sys.argv[1], "w") as f:
            json.dump(rows, f)
    torch.distributed.destroy_process_group()
