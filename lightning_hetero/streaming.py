"""Streaming datasets under HeteroStrategy: map-style views its global-batch sampler drives.

LitData's ``StreamingDataset``, MosaicML's ``StreamingDataset`` and WebDataset's ``wids``
split the data between ranks themselves, in equal shares. All three also read a sample by
its index, and that is all the strategy's sampler needs: wrap the dataset in
[`StreamingView`][lightning_hetero.streaming.StreamingView] and every rank reads exactly its ``b_k``
samples of each global
batch, the plan may change at any step, and every sample is read once per epoch.
Shuffling is chunk-aware (``ChunkedPermutation``): the
chunks are shuffled, and samples are shuffled only within a window of chunks, so each rank
reads a chunk in one stretch of the epoch instead of over and over.

A stream with no random access can opt in to
[`StreamSlice`][lightning_hetero.streaming.StreamSlice]: every rank reads the
whole stream and keeps its share, which costs every rank the reading of all of it.

Both views are plain map-style datasets (no Lightning here); use them as:

    loader = DataLoader(StreamingView(litdata.StreamingDataset("s3://...")), batch_size=32)
    trainer = Trainer(strategy=HeteroStrategy(), ...)
"""

import itertools
import os
from collections.abc import Callable, Iterable, Iterator, Sequence
from typing import Any

from torch.utils.data import Dataset

from lightning_hetero.sampler import ChunkedPermutation, EpochPermutation

__all__ = [
    "ChunkedDataset",
    "StreamSlice",
    "StreamingView",
    "chunk_sizes_of",
    "reads_by_index",
    "set_rank_variables",
    "unset_rank_variables",
]


def set_rank_variables(
    rank: int, world_size: int, local_rank: int, local_world_size: int
) -> dict[str, str]:
    """Set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK`` and ``LOCAL_WORLD_SIZE`` in this process's
    environment where the launcher left them unset, as ``torchrun`` sets them; returns those
    it set.

    MosaicML's ``StreamingDataset`` reads all four when it is built and defaults a missing
    one to a single process: Lightning's own launcher sets ``WORLD_SIZE`` and
    ``LOCAL_RANK`` but neither ``RANK`` nor ``LOCAL_WORLD_SIZE``, so every rank took itself
    for rank 0 of one process per node, and ranks on one node failed on each other's
    shared memory (``FileExistsError: '/000000_locals'``). The strategies call this when
    they set up a run of several processes, before the training data is loaded; a
    variable already set (torchrun, Ray Train, your own) is kept.
    """
    wanted = {
        "RANK": rank,
        "WORLD_SIZE": world_size,
        "LOCAL_RANK": local_rank,
        "LOCAL_WORLD_SIZE": local_world_size,
    }
    missing = {name: str(value) for name, value in wanted.items() if name not in os.environ}
    os.environ.update(missing)
    return missing


def unset_rank_variables(added: dict[str, str]) -> None:
    """Remove what ``set_rank_variables`` returned (``added``) from the environment again,
    where a variable still holds the value it set (the strategies' teardown)."""
    for name, value in added.items():
        if os.environ.get(name) == value:
            del os.environ[name]


def chunk_sizes_of(dataset: object) -> list[int] | None:
    """The samples per chunk of a LitData or MosaicML streaming dataset, in index order.

    ``None`` when ``dataset`` is neither (pass ``chunk_sizes`` yourself then).

    Example:
        >>> class Shards:
        ...     samples_per_shard = [4, 4, 2]
        >>> chunk_sizes_of(Shards()), chunk_sizes_of([1, 2, 3])
        ([4, 4, 2], None)
    """
    region = getattr(dataset, "region_of_interest", None)  # LitData: (start, end) per chunk
    if region is not None and hasattr(dataset, "subsampled_files"):
        return [int(end) - int(start) for start, end in region]
    shards = getattr(dataset, "samples_per_shard", None)  # MosaicML streaming
    if shards is not None:
        return [int(n) for n in shards]
    return None


