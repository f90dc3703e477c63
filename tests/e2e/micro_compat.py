"""Lightning features beside micro-batches, on 2 gloo ranks, several cases in one launch (each
a fresh Trainer); rank 0 saves what each case recorded (issue 40's failures 1, 2 and 7).

usage: python micro_compat.py OUT_PATH CASE [CASE ...]
CASE: ``logging`` (synced step logging, a backward hook's synced value and a torchmetrics
metric with ``dist_sync_on_step``, the plan [8, 2] in micro-batches of 2: rank 0 runs 4, rank
1 one; ``logging_fsdp``: the same under ``HeteroFSDPStrategy``), ``schedule`` (accumulation
2 taken over, 10 loader batches per rank,
``val_check_interval=0.5``, ``ModelCheckpoint(save_last=True)``, 2 epochs), ``partial``
(accumulation 2 taken over, ``limit_train_batches=5`` and ``val_check_interval=3``: DDP's
last, partial window).
"""

import sys
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
import torchmetrics
from lightning.pytorch.callbacks import ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy


def data(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(samples, 5, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True), torch.arange(samples))


class Model(pl.LightningModule):
    def __init__(self, samples: int, batch: int, metric: bool = False) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(5, 1)
        self.samples, self.batch = samples, batch
        self.metric = torchmetrics.MeanMetric(dist_sync_on_step=True) if metric else None
        self.calls: list[tuple[float, int]] = []  # each training_step: its loss and samples
        self.indices: list[int] = []
        self.validated: list[int] = []  # global steps at which validation ran

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.calls.append((float(loss), len(x)))
        self.indices += index.tolist()
        self.log("train_loss", loss, sync_dist=True)
        self.log("target", y.mean(), on_step=False, on_epoch=True, sync_dist=True)
        if self.metric is not None:
            self.metric(y.mean())
            self.log("metric", self.metric, on_step=True, on_epoch=False)
        return loss

    def on_after_backward(self):  # a backward hook's synced value: the samples just run
        self.log("grad", torch.tensor(float(self.calls[-1][1])), sync_dist=True)

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.layer(x), y), sync_dist=True)

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self.validated.append(self.trainer.global_step)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        return DataLoader(data(self.samples), batch_size=self.batch)

    def val_dataloader(self):
        return DataLoader(data(8), batch_size=4)


def logging(folder: Path, sharded: bool = False) -> dict:
    model = Model(40, 10, metric=True)
    kind = HeteroFSDPStrategy if sharded else HeteroStrategy
    strategy = kind(
        batch_sizes=[8, 2], controller="static", micro_batch_size=2, shuffle=False,
        timeout=timedelta(seconds=60),
    )  # fmt: skip
    trainer = fit(model, strategy, max_steps=3, limit_val_batches=0)
    calls = trainer.strategy.gather_objects(model.calls)
    # the last step's synced value: each rank's last micro-batch, weighted by its samples
    last = [rank_calls[-1] for rank_calls in calls]
    expected = sum(loss * n for loss, n in last) / sum(n for _, n in last)
    metrics = {k: float(v) for k, v in trainer.callback_metrics.items()}
    # the epoch-level mean (DDP's too): every trained sample once, the first 3 global batches
    target = float(data(40).tensors[1][:30].mean())
    return {"calls": calls, "expected_loss": expected, "metrics": metrics, "target": target}


def logging_fsdp(folder: Path) -> dict:
    return logging(folder, sharded=True)


def schedule(folder: Path) -> dict:
    model = Model(40, 2)  # 10 loader batches per rank under DDP
    checkpoint = ModelCheckpoint(dirpath=folder, save_last=True, monitor="val_loss")
    trainer = fit(
        model, HeteroStrategy(timeout=timedelta(seconds=60)), max_epochs=2,
        accumulate_grad_batches=2, val_check_interval=0.5, callbacks=[checkpoint],
    )  # fmt: skip
    last = torch.load(folder / "last.ckpt", weights_only=False)
    return {
        "validated": model.validated,
        "global_step": trainer.global_step,
        "last_step": last["global_step"],
        "best_step": torch.load(checkpoint.best_model_path, weights_only=False)["global_step"],
        "total": trainer.num_training_batches,
    }


def partial(folder: Path) -> dict:
    model = Model(40, 2)
    trainer = fit(
        model, HeteroStrategy(timeout=timedelta(seconds=60)), max_epochs=1,
        accumulate_grad_batches=2, limit_train_batches=5, val_check_interval=3,
    )  # fmt: skip
    indices = trainer.strategy.gather_objects(model.indices)
    return {
        "validated": model.validated,
        "global_step": trainer.global_step,
        "indices": sorted(i for rank in indices for i in rank),
    }


def fit(model: pl.LightningModule, strategy: pl.strategies.Strategy, **options) -> pl.Trainer:
    trainer = pl.Trainer(
        accelerator="cpu", devices=2, strategy=strategy, logger=False,
        enable_checkpointing="callbacks" in options, enable_model_summary=False,
        enable_progress_bar=False, num_sanity_val_steps=0, **options,
    )  # fmt: skip
    trainer.fit(model)
    return trainer


if __name__ == "__main__":
    out = Path(sys.argv[1])
    torch.set_num_threads(1)
    results = {}
    for case in sys.argv[2:]:
        folder = out.parent / case
        results[case] = globals()[case](folder)
    if torch.distributed.get_rank() == 0:
        torch.save(results, out)
    torch.distributed.destroy_process_group()
