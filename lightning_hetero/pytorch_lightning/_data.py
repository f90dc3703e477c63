# Generated from lightning_hetero/_data.py by `make generate`; do not edit.  # ruff: noqa
# fmt: off
"""The training data: what one shared permutation can serve, and each rank's loader of it.

Each refusal names the user's object and what to do instead.
"""

import os
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

from pytorch_lightning.utilities import CombinedLoader
from pytorch_lightning.utilities.rank_zero import rank_zero_warn
from torch.utils.data import (
    BatchSampler,
    DataLoader,
    IterableDataset,
    RandomSampler,
    Sampler,
    SequentialSampler,
    WeightedRandomSampler,
)
from torch.utils.data.distributed import DistributedSampler

from lightning_hetero.pytorch_lightning._lightning import step_checkpoints
from lightning_hetero.sampler import EpochPermutation, GlobalBatchSampler
from lightning_hetero.streaming import ChunkedDataset, reads_by_index

if TYPE_CHECKING:
    import pytorch_lightning as pl

__all__ = [
    "check_training_loader",
    "refuse_several_training_loaders",
    "refuse_step_counting",
    "refuse_unequal_steps",
    "with_batch_sampler",
]


def check_training_loader(loader: object) -> int:
    """Refuse what one shared permutation cannot serve; returns the shuffling seed."""
    if not isinstance(loader, DataLoader):
        raise TypeError(
            "HeteroStrategy needs the training data as a torch DataLoader over a map-style"
            f" dataset, got {type(loader).__name__}."
        )
    dataset = loader.dataset
    if isinstance(dataset, IterableDataset):
        raise TypeError(_iterable_refusal(dataset))
    if type(loader.batch_sampler) is not BatchSampler:
        raise TypeError(
            "HeteroStrategy builds each rank's batches itself and cannot use the training"
            f" DataLoader's batch_sampler {type(loader.batch_sampler).__name__}; pass"
            " `batch_size` (and `drop_last`) to the DataLoader instead, or train with"
            " strategy='ddp' to keep it."
        )
    sampler = loader.sampler
    # Lightning wraps a custom sampler in a DistributedSamplerWrapper: name the user's own
    user_sampler = getattr(getattr(sampler, "dataset", None), "_sampler", sampler)
    if type(sampler) is DistributedSampler:
        return sampler.seed
    if type(user_sampler) in (RandomSampler, SequentialSampler):
        return int(os.environ.get("PL_GLOBAL_SEED", 0))
    name = type(user_sampler).__name__
    advice = (
        " To keep class balancing, weight the loss per class instead (e.g."
        " `CrossEntropyLoss(weight=...)`) or oversample in the dataset (a map-style Dataset"
        " that lists rare samples more than once)."
        if isinstance(user_sampler, WeightedRandomSampler)
        else " To keep its order, build it into the dataset (a map-style Dataset that"
        " indexes samples in that order) and pass HeteroStrategy(shuffle=False)."
    )
    raise TypeError(
        f"HeteroStrategy cannot keep the training DataLoader's sampler {name}: it draws each"
        " sample exactly once per epoch from one permutation shared by all ranks, sliced by"
        f" rank speed.{advice} Or train with strategy='ddp' to keep {name}."
    )


def _iterable_refusal(dataset: IterableDataset) -> str:
    """Why an IterableDataset cannot be split, and the two ways out."""
    name = type(dataset).__name__
    indexable = reads_by_index(dataset)
    first = (
        f" {name} also reads samples by index: wrap it in the map-style view"
        f" `DataLoader(lightning_hetero.streaming.StreamingView({name}(...)), batch_size=...)`"
        " and the strategy's sampler drives it, chunk-aware (docs/streaming.md)."
        if indexable
        else " If it can read a sample by its index, wrap it in the map-style view"
        " `lightning_hetero.streaming.StreamingView(dataset, chunk_sizes=...)`."
    )
    return (
        f"HeteroStrategy cannot split the training {name}: it is an IterableDataset, which"
        " hands each rank an equal share itself, and HeteroStrategy slices one permutation of"
        f" sample indices per epoch by rank speed.{first} Or opt in to stream slicing,"
        " `lightning_hetero.streaming.StreamSlice(dataset, num_samples=...)`, where every"
        " rank reads the whole stream and keeps its share (each rank pays the reading of all"
        " of it). Or train it with strategy='ddp'."
    )