def reads_by_index(dataset: object) -> bool:
    """Whether ``dataset`` reads a sample by its index: MosaicML's ``get_item``, or a
    ``__getitem__`` of its own (an ``IterableDataset`` inherits one that only raises)."""
    getitem = getattr(type(dataset), "__getitem__", Dataset.__getitem__)
    return callable(getattr(dataset, "get_item", None)) or getitem is not Dataset.__getitem__


def _reader_of(dataset: object) -> Callable[[int], Any]:
    """How to read sample ``i`` of ``dataset``: MosaicML's ``get_item``, else indexing."""
    get_item = getattr(dataset, "get_item", None)
    if callable(get_item):
        return get_item
    if not reads_by_index(dataset):
        raise TypeError(
            f"{type(dataset).__name__} reads no sample by its index (no `__getitem__` or"
            " `get_item`), so StreamingView cannot drive it; wrap it in"
            " `StreamSlice(dataset, num_samples=...)` instead (every rank reads the whole"
            " stream), or train it with strategy='ddp'."
        )
    return dataset.__getitem__  # type: ignore[attr-defined]


class ChunkedDataset(Dataset):
    """A map-style dataset stored in chunks: it tells the strategy how to order an epoch.

    The strategy asks ``epoch_order`` for the epoch's permutation in place of a
    sample-level shuffle. ``window``: chunks whose samples are shuffled together;
    ``group_by_chunk``: order each global batch by chunk, so that a rank's slice reads
    fewer chunks (its samples then come from fewer chunks at each step).
    """

    def __init__(
        self,
        chunk_sizes: Sequence[int],
        window: int,
        group_by_chunk: bool = True,
        shuffle_chunks: bool = True,
    ) -> None:
        self.chunk_sizes = [int(n) for n in chunk_sizes]
        self.window = int(window)
        self.group_by_chunk = group_by_chunk
        self.shuffle_chunks = shuffle_chunks
        if self.window < 1:
            raise ValueError(f"`window` must be >= 1 chunk, got {window}.")

    def __len__(self) -> int:
        return sum(self.chunk_sizes)

    def epoch_order(
        self, epochs: EpochPermutation, global_batch_size: int | None = None
    ) -> ChunkedPermutation:
        """The chunk-aware permutation that replaces ``epochs`` (same seed, shuffle, epoch)."""
        if epochs.num_samples != len(self):
            raise ValueError(
                f"The training sampler covers {epochs.num_samples} samples, but"
                f" {type(self).__name__} holds {len(self)}."
            )
        order = ChunkedPermutation(
            self.chunk_sizes,
            shuffle=epochs.shuffle,
            seed=epochs.seed,
            window=self.window,
            group=global_batch_size if self.group_by_chunk else None,
            shuffle_chunks=self.shuffle_chunks,
        )
        order.set_epoch(epochs.epoch)
        return order


class StreamingView(ChunkedDataset):
    """A map-style view of a streaming dataset that reads samples by index.

    ``dataset``: LitData's ``StreamingDataset`` (read with ``dataset[i]``), MosaicML's
    ``StreamingDataset`` (``dataset.get_item(i)``) or any object with ``__len__`` and
    ``__getitem__`` (a ``wids.ShardListDataset``, say), whose samples are stored in chunks
    of ``chunk_sizes`` consecutive indices (found by itself for LitData and MosaicML; a
    dataset without chunks can pass ``[1] * len(dataset)`` for a sample-level shuffle).
    Its own split between ranks is bypassed: the strategy's sampler decides which rank
    reads what (LitData's ``distributed_env`` and shuffle options play no part).

    ``window``: chunks whose samples are shuffled together; a rank's cache should hold
    that many chunks (LitData's ``max_cache_size``), or a chunk is fetched again within
    its window.

    Example:
        >>> view = StreamingView(list(range(10)), chunk_sizes=[4, 4, 2], window=2)
        >>> len(view), view[7]
        (10, 7)
    """

    def __init__(
        self,
        dataset: object,
        chunk_sizes: Sequence[int] | None = None,
        window: int = 8,
        group_by_chunk: bool = True,
    ) -> None:
        sizes = chunk_sizes if chunk_sizes is not None else chunk_sizes_of(dataset)
        if sizes is None:
            raise TypeError(
                f"StreamingView cannot tell how {type(dataset).__name__} stores its samples:"
                " pass `chunk_sizes` (samples per chunk or shard, in index order), or"
                f" `chunk_sizes=[1] * len(dataset)` to shuffle sample by sample."
            )
        self.read = _reader_of(dataset)
        super().__init__(sizes, window, group_by_chunk)
        length = None if chunk_sizes is None else _length(dataset)
        if length is not None and length != len(self):
            raise ValueError(
                f"{type(dataset).__name__} holds {length} samples, but `chunk_sizes` add up"
                f" to {len(self)}."
            )
        self.dataset = dataset

    def __getitem__(self, index: int) -> Any:
        return self.read(index)


