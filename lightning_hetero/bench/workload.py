"""The benchmark and demo workloads: a small CNN on scikit-learn's handwritten digits, and a
one-layer transformer that reverses sequences of digits (Adam, for the mode benchmark).

``sklearn.datasets.load_digits`` ships inside scikit-learn (1,797 8x8 images, 10
classes), so runs need no network. scikit-learn comes with the ``bench`` extra.
"""

import math
from typing import Any

import lightning.pytorch as pl
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = [
    "DigitsCNN",
    "DigitsDataModule",
    "ReverseDataModule",
    "ReverseTransformer",
    "load_digits_tensors",
    "reverse_tensors",
]


def load_digits_tensors(
    seed: int = 0, test_fraction: float = 0.2, resolution: int = 8
) -> tuple[TensorDataset, TensorDataset]:
    """Digits as ``(train, test)`` TensorDatasets of ``1 x r x r`` images in ``[0, 1]``.

    ``resolution`` above the native 8 upsamples once (bilinear), so that resizing during
    training (progressive learning) has detail to lose.
    """
    if resolution < 1:
        raise ValueError(f"`resolution` must be >= 1, got {resolution}.")
    try:
        from sklearn.datasets import load_digits
    except ImportError as err:  # pragma: no cover - bench extra missing
        raise ImportError(
            "The digits workload needs scikit-learn: pip install 'lightning_hetero[bench]'"
        ) from err
    digits = load_digits()
    images = torch.tensor(digits.images, dtype=torch.float32).unsqueeze(1) / 16.0
    if resolution != images.shape[-1]:
        images = nn.functional.interpolate(
            images, size=(resolution, resolution), mode="bilinear", align_corners=False
        )
    labels = torch.tensor(digits.target, dtype=torch.long)
    order = torch.randperm(len(labels), generator=torch.Generator().manual_seed(seed))
    num_test = int(len(labels) * test_fraction)
    test, train = order[:num_test], order[num_test:]
    return TensorDataset(images[train], labels[train]), TensorDataset(images[test], labels[test])


class DigitsDataModule(pl.LightningDataModule):
    """Train/test split of the digits; ``batch_size`` is the per-rank (uniform) batch."""

    def __init__(
        self, batch_size: int = 32, num_workers: int = 0, seed: int = 0, resolution: int = 8
    ) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.num_workers = num_workers
        self.seed = seed
        self.train_set, self.test_set = load_digits_tensors(seed, resolution=resolution)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(
            self.train_set,
            batch_size=self.batch_size,
            shuffle=True,
            num_workers=self.num_workers,
            persistent_workers=self.num_workers > 0,
        )

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.test_set, batch_size=256)


class DigitsCNN(pl.LightningModule):
    """Two conv layers with BatchNorm and a linear head; logs accuracy with torchmetrics.

    Any input resolution works (adaptive pooling); ``dropout`` is applied before the head.
    ``width`` multiplies the channel counts (16 and 32), to give a GPU enough work.
    """

    def __init__(
        self, lr: float = 0.05, batch_norm: bool = True, dropout: float = 0.0, width: int = 1
    ) -> None:
        super().__init__()
        if width < 1:
            raise ValueError(f"`width` must be >= 1, got {width}.")
        self.save_hyperparameters()
        norm = nn.BatchNorm2d if batch_norm else nn.Identity
        c1, c2 = 16 * width, 32 * width
        self.net = nn.Sequential(
            nn.Conv2d(1, c1, 3, padding=1),
            norm(c1),
            nn.ReLU(),
            nn.Conv2d(c1, c2, 3, padding=1),
            norm(c2),
            nn.ReLU(),
            nn.AdaptiveAvgPool2d(2),
            nn.Flatten(),
            nn.Dropout(dropout),
            nn.Linear(4 * c2, 10),
        )
        self.train_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=10)
        self.val_acc = torchmetrics.classification.MulticlassAccuracy(num_classes=10)

    def configure_model(self) -> None:
        """Under ``ModelParallelStrategy`` (FSDP2): shard each layer with parameters, then the
        net, over the data-parallel ranks; nothing under other strategies."""
        mesh = self.device_mesh
        if mesh is None:
            return
        from torch.distributed.fsdp import FSDPModule, fully_shard

        if isinstance(self.net, FSDPModule):
            return  # sharded by an earlier fit
        for layer in self.net:
            if any(True for _ in layer.parameters(recurse=False)):
                fully_shard(layer, mesh=mesh["data_parallel"])
        fully_shard(self.net, mesh=mesh["data_parallel"])

    def forward(self, images: torch.Tensor) -> torch.Tensor:
        return self.net(images)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        images, labels = batch
        logits = self(images)
        loss = nn.functional.cross_entropy(logits, labels)
        self.train_acc(logits, labels)
        self.log("train_loss", loss, batch_size=len(labels))
        self.log("train_acc", self.train_acc, on_step=False, on_epoch=True, batch_size=len(labels))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        images, labels = batch
        logits = self(images)
        self.val_acc(logits, labels)
        self.log(
            "val_loss",
            nn.functional.cross_entropy(logits, labels),
            sync_dist=True,
            batch_size=len(labels),
        )
        self.log("val_acc", self.val_acc, batch_size=len(labels))

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def reverse_tensors(
    seed: int = 0, train: int = 8192, val: int = 1024, length: int = 16
) -> tuple[TensorDataset, TensorDataset]:
    """Random sequences of ``length`` digits and the same sequences reversed, as
    ``(train, val)`` TensorDatasets (seeded: the same on every rank)."""
    g = torch.Generator().manual_seed(seed)
    tokens = torch.randint(0, 10, (train + val, length), generator=g)
    targets = tokens.flip(1)
    return TensorDataset(tokens[:train], targets[:train]), TensorDataset(
        tokens[train:], targets[train:]
    )


