"""A Lightning program as users write it, run on 2 gloo ranks with ``strategy="hetero"``.

Lightning's defaults stay on (progress bar, checkpointing, model summary); the model logs
what real projects log: a torchmetrics metric and ``sync_dist=True`` scalars at epoch and
validation level, read at epoch end by a ``@rank_zero_only`` callback.

usage: python user_program.py OUT_JSON [--bar tqdm|rich] [--adjust-every N]
       [--hetero-callback none|first|last] [--bn] [--samples N] [--batch-size N]
       [--min-batch-size N] [--plan B0,B1] [--loaders N] [--cores] [--onecycle]
       [--in-order] [--epochs N] [--val-check-interval X] [--resume CKPT]
"""

import argparse
import json
from datetime import timedelta

import lightning.pytorch as pl
import torch
import torchmetrics
from lightning.pytorch.callbacks import Callback, RichProgressBar, TQDMProgressBar
from lightning.pytorch.utilities.rank_zero import rank_zero_only
from torch.utils.data import DataLoader, Dataset

from lightning_hetero import HeteroCallback, HeteroStrategy


class IndexedDataset(Dataset):
    """Features, labels and each sample's index (to record the order samples arrive in)."""

    def __init__(self, samples: int) -> None:
        generator = torch.Generator().manual_seed(0)
        self.x = torch.randn(samples, 8, generator=generator)
        self.y = (self.x.sum(dim=1) > 0).long()

    def __len__(self) -> int:
        return len(self.x)

    def __getitem__(self, index: int):
        return self.x[index], self.y[index], index


class Classifier(pl.LightningModule):
    def __init__(self, args: argparse.Namespace) -> None:
        super().__init__()
        self.args = args
        layers = [torch.nn.Linear(8, 16)]
        if args.bn:
            layers.append(torch.nn.BatchNorm1d(16))
        layers += [torch.nn.ReLU(), torch.nn.Linear(16, 2)]
        self.net = torch.nn.Sequential(*layers)
        self.train_acc = torchmetrics.Accuracy(task="multiclass", num_classes=2)
        self.val_acc = torchmetrics.Accuracy(task="multiclass", num_classes=2)
        self.seen: list[list[int]] = []  # sample indices per training step, this rank

    def _batches(self, batch):
        # one loader: (x, y, index); several: a dict of those
        return list(batch.values()) if isinstance(batch, dict) else [batch]

    def training_step(self, batch, batch_idx):
        loss = 0.0
        for x, y, index in self._batches(batch):
            self.seen.append(index.tolist())
            logits = self.net(x)
            loss = loss + torch.nn.functional.cross_entropy(logits, y)
            self.train_acc(logits, y)
        self.log("train/loss", loss, on_step=True, on_epoch=True, sync_dist=True, prog_bar=True)
        self.log("train/acc", self.train_acc, on_step=False, on_epoch=True, prog_bar=True)
        return loss

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        logits = self.net(x)
        self.val_acc(logits, y)
        loss = torch.nn.functional.cross_entropy(logits, y)
        self.log("val/loss", loss, on_epoch=True, sync_dist=True, prog_bar=True)
        self.log("val/acc", self.val_acc, on_epoch=True, prog_bar=True)

    def on_train_epoch_end(self) -> None:
        self.log("train/epoch_marker", float(self.current_epoch), sync_dist=True)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.parameters(), lr=0.1)
        if not self.args.onecycle:
            return optimizer
        # the OneCycleLR pattern from Lightning's docs: reads the loader before our set-up
        steps = self.trainer.estimated_stepping_batches
        scheduler = torch.optim.lr_scheduler.OneCycleLR(optimizer, max_lr=0.1, total_steps=steps)
        return {
            "optimizer": optimizer,
            "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
        }

    def _loader(self, samples: int) -> DataLoader:
        return DataLoader(IndexedDataset(samples), batch_size=self.args.batch_size)

    def train_dataloader(self):
        if self.args.loaders > 1:
            return {f"part{i}": self._loader(self.args.samples) for i in range(self.args.loaders)}
        return self._loader(self.args.samples)

    def val_dataloader(self):
        return self._loader(64)


class ReadMetricsOnRankZero(Callback):
    """A user callback that reads every epoch-level metric on rank 0 only."""

    def __init__(self) -> None:
        self.read: list[dict[str, float]] = []

    @rank_zero_only
    def on_train_epoch_end(self, trainer, pl_module) -> None:
        self.read.append({k: float(v) for k, v in trainer.callback_metrics.items()})


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--bar", choices=["tqdm", "rich"], default="tqdm")
    parser.add_argument("--adjust-every", default="epoch")
    parser.add_argument("--hetero-callback", choices=["none", "first", "last"], default="none")
    parser.add_argument("--bn", action="store_true")
    parser.add_argument("--samples", type=int, default=96)
    parser.add_argument("--batch-size", type=int, default=8)
    parser.add_argument("--min-batch-size", type=int, default=None)
    parser.add_argument("--plan", default=None)
    parser.add_argument("--loaders", type=int, default=1)
    parser.add_argument("--cores", action="store_true")
    parser.add_argument("--onecycle", action="store_true")
    parser.add_argument("--in-order", action="store_true")
    parser.add_argument("--epochs", type=int, default=2)
    parser.add_argument("--val-check-interval", type=float, default=1.0)
    parser.add_argument("--resume", default=None)
    args = parser.parse_args()
    torch.set_num_threads(1)

    options = {}
    if args.adjust_every != "epoch":
        options["adjust_every"] = int(args.adjust_every)
        # a boundary every N batches whatever it costs: the test counts them, and on these
        # 4 ms steps the default `replan_budget` would spread them
        options["replan_budget"] = None
    if args.min_batch_size is not None:
        options["min_batch_size"] = args.min_batch_size
    if args.plan:
        options["batch_sizes"] = [int(b) for b in args.plan.split(",")]
        options["controller"] = "static"
    if args.cores:
        options["batch_sizes"] = "cores"
    if args.in_order:
        options["shuffle"] = False
    strategy = HeteroStrategy(timeout=timedelta(seconds=60), **options)
    reader = ReadMetricsOnRankZero()
    callbacks = [reader, RichProgressBar() if args.bar == "rich" else TQDMProgressBar()]
    if args.hetero_callback == "first":
        callbacks.insert(0, HeteroCallback())
    elif args.hetero_callback == "last":
        callbacks.append(HeteroCallback())
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=callbacks,
        default_root_dir=args.out + ".logs",
        log_every_n_steps=1,
        val_check_interval=args.val_check_interval,
    )
    model = Classifier(args)
    trainer.fit(model, ckpt_path=args.resume)
    seen = strategy.gather_objects(model.seen)
    if trainer.global_rank == 0:
        result = {
            "history": strategy.history,
            "batch_sizes": strategy.batch_sizes,
            "read_on_rank0": reader.read,
            "seen": seen,
            "global_step": trainer.global_step,
            "checkpoint": trainer.checkpoint_callback.best_model_path,
            "lr_steps": trainer.lr_scheduler_configs[0].scheduler.last_epoch
            if trainer.lr_scheduler_configs
            else None,
        }
        with open(args.out, "w") as f:
            json.dump(result, f, default=float)
    torch.distributed.destroy_process_group()  # after our own collective above


if __name__ == "__main__":
    main()
