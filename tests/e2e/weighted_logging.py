"""Training metrics logged with ``sync_dist=True`` on 2 gloo ranks with unequal batches [3, 2].

Each sample carries a value ``v``; every step logs the batch mean of ``v`` on step and epoch
level, and feeds a torchmetrics ``MeanMetric`` weighted by batch size. Rank 0 writes the
values the logger received, the ``v`` each rank saw per step and the validation values to
OUT_PATH as JSON.

usage: python weighted_logging.py OUT_PATH
"""

import datetime
import json
import sys

import lightning.pytorch as pl
import torch
import torchmetrics
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy

PLAN = [3, 2]
N_TRAIN = 15  # 9 and 6 samples per epoch: an odd sum, which DDP's integer mean truncates
N_VAL = 8


def values(n: int) -> torch.Tensor:
    return torch.arange(n, dtype=torch.float32) ** 2  # far from uniform: weighting shows


class Recorder(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.records: list[dict[str, float]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.records.append({key: float(value) for key, value in metrics.items()})


class Mean(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.w = torch.nn.Parameter(torch.zeros(1))
        self.x_metric = torchmetrics.MeanMetric()  # as the README says: weighted by batch
        self.seen: list[list[float]] = []
        self.val_seen: list[float] = []

    def training_step(self, batch, batch_idx):
        (v,) = batch
        assert len(v) == PLAN[self.global_rank]
        self.seen.append(v.tolist())
        self.log("x", v.mean(), on_step=True, on_epoch=True, sync_dist=True, prog_bar=True)
        self.x_metric.update(v.mean(), weight=len(v))
        self.log("x_metric", self.x_metric, on_step=False, on_epoch=True)
        return ((self.w - v) ** 2).mean()

    def validation_step(self, batch, batch_idx):
        (v,) = batch
        self.val_seen.extend(v.tolist())
        self.log("val_x", v.mean(), on_epoch=True, sync_dist=True)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.001)

    def train_dataloader(self):
        return DataLoader(TensorDataset(values(N_TRAIN)), batch_size=2, shuffle=True)

    def val_dataloader(self):
        return DataLoader(TensorDataset(values(N_VAL) + 0.5), batch_size=2)


if __name__ == "__main__":
    out = sys.argv[1]
    torch.set_num_threads(1)
    recorder = Recorder()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=HeteroStrategy(
            batch_sizes=PLAN, controller="static", timeout=datetime.timedelta(seconds=60)
        ),
        max_epochs=2,
        logger=recorder,
        log_every_n_steps=1,
        enable_checkpointing=False,
        num_sanity_val_steps=0,
    )
    model = Mean()
    trainer.fit(model)
    seen: list = [None] * trainer.world_size
    torch.distributed.all_gather_object(seen, model.seen)
    val_seen: list = [None] * trainer.world_size
    torch.distributed.all_gather_object(val_seen, model.val_seen)
    if trainer.global_rank == 0:
        result = {"records": recorder.records, "seen": seen, "val_seen": val_seen}
        with open(out, "w") as f:
            json.dump(result, f)
    torch.distributed.destroy_process_group()