class _ResumableLoader(DataLoader):
    """A training loader driven by a ``GlobalBatchSampler``,
    which Lightning checkpoints inside an epoch (``state_dict``) and resumes where it stopped:
    every sample is trained once per epoch across a mid-epoch checkpoint.

    Lightning's training loop fetches no batch ahead of a loader with a length, so the
    batches yielded are the batches trained.
    """

    def __iter__(self) -> Iterator[Any]:
        self._yielded = 0
        for batch in super().__iter__():
            self._yielded += 1
            yield batch

    def state_dict(self) -> dict[str, Any]:
        sampler = self.batch_sampler
        assert isinstance(sampler, GlobalBatchSampler)
        return sampler.state_dict(sampler.first_step + getattr(self, "_yielded", 0))

    def load_state_dict(self, state_dict: dict[str, Any]) -> None:
        sampler = self.batch_sampler
        assert isinstance(sampler, GlobalBatchSampler)
        sampler.load_state_dict(state_dict)


def epoch_order(dataset: Any, shuffle: bool, seed: int, global_batch_size: int) -> EpochPermutation:
    """The order of ``dataset``'s samples in each epoch, the same on every rank: one
    permutation of all indices, or, for a
    [`ChunkedDataset`][lightning_hetero.streaming.ChunkedDataset],
    its chunk-aware permutation (each global batch of ``global_batch_size`` ordered by
    chunk)."""
    epochs = EpochPermutation(len(dataset), shuffle=shuffle, seed=seed)
    if isinstance(dataset, ChunkedDataset):
        return dataset.epoch_order(epochs, global_batch_size)
    return epochs


def with_batch_sampler(loader: DataLoader, batch_sampler: Sampler[Any]) -> DataLoader:
    """A plain DataLoader like ``loader`` that draws its batches from ``batch_sampler``.

    With a ``GlobalBatchSampler`` (map-style datasets, the
    streaming views), the loader also resumes inside an epoch from a checkpoint.
    """
    if type(loader) is not DataLoader:
        kind = type(loader)  # by its qualified name: PyG's, say, is also called DataLoader
        rank_zero_warn(
            f"hetero: HeteroStrategy replaces the training {kind.__module__}.{kind.__qualname__}"
            " by a plain torch.utils.data.DataLoader with the same dataset and options (its"
            " collate_fn included)."
        )
    kind = _ResumableLoader if isinstance(batch_sampler, GlobalBatchSampler) else DataLoader
    return kind(
        loader.dataset,
        batch_sampler=batch_sampler,
        num_workers=loader.num_workers,
        collate_fn=loader.collate_fn,
        pin_memory=loader.pin_memory,
        timeout=loader.timeout,
        worker_init_fn=loader.worker_init_fn,
        multiprocessing_context=loader.multiprocessing_context,
        generator=loader.generator,
        prefetch_factor=loader.prefetch_factor,
        persistent_workers=loader.persistent_workers,
        pin_memory_device=loader.pin_memory_device,
    )


def refuse_several_training_loaders(trainer: "pl.Trainer") -> None:
    """Refuse a run with more than one training loader (their shares would be wrong)."""
    loaders = CombinedLoader(trainer.train_dataloader).flattened
    if len(loaders) > 1:
        raise TypeError(
            f"HeteroStrategy found {len(loaders)} training DataLoaders"
            f" ({type(trainer.train_dataloader).__name__} of"
            f" {', '.join(type(dl.dataset).__name__ for dl in loaders)}); it sizes one"
            " loader's batches by rank speed and weights gradients by that loader's shares,"
            " which several loaders of their own sizes would get wrong. Return one DataLoader"
            " from `train_dataloader` (e.g. a ConcatDataset or a Dataset that yields the"
            " parts of a sample together), or train with strategy='ddp'."
        )


def refuse_unequal_steps(lengths: list[int]) -> None:
    """Refuse ranks that would run different numbers of steps where they must step together."""
    if len(set(lengths)) != 1:
        raise RuntimeError(
            f"Ranks disagree on the number of training steps per epoch ({lengths}); every rank"
            " must load the same training set."
        )


def refuse_step_counting(trainer: "pl.Trainer", what: str) -> None:
    """Refuse Trainer options counted in steps when ranks make different numbers of steps.

    Anything counted in steps would stop or validate ranks at different points and leave the
    others waiting. ``what`` names the option that makes the steps uneven.
    """
    problems = []
    if trainer.max_steps != -1:
        problems.append(f"max_steps={trainer.max_steps}")
    if trainer.limit_train_batches not in (1.0, None):
        problems.append(f"limit_train_batches={trainer.limit_train_batches}")
    if trainer.val_check_interval != 1.0:
        problems.append(f"val_check_interval={trainer.val_check_interval}")
    # a checkpoint on steps or on time agrees across ranks at every step (a broadcast), or
    # saves (collectives) at a step number each rank reaches at another time
    problems.extend(step_checkpoints(trainer))
    if problems:
        raise ValueError(
            f"{what} gives ranks different numbers of steps per epoch, so training is"
            f" counted in epochs only; remove {', '.join(problems)} from the Trainer (a"
            " ModelCheckpoint can save on epochs or on validation instead)."
        )
