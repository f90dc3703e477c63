"""Shared claim counters for local mode: ranks take batches from a common pool.

In ``mode="local"`` ranks do not step in lockstep. Each epoch's permutation is cut
into mega-batches and every rank repeatedly *claims* its next batch from the current
mega-batch until that one is used up, so a fast rank simply takes more batches. The
claims go through atomic counters on a ``torch.distributed.Store`` (the process
group's ``TCPStore``): ``SharedCursor`` is the counter, ``MegaBatchSampler``
the batch sampler built on it.
"""

from collections import deque
from collections.abc import Iterator
from datetime import timedelta
from math import ceil
from typing import NamedTuple

import torch.distributed as dist
from torch.utils.data import Sampler

from lightning_hetero.sampler import EpochPermutation

__all__ = ["BatchTag", "MegaBatchSampler", "SharedCursor"]

DEFAULT_PREFIX = "lightning_hetero/cursor/"


class SharedCursor:
    """Atomic claim counters on a ``torch.distributed.Store``.

    Every counter starts at 0. ``claim`` advances one by the requested size in a
    single ``store.add`` (atomic on the store's server), so any number of processes
    claiming from the same key receive disjoint ranges that together cover
    ``[0, limit)`` exactly once. Keys are namespaced with ``prefix`` so they cannot
    clash with the process group's own keys in the same store.
    """

    def __init__(self, store: dist.Store, prefix: str = DEFAULT_PREFIX) -> None:
        self.store = store
        self.prefix = prefix

    @classmethod
    def connect(
        cls,
        host: str,
        port: int,
        timeout: timedelta = timedelta(minutes=5),
        prefix: str = DEFAULT_PREFIX,
    ) -> "SharedCursor":
        """Connect a client to the ``TCPStore`` served at ``host:port`` (e.g. MASTER_ADDR/PORT)."""
        store = dist.TCPStore(host, port, is_master=False, wait_for_workers=False, timeout=timeout)
        return cls(store, prefix)

    def claim(self, key: str, size: int, limit: int) -> tuple[int, int]:
        """Claim up to ``size`` items of counter ``key``, which runs over ``[0, limit)``.

        Returns ``(start, stop)``: the claimed range, shorter than ``size`` at the end
        of the pool, and ``(limit, limit)`` once the pool is exhausted. Every caller
        must pass the same ``limit`` for a given key.
        """
        if size < 1:
            raise ValueError(f"A claim must ask for at least 1 item, got {size}.")
        if limit < 0:
            raise ValueError(f"The limit of a claim counter must be >= 0, got {limit}.")
        new = int(self.store.add(self.prefix + key, size))
        start = new - size
        if start >= limit:
            return limit, limit
        return start, min(new, limit)


class BatchTag(NamedTuple):
    """What ``MegaBatchSampler`` records for each batch it yields."""

    megabatch: int
    """Index of the mega-batch (within the epoch) the batch was claimed from."""
    size: int
    """Number of samples in the batch (the last claim of a mega-batch can be short, but is
    padded to at least the sampler's ``min_batch_size``)."""


