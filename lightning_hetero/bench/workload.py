"""The benchmark and demo workload: a small CNN on scikit-learn's handwritten digits.

``sklearn.datasets.load_digits`` ships inside scikit-learn (1,797 8x8 images, 10
classes), so runs need no network. scikit-learn comes with the ``bench`` extra.
"""

from typing import Any

import lightning.pytorch as pl
import torch
import torchmetrics
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

__all__ = ["DigitsCNN", "DigitsDataModule", "load_digits_tensors"]


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
