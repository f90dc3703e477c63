"""Samples read per second: StreamingView against LitData's own uniform loader (issue 26).

    python -m lightning_hetero.bench.streaming
    python -m lightning_hetero.bench.streaming --samples 40000 --repeats 7 --window 8

Writes a LitData dataset of ``--samples`` samples (an index and ``--features`` float32
values each, ``--chunk`` samples per chunk) to a temporary directory, then reads one epoch
of it on the training thread (``num_workers=0``, batches of ``--batch-size``) with:

- ``litdata``: LitData's own ``StreamingDataLoader`` over a shuffled ``StreamingDataset``
  (its chunk-aware shuffle; one rank, so it reads every sample): the baseline;
- ``view``: ``StreamingView`` driven by ``GlobalBatchSampler`` over its chunk-aware order,
  one rank with the whole global batch: the same samples, the same batch size;
- ``view-share``: rank 0 of the plan ``[3B/4, B/4]`` (its 3/4 of every global batch);
- ``view-sample-shuffle``: the view under a sample-level shuffle (``EpochPermutation``),
  what the chunk-aware order saves;
- ``stream-slice``: ``StreamSlice`` over LitData's unshuffled stream, rank 0 of ``[B/2,
  B/2]``: samples kept per second (it reads all of them).

Every repeat reads with all of them, in an order that rotates between repeats; the ratio to
``litdata`` is taken within the repeat. Cells: min / median / max over repeats.
"""

import argparse
import tempfile
import time
from collections.abc import Callable, Iterable
from pathlib import Path

import torch
from torch.utils.data import DataLoader

from lightning_hetero._data import epoch_order, with_batch_sampler
from lightning_hetero.bench._format import spread
from lightning_hetero.sampler import EpochPermutation, GlobalBatchSampler
from lightning_hetero.streaming import StreamingView, StreamSlice

__all__ = ["READERS", "main", "read_rate", "streaming_table", "write_dataset"]

INSTALL = "pip install 'lightning_hetero[litdata]'"

#: The readers, in the table's order (see the module's docstring).
READERS = ("litdata", "view", "view-share", "view-sample-shuffle", "stream-slice")


def write_dataset(directory: str, samples: int, features: int, chunk: int) -> None:
    """A LitData dataset of ``samples`` ``{"index", "x"}`` samples, ``chunk`` per chunk."""
    from litdata.streaming.writer import BinaryWriter  # what `litdata.optimize` writes with

    writer = BinaryWriter(directory, chunk_size=chunk)
    generator = torch.Generator().manual_seed(0)
    for index in range(samples):
        writer[index] = {"index": index, "x": torch.randn(features, generator=generator)}
    writer.done()
    writer.merge()


def read_rate(batches: Iterable[dict], expected: int) -> float:
    """Samples per second read from ``batches`` (one epoch of ``expected`` samples)."""
    start = time.perf_counter()
    count = sum(len(batch["index"]) for batch in batches)
    elapsed = time.perf_counter() - start
    if count != expected:
        raise RuntimeError(f"read {count} samples, expected {expected}.")
    return count / elapsed


def _readers(directory: str, batch_size: int, window: int) -> dict[str, Callable[[], float]]:
    from litdata import StreamingDataLoader, StreamingDataset

    def litdata() -> float:
        dataset = StreamingDataset(directory, shuffle=True, seed=1)
        return read_rate(StreamingDataLoader(dataset, batch_size=batch_size), len(dataset))

    def view(plan: list[int], chunk_aware: bool = True) -> float:
        data = StreamingView(StreamingDataset(directory), window=window)
        epochs = (
            epoch_order(data, True, 1, sum(plan))
            if chunk_aware
            else EpochPermutation(len(data), seed=1)
        )
        sampler = GlobalBatchSampler(epochs, plan, rank=0, drop_last=True)
        loader = with_batch_sampler(DataLoader(data, batch_size=plan[0]), sampler)
        return read_rate(loader, len(sampler) * plan[0])

    def stream_slice() -> float:
        stream = StreamingDataset(directory, shuffle=False)
        data = StreamSlice(stream, num_samples=len(stream), window=max(batch_size * 4, 256))
        half = [batch_size // 2, batch_size - batch_size // 2]
        sampler = GlobalBatchSampler(epoch_order(data, True, 1, batch_size), half, 0, True)
        loader = with_batch_sampler(DataLoader(data, batch_size=half[0]), sampler)
        return read_rate(loader, len(sampler) * half[0])

    share = [batch_size * 3 // 4, batch_size - batch_size * 3 // 4]
    return {
        "litdata": litdata,
        "view": lambda: view([batch_size]),
        "view-share": lambda: view(share),
        "view-sample-shuffle": lambda: view([batch_size], chunk_aware=False),
        "stream-slice": stream_slice,
    }


def streaming_table(
    samples: int = 20000,
    features: int = 64,
    chunk: int = 256,
    batch_size: int = 64,
    window: int = 8,
    repeats: int = 5,
) -> str:
    """Read rates of every reader over ``repeats`` repeats; returns a Markdown table."""
    if repeats < 1:
        raise ValueError(f"`repeats` must be >= 1, got {repeats}.")
    with tempfile.TemporaryDirectory() as tmp:
        directory = str(Path(tmp) / "data")
        write_dataset(directory, samples, features, chunk)
        readers = _readers(directory, batch_size, window)
        rates: dict[str, list[float]] = {name: [] for name in READERS}
        for repeat in range(repeats):
            shift = repeat % len(READERS)
            for name in READERS[shift:] + READERS[:shift]:
                rates[name].append(readers[name]())
    lines = [
        "| reader | samples/s read | ratio to litdata (same repeat) |",
        "|---|---|---|",
    ]
    for name in READERS:
        ratios = [r / base for r, base in zip(rates[name], rates["litdata"])]
        lines.append(f"| `{name}` | {spread(rates[name], '.0f')} | {spread(ratios, '.3g')} |")
    lines.append("")
    lines.append(
        f"{samples} samples of {features} float32 values, {chunk} per chunk; batches of"
        f" {batch_size}, window {window} chunks, num_workers=0; {repeats} repeats."
    )
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_hetero.bench.streaming")
    parser.add_argument("--samples", type=int, default=20000)
    parser.add_argument("--features", type=int, default=64)
    parser.add_argument("--chunk", type=int, default=256, help="samples per chunk")
    parser.add_argument("--batch-size", type=int, default=64, help="the global batch")
    parser.add_argument("--window", type=int, default=8, help="chunks shuffled together")
    parser.add_argument("--repeats", type=int, default=5)
    args = parser.parse_args(argv)
    try:
        import litdata  # noqa: F401
    except ImportError:
        parser.exit(2, f"{parser.prog} reads LitData datasets: {INSTALL}\n")
    print(
        streaming_table(
            args.samples, args.features, args.chunk, args.batch_size, args.window, args.repeats
        )
    )


if __name__ == "__main__":
    main()
