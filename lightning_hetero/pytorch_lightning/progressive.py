# Generated from lightning_hetero/progressive.py by `make generate`; do not edit.  # ruff: noqa
# fmt: off
"""Cyclic progressive learning (paper 003): resolution, dropout and learning rate by epoch.

Training is split into stages, each with one learning rate; every stage cycles through
sub-stages that train at a given input resolution and dropout rate, low resolution first.
Smaller images cost less memory and time per sample, so with
[`HeteroStrategy`][lightning_hetero.HeteroStrategy] the batch grows as the resolution falls.
"""

import copy
import math
from collections.abc import Mapping, MutableMapping, Sequence
from dataclasses import dataclass, field
from typing import Any

import pytorch_lightning as pl
import torch
from pytorch_lightning.callbacks import Callback
from pytorch_lightning.utilities.model_helpers import is_overridden
from pytorch_lightning.utilities.parsing import (
    lightning_getattr,
    lightning_hasattr,
    lightning_setattr,
)
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch.nn.modules.dropout import _DropoutNd
from typing_extensions import override

from lightning_hetero.pytorch_lightning._lightning import request_train_reload
from lightning_hetero.planning.split import is_count

__all__ = ["ProgressiveSchedule", "Stage", "SubStage"]


def _size(resolution: int | Sequence[int]) -> tuple[int, int]:
    size = (resolution, resolution) if isinstance(resolution, int) else tuple(resolution)
    if len(size) != 2 or not all(is_count(s) for s in size):
        raise ValueError(
            f"A resolution is a positive integer or (height, width), got {resolution!r}."
        )
    return (int(size[0]), int(size[1]))


@dataclass
class SubStage:
    """Epochs that train at one input resolution.

    Args:
        epochs: how many epochs, >= 1.
        resolution: image size, ``r`` (square) or ``(height, width)``.
        dropout: ``p`` of every dropout module; ``None`` leaves it.
        batch_size: the global batch size (``HeteroStrategy``; the large batch ``B_L``
            with ``controller="dual"``) or the loader's ``batch_size`` (other strategies);
            ``None``: derived from the resolution with ``HeteroStrategy``, unchanged otherwise.
    """

    epochs: int
    resolution: int | tuple[int, int]
    dropout: float | None = None
    batch_size: int | None = None

    def __post_init__(self) -> None:
        if not is_count(self.epochs):
            raise ValueError(f"A sub-stage needs `epochs` >= 1, got {self.epochs!r}.")
        self.resolution = _size(self.resolution)
        if self.dropout is not None and not 0.0 <= self.dropout < 1.0:
            raise ValueError(f"`dropout` must be in [0, 1), got {self.dropout}.")
        if self.batch_size is not None and not is_count(self.batch_size):
            raise ValueError(f"`batch_size` must be an integer >= 1, got {self.batch_size!r}.")


@dataclass
class Stage:
    """A run of sub-stages at one learning rate (``None`` leaves the optimizer's).

    ``lr`` is set on every parameter group of every optimizer; use ``None`` and an LR
    scheduler where groups need rates of their own.
    """

    lr: float | None
    substages: list[SubStage] = field(default_factory=list)

    def __post_init__(self) -> None:
        if self.lr is not None and not (math.isfinite(self.lr) and self.lr > 0):
            raise ValueError(f"A stage's `lr` must be > 0, got {self.lr}.")
        self.substages = [
            SubStage(**sub) if isinstance(sub, Mapping) else sub for sub in self.substages
        ]
        if not self.substages:
            raise ValueError("A stage needs at least one sub-stage.")


@dataclass(frozen=True)
class _Phase:
    stage: int
    substage: int
    first_epoch: int
    lr: float | None
    sub: SubStage