class ReverseDataModule(pl.LightningDataModule):
    """The sequence-reversal task; ``batch_size`` is the per-rank (uniform) batch."""

    def __init__(self, batch_size: int = 64, seed: int = 0) -> None:
        super().__init__()
        self.batch_size = batch_size
        self.train_set, self.val_set = reverse_tensors(seed)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(self.train_set, batch_size=self.batch_size, shuffle=True)

    def val_dataloader(self) -> DataLoader:
        return DataLoader(self.val_set, batch_size=256)


class ReverseTransformer(pl.LightningModule):
    """A one-layer transformer encoder that reverses a sequence of digits, trained with Adam,
    a linear warm-up then a cosine decay; ``val_acc`` is the per-digit accuracy.

    The schedule follows the fraction of the training epochs done (``warmup`` of them at
    the start), set at every batch start: it is the same function of the data seen in every
    mode, also where ranks make different numbers of steps (dual batch, local SGD, where a
    rank's epoch has no length and ``train_size`` samples shared by the ranks count).
    """

    def __init__(
        self,
        lr: float = 5e-4,
        width: int = 64,
        warmup: float = 50 / 128,
        length: int = 16,
        train_size: int = 8192,
    ) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.embed = nn.Embedding(10, width)
        self.position = nn.Parameter(torch.randn(length, width))  # as large as the tokens'
        self.encoder = nn.TransformerEncoderLayer(
            width, nhead=4, dim_feedforward=2 * width, dropout=0.0, batch_first=True
        )
        self.head = nn.Linear(width, 10)

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        return self.head(self.encoder(self.embed(tokens) + self.position))

    def _loss_acc(self, batch: Any) -> tuple[torch.Tensor, torch.Tensor]:
        tokens, targets = batch
        logits = self(tokens)
        loss = nn.functional.cross_entropy(logits.reshape(-1, 10), targets.reshape(-1))
        return loss, (logits.argmax(-1) == targets).float().mean()

    def on_train_batch_start(self, batch: Any, batch_idx: int) -> None:
        trainer = self.trainer
        steps = trainer.num_training_batches
        if math.isfinite(steps) and steps > 0:
            within = batch_idx / steps
        else:  # claimed batches (local SGD): this rank's samples, as if the ranks kept pace
            seen = batch_idx * len(batch[0]) * trainer.world_size
            within = min(seen / self.hparams.train_size, 1.0)
        done = (trainer.current_epoch + within) / max(trainer.max_epochs or 1, 1)
        warmup = self.hparams.warmup
        if done < warmup:
            factor = done / warmup
        else:
            factor = 0.5 * (1 + math.cos(math.pi * min((done - warmup) / (1 - warmup), 1.0)))
        for group in self.optimizers().optimizer.param_groups:  # type: ignore[union-attr]
            group["lr"] = self.hparams.lr * factor

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        loss, _ = self._loss_acc(batch)
        self.log("train_loss", loss, batch_size=len(batch[0]))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        loss, acc = self._loss_acc(batch)
        size = len(batch[0])
        self.log("val_loss", loss, sync_dist=True, batch_size=size)
        self.log("val_acc", acc, sync_dist=True, batch_size=size)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.Adam(self.parameters(), lr=self.hparams.lr)