def _length(dataset: object) -> int | None:
    try:
        return len(dataset)  # type: ignore[arg-type]
    except TypeError:
        return None


class StreamSlice(ChunkedDataset):
    """Opt-in stream slicing: a map-style view of a stream without random access.

    Every rank (and every DataLoader worker) iterates the whole of ``stream`` and keeps the
    samples its batches ask for: it reads, decodes and drops ``K - 1`` of every ``K``
    samples it passes, so each rank reads the full dataset every epoch. Use it when the
    stream is cheap to read compared to a training step, or has no other way in.

    ``stream`` must yield the same ``num_samples`` samples (default ``len(stream)``) in the
    same order on every rank and in every worker: give the unsplit stream (no split by node
    or worker). Shuffling stays inside a window of ``window`` consecutive samples, which
    each process holds in memory; with ``HeteroStrategy(shuffle=False)`` the stream's own
    order is kept.

    Example:
        >>> view = StreamSlice(range(100), window=10)
        >>> [view[i] for i in (3, 42, 97)]
        [3, 42, 97]
    """

    def __init__(self, stream: Iterable[Any], num_samples: int | None = None, window: int = 256):
        length = num_samples if num_samples is not None else _length(stream)
        if length is None or length < 1:
            raise TypeError(
                f"StreamSlice needs the number of samples {type(stream).__name__} yields per"
                " epoch (every rank must make the same number of steps): pass `num_samples`."
            )
        full, rest = divmod(int(length), int(window))
        sizes = [int(window)] * full + ([rest] if rest else [])
        super().__init__(sizes, window=1, group_by_chunk=True, shuffle_chunks=False)
        self.stream = stream
        self.window_size = int(window)
        self._reset()

    def _reset(self) -> None:
        self._iterator: Iterator[Any] | None = None
        self._next_window = 0  # the window the iterator reads next
        self._buffer: list[Any] = []

    def __getstate__(self) -> dict[str, Any]:
        state = self.__dict__.copy()
        state.update(_iterator=None, _next_window=0, _buffer=[])  # a worker starts afresh
        return state

    def __getitem__(self, index: int) -> Any:
        if not 0 <= index < len(self):
            raise IndexError(f"StreamSlice index {index} is outside 0..{len(self) - 1}.")
        window = index // self.window_size
        if self._iterator is None or window < self._next_window - 1:
            self._iterator = iter(self.stream)  # a new pass (a new epoch)
            self._next_window = 0
        while self._next_window <= window:
            expected = self.chunk_sizes[self._next_window]
            self._buffer = list(itertools.islice(self._iterator, expected))
            if len(self._buffer) < expected:
                raise RuntimeError(
                    f"The stream {type(self.stream).__name__} ended after"
                    f" {self._next_window * self.window_size + len(self._buffer)} samples;"
                    f" StreamSlice was told it yields {len(self)} per epoch."
                )
            self._next_window += 1
        return self._buffer[index - window * self.window_size]