class MegaBatchSampler(Sampler[list[int]]):
    """The batch sampler of local mode: claim batches from shared mega-batches.

    The epoch's permutation of ``N`` samples (the same on every rank) is cut into
    ``ceil(N / megabatch_size)`` consecutive mega-batches, the last one possibly
    smaller. Iterating claims ``batch_size`` positions at a time from mega-batch 0
    until it is exhausted, then moves on to mega-batch 1, and so on; a claim never
    crosses a mega-batch boundary, so the last batch of a mega-batch may be short.
    Counters are keyed by ``run_id``, epoch and mega-batch, so every rank with the
    same ``run_id`` shares them and each sample is used once per epoch across ranks.

    For every yielded batch a ``BatchTag`` is appended to ``tags``; the
    training loop pops one per trained batch, in order, to learn which mega-batch
    the batch came from (the loader may have claimed further batches ahead of
    training, e.g. with ``num_workers > 0``). ``claimed`` and
    ``claimed_batches`` count this epoch's claims.

    A short last claim of a mega-batch is padded with the epoch's first samples up to
    ``min_batch_size`` (a BatchNorm layer cannot train on a batch of one).

    Lightning calls ``set_epoch`` on ``loader.batch_sampler.sampler``, hence the
    permutation is kept as ``sampler``. One pass per epoch is assumed: iterating
    the same epoch again finds its mega-batches already claimed and yields nothing.
    """

    def __init__(
        self,
        sampler: EpochPermutation,
        cursor: SharedCursor,
        batch_size: int,
        megabatch_size: int,
        run_id: str,
        min_batch_size: int = 1,
    ) -> None:
        if megabatch_size < 1:
            raise ValueError(f"megabatch_size must be >= 1, got {megabatch_size}.")
        if not 1 <= min_batch_size <= megabatch_size:
            raise ValueError(
                f"min_batch_size must be in [1, megabatch_size={megabatch_size}], got"
                f" {min_batch_size}."
            )
        self.min_batch_size = min_batch_size
        self.sampler = sampler
        self.cursor = cursor
        self.megabatch_size = megabatch_size
        self.run_id = run_id
        self._batch_size = 1
        self.batch_size = batch_size
        self.tags: deque[BatchTag] = deque()
        self.claimed = 0
        self.claimed_batches = 0

    @property
    def batch_size(self) -> int:
        """Samples asked for by the next claim; a change applies from the next claim on."""
        return self._batch_size

    @batch_size.setter
    def batch_size(self, value: int) -> None:
        if isinstance(value, bool) or int(value) != value or value < 1:
            raise ValueError(f"The batch size must be an int >= 1, got {value!r}.")
        self._batch_size = int(value)

    def set_batch_size(self, batch_size: int) -> None:
        """Claim ``batch_size`` samples at a time from the next claim on."""
        self.batch_size = batch_size

    @property
    def num_megabatches(self) -> int:
        """Mega-batches per epoch for the current dataset size."""
        return ceil(len(self.sampler) / self.megabatch_size)

    def megabatch_of(self, position: int) -> int:
        """The mega-batch that holds position ``position`` of the epoch's permutation."""
        if not 0 <= position < len(self.sampler):
            raise IndexError(f"Position {position} is outside the epoch of {len(self.sampler)}.")
        return position // self.megabatch_size

    def megabatch_bounds(self, megabatch: int) -> tuple[int, int]:
        """``(start, stop)`` positions of mega-batch ``megabatch`` in the epoch's permutation."""
        if not 0 <= megabatch < self.num_megabatches:
            raise IndexError(
                f"Mega-batch {megabatch} is outside the {self.num_megabatches} of the epoch."
            )
        start = megabatch * self.megabatch_size
        return start, min(start + self.megabatch_size, len(self.sampler))

    def key(self, megabatch: int, epoch: int | None = None) -> str:
        """The counter key of ``megabatch`` in ``epoch`` (default: the current epoch)."""
        epoch = self.sampler.epoch if epoch is None else epoch
        return f"{self.run_id}/e{epoch}/m{megabatch}"

    def __iter__(self) -> Iterator[list[int]]:
        epoch = self.sampler.epoch
        positions = self.sampler.permutation()
        self.tags.clear()  # tags of batches a previous pass drew but never trained
        self.claimed = 0
        self.claimed_batches = 0
        for megabatch in range(self.num_megabatches):
            base, end = self.megabatch_bounds(megabatch)
            key = self.key(megabatch, epoch)
            while True:
                start, stop = self.cursor.claim(key, self.batch_size, end - base)
                if start >= stop:
                    break
                self.claimed += stop - start
                self.claimed_batches += 1
                batch = positions[base + start : base + stop]
                padding = self.min_batch_size - len(batch)
                if padding > 0:  # from the epoch's start: a last mega-batch may be smaller
                    batch += positions[:padding]
                self.tags.append(BatchTag(megabatch, len(batch)))
                yield batch

    def __len__(self) -> int:
        """Always raises ``TypeError``: the number of batches is not known in advance.

        How many batches this rank gets depends on how fast the other ranks claim.
        ``TypeError`` is what Lightning (and ``DataLoader``) read as "no length", so
        the loader is treated as one of unknown length and the epoch ends when the
        iterator does.
        """
        raise TypeError(
            "MegaBatchSampler has no length: each rank's number of batches depends on how"
            " fast the ranks claim them."
        )