class ProgressiveSchedule(Callback):
    """Change input resolution, dropout and learning rate by epoch (paper 003).

    Args:
        stages: the schedule, in order; epochs after the last sub-stage keep it. Dicts work
            too (``{"lr": 0.1, "substages": [{"epochs": 2, "resolution": 24}]}``), as do
            ``class_path``/``init_args`` YAML configs.
        input_key: where the images are in a batch: an index (tuple/list batches) or a key
            (dict batches). Images are ``N x C x H x W`` floating tensors.
        mode: ``torch.nn.functional.interpolate`` mode for resizing.
        reference_resolution: the resolution the training loader's batch size (and
            ``HeteroStrategy``'s plan and memory bounds) are meant for; default: the
            largest resolution in the schedule.

    Training batches are resized on the device after transfer (the dataset is untouched);
    validation, test and prediction batches keep their size. At each epoch start every
    dropout module gets the sub-stage's ``p`` and every optimizer's parameter groups the
    stage's learning rate (overriding LR schedulers for that epoch). The batch size changes
    from the first epoch of a sub-stage: with ``HeteroStrategy`` through
    ``set_input_scale`` (by default the global batch
    follows the pixel count, capped by measured memory); with other strategies only an
    explicit ``batch_size`` applies, set as ``batch_size`` on the module, its hparams or
    the datamodule (as Lightning's batch size finder does) and the loader rebuilt; a
    sub-stage without one goes back to that attribute's value at the start of ``fit``,
    which is restored when ``fit`` ends.

    Example:
        >>> schedule = ProgressiveSchedule([
        ...     Stage(0.1, [SubStage(2, 24, 0.1), SubStage(2, 32, 0.2)]),
        ...     Stage(0.01, [SubStage(1, 24, 0.1), SubStage(1, 32, 0.2)]),
        ... ])
        >>> [schedule.resolution(e) for e in range(7)]
        [(24, 24), (24, 24), (32, 32), (32, 32), (24, 24), (32, 32), (32, 32)]
        >>> schedule.lr(4), schedule.dropout(3), round(schedule.scale(0), 4)
        (0.01, 0.2, 0.5625)
    """

    def __init__(
        self,
        stages: list[Stage],
        input_key: int | str = 0,
        mode: str = "bilinear",
        reference_resolution: int | tuple[int, int] | None = None,
    ) -> None:
        stages = [Stage(**s) if isinstance(s, Mapping) else s for s in stages]
        if not stages:
            raise ValueError("ProgressiveSchedule needs at least one stage.")
        self.stages = stages
        self.input_key = input_key
        self.mode = mode
        self._phases: list[_Phase] = []
        epoch = 0
        for i, stage in enumerate(stages):
            for j, sub in enumerate(stage.substages):
                self._phases.append(_Phase(i, j, epoch, stage.lr, sub))
                epoch += sub.epochs
        self.epochs = epoch
        sizes = [phase.sub.resolution for phase in self._phases]
        self.reference_resolution = (
            _size(reference_resolution)
            if reference_resolution is not None
            else max(sizes, key=lambda s: s[0] * s[1])
        )
        self._applied: tuple[float, int | None] | None = None  # batch change in force
        self._own_batch_size: int | None = None  # the module's, before any sub-stage's
        self._active = False  # inside a training epoch: resize the batches
        self._owner: Any = None  # the object whose on_after_batch_transfer is wrapped
        self._warned_schedulers = False

    # ---------------------------------------------------------------- the schedule
    def _phase(self, epoch: int) -> _Phase:
        if epoch < 0:
            raise ValueError(f"epoch must be >= 0, got {epoch}.")
        current = self._phases[0]
        for phase in self._phases:
            if phase.first_epoch <= epoch:
                current = phase
        return current

    def at(self, epoch: int) -> tuple[int, int]:
        """``(stage, sub-stage)`` indices in force at ``epoch``."""
        phase = self._phase(epoch)
        return phase.stage, phase.substage

    def resolution(self, epoch: int) -> tuple[int, int]:
        return self._phase(epoch).sub.resolution  # type: ignore[return-value]

    def dropout(self, epoch: int) -> float | None:
        return self._phase(epoch).sub.dropout

    def lr(self, epoch: int) -> float | None:
        return self._phase(epoch).lr

    def batch_size(self, epoch: int) -> int | None:
        """The sub-stage's explicit batch size (``None``: derived or unchanged)."""
        return self._phase(epoch).sub.batch_size

    def scale(self, epoch: int) -> float:
        """Pixels per image at ``epoch`` relative to the reference resolution."""
        h, w = self.resolution(epoch)
        ref_h, ref_w = self.reference_resolution
        return (h * w) / (ref_h * ref_w)

    # ---------------------------------------------------------------- hooks
    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if stage != "fit" or self._owner is not None:
            return
        # Wrap the hook Lightning will call: the datamodule's if it overrides it, else the
        # module's; with a datamodule and no override, the datamodule's (wrapping the
        # module's would make Lightning warn that it overrides the hook).
        hook, datamodule = "on_after_batch_transfer", trainer.datamodule
        owner: Any = pl_module
        if datamodule is not None and (
            is_overridden(hook, datamodule) or not is_overridden(hook, pl_module)
        ):
            owner = datamodule
        original = owner.on_after_batch_transfer

        def on_after_batch_transfer(batch: Any, dataloader_idx: int) -> Any:
            batch = original(batch, dataloader_idx)
            return self._resize(batch, trainer) if self._active and trainer.training else batch

        owner.on_after_batch_transfer = on_after_batch_transfer
        self._owner = owner
        if (
            not _plans_batches(trainer.strategy)
            and any(p.sub.batch_size is not None for p in self._phases)
            and not lightning_hasattr(pl_module, "batch_size")
        ):
            raise AttributeError(
                "ProgressiveSchedule: sub-stages set `batch_size`, which without"
                " HeteroStrategy needs a `batch_size` attribute on the LightningModule,"
                " its hparams or the datamodule (the training loader must read it)."
            )

    @override
    def teardown(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        if self._owner is not None:
            vars(self._owner).pop("on_after_batch_transfer", None)
            self._owner = None
        if self._own_batch_size is not None:  # leave the module as it was given
            lightning_setattr(pl_module, "batch_size", self._own_batch_size)
            self._own_batch_size = None
        self._applied = None

    @override
    def on_fit_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._apply_batch(trainer, pl_module, 0)  # before the first loader is built

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        # a resumed run starts later than epoch 0: its loader is rebuilt if that matters
        self._apply_batch(trainer, pl_module, trainer.current_epoch)

    @override
    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        epoch = trainer.current_epoch
        phase = self._phase(epoch)
        if phase.sub.dropout is not None:
            for module in pl_module.modules():
                if isinstance(module, _DropoutNd):
                    module.p = phase.sub.dropout
        if phase.lr is not None:
            if trainer.lr_scheduler_configs and not self._warned_schedulers:
                self._warned_schedulers = True
                rank_zero_warn(
                    "ProgressiveSchedule sets each stage's learning rate at every epoch start;"
                    " an LR scheduler's changes last until the next epoch start."
                )
            for optimizer in trainer.optimizers:
                for group in optimizer.param_groups:
                    group["lr"] = phase.lr
        self._active = True
        self._log(trainer, phase)

    @override
    def on_train_epoch_end(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._active = False
        self._apply_batch(trainer, pl_module, trainer.current_epoch + 1)

    # ---------------------------------------------------------------- helpers
    def _apply_batch(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", epoch: int
    ) -> None:
        """Make the loader of ``epoch`` use that sub-stage's batch size."""
        phase = self._phase(epoch)
        wanted = (self.scale(epoch), phase.sub.batch_size)
        if wanted == self._applied:
            return
        first = self._applied is None
        self._applied = wanted
        strategy = trainer.strategy
        if _plans_batches(strategy):
            strategy.set_input_scale(*wanted)  # rebuilds the loader when needed
            return
        if first and lightning_hasattr(pl_module, "batch_size"):
            self._own_batch_size = lightning_getattr(pl_module, "batch_size")
        # a sub-stage without a batch size goes back to the loader's own
        size = phase.sub.batch_size if phase.sub.batch_size is not None else self._own_batch_size
        if size is not None and size != lightning_getattr(pl_module, "batch_size"):
            lightning_setattr(pl_module, "batch_size", size)
            if not first:
                request_train_reload(trainer)

    def _resize(self, batch: Any, trainer: "pl.Trainer") -> Any:
        size = self.resolution(trainer.current_epoch)
        key = self.input_key
        try:
            images = batch[key]
        except (KeyError, IndexError, TypeError):
            raise TypeError(
                f"ProgressiveSchedule(input_key={key!r}) found no images at that key of the"
                f" training batch ({type(batch).__name__})."
            ) from None
        if not (
            isinstance(images, torch.Tensor) and images.dim() == 4 and images.is_floating_point()
        ):
            raise TypeError(
                "ProgressiveSchedule resizes N x C x H x W floating-point image tensors; the"
                f" batch holds {type(images).__name__}"
                + (
                    f" of shape {tuple(images.shape)}, {images.dtype}"
                    if isinstance(images, torch.Tensor)
                    else ""
                )
                + f" at input_key={key!r}."
            )
        if tuple(images.shape[-2:]) == size:
            return batch
        align = False if self.mode in ("linear", "bilinear", "bicubic", "trilinear") else None
        resized = torch.nn.functional.interpolate(
            images, size=size, mode=self.mode, align_corners=align
        )
        if isinstance(batch, MutableMapping):
            batch = copy.copy(batch)  # keeps the mapping's own type (OrderedDict, ...)
            batch[key] = resized
            return batch
        if isinstance(batch, Mapping):
            return {**batch, key: resized}
        items = list(batch)
        items[key] = resized  # type: ignore[index]
        if hasattr(batch, "_fields"):  # a namedtuple takes its fields one by one
            return type(batch)(*items)
        return type(batch)(items) if isinstance(batch, tuple) else items

    def _log(self, trainer: "pl.Trainer", phase: _Phase) -> None:
        h, w = phase.sub.resolution  # type: ignore[misc]
        metrics = {"progressive/resolution": float(h * w) ** 0.5}
        if phase.sub.dropout is not None:
            metrics["progressive/dropout"] = phase.sub.dropout
        if phase.lr is not None:
            metrics["progressive/lr"] = phase.lr
        strategy = trainer.strategy
        if _plans_batches(strategy) and strategy.limits is not None:
            metrics["progressive/batch_size"] = float(strategy.limits.global_batch_size)
        for logger in trainer.loggers:
            logger.log_metrics(metrics=metrics, step=trainer.global_step)


def _plans_batches(strategy: Any) -> bool:
    """Whether ``strategy`` plans the batch itself (it takes ``set_input_scale``, as
    [`HeteroStrategy`][lightning_hetero.HeteroStrategy] does)."""
    return callable(getattr(strategy, "set_input_scale", None))
