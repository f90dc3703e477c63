"""Streaming datasets under the global-batch sampler (lightning_hetero.streaming)."""

import itertools
from collections import OrderedDict

import pytest
import torch
from torch.utils.data import DataLoader, IterableDataset, TensorDataset

from lightning_hetero._data import check_training_loader, epoch_order, with_batch_sampler
from lightning_hetero.sampler import ChunkedPermutation, EpochPermutation, GlobalBatchSampler
from lightning_hetero.streaming import StreamingView, StreamSlice, chunk_sizes_of

SIZES = [16] * 11 + [9]  # 185 samples in 12 chunks
N = sum(SIZES)
CHUNK_OF = [c for c, n in enumerate(SIZES) for _ in range(n)]


def _epoch(plan_changes, plan, rank, epoch, group=True, drop_last=False, window=3):
    order = ChunkedPermutation(SIZES, seed=7, window=window, group=sum(plan) if group else None)
    order.set_epoch(epoch)
    sampler = GlobalBatchSampler(order, plan, rank, drop_last=drop_last)
    batches = []
    for step, batch in enumerate(sampler):
        batches.append(batch)
        if step in plan_changes:
            sampler.set_plan(plan_changes[step], from_step=step + 1)
    return batches


# ---------------------------------------------------------------- the chunk-aware order
def test_chunked_order_is_a_permutation_that_mixes_samples_only_within_windows():
    order = ChunkedPermutation(SIZES, seed=3, window=3)
    seen_orders = set()
    for epoch in range(3):
        order.set_epoch(epoch)
        positions = order.permutation()
        assert sorted(positions) == list(range(N))
        windows, start = [], 0
        chunks = [CHUNK_OF[i] for i in positions]
        while start < N:  # each window: the whole of 3 chunks, nothing of any other
            window_chunks: list[int] = []
            for c in chunks[start:]:
                if c not in window_chunks:
                    if len(window_chunks) == 3:
                        break
                    window_chunks.append(c)
            size = sum(SIZES[c] for c in window_chunks)
            assert set(chunks[start : start + size]) == set(window_chunks)
            windows.append(tuple(window_chunks))
            start += size
        assert len(windows) == 4
        seen_orders.add(tuple(positions))
        assert positions != sorted(positions)
    assert len(seen_orders) == 3  # a new order each epoch
    order.set_epoch(1)
    again = ChunkedPermutation(SIZES, seed=3, window=3)
    again.set_epoch(1)
    assert again.permutation() == order.permutation()  # the same on every rank


def test_grouped_order_sorts_each_global_batch_by_chunk_and_keeps_its_samples():
    plain = ChunkedPermutation(SIZES, seed=5, window=4)
    grouped = ChunkedPermutation(SIZES, seed=5, window=4, group=20)
    a, b = plain.permutation(), grouped.permutation()
    for start in range(0, N, 20):
        assert sorted(a[start : start + 20]) == sorted(b[start : start + 20])
    assert a != b
    # within a batch, the chunks come in the epoch's chunk order: each chunk in one run
    for start in range(0, N, 20):
        chunks = [CHUNK_OF[i] for i in b[start : start + 20]]
        runs = [c for c, _ in itertools.groupby(chunks)]
        assert len(runs) == len(set(runs))


def test_unshuffled_and_stream_orders():
    assert ChunkedPermutation(SIZES, shuffle=False, window=2).permutation() == list(range(N))
    stream = ChunkedPermutation(SIZES, seed=1, window=1, shuffle_chunks=False)
    chunks = [CHUNK_OF[i] for i in stream.permutation()]
    assert chunks == sorted(chunks)  # the stream's chunk order is kept, samples mixed inside
    with pytest.raises(ValueError, match="chunk needs >= 1 sample"):
        ChunkedPermutation([4, 0])


# ---------------------------------------------------------------- coverage across ranks
@pytest.mark.parametrize("drop_last", [False, True])
@pytest.mark.parametrize(
    "plan, changes",
    [([10, 6], {}), ([10, 6], {1: [4, 12], 5: [13, 3]}), ([3, 8, 5], {0: [5, 5, 6]})],
)
def test_every_sample_once_per_epoch_across_ranks_and_plan_changes(plan, changes, drop_last):
    B = sum(plan)
    for epoch in range(3):
        ranks = [_epoch(changes, plan, k, epoch, drop_last=drop_last) for k in range(len(plan))]
        assert len({len(r) for r in ranks}) == 1  # every rank makes the same steps
        used = [i for r in ranks for batch in r for i in batch]
        if drop_last:
            assert len(used) == len(set(used)) == (N // B) * B
        else:
            assert set(used) == set(range(N))
            assert len(used) == N  # 185 = 11 * 16 + 9 here: no padding needed
        for step in range(len(ranks[0])):  # each step: the plan in force, disjoint slices
            sizes = [len(r[step]) for r in ranks]
            if step < N // B:
                expected = plan
                for start, changed in sorted(changes.items()):
                    if start + 1 <= step:
                        expected = changed
                assert sizes == expected


def _chunk_loads(batches, cache_chunks):
    """Chunk reads of one rank with an LRU cache of ``cache_chunks`` chunks."""
    cache: OrderedDict[int, None] = OrderedDict()
    loads = 0
    for batch in batches:
        for i in batch:
            chunk = CHUNK_OF[i]
            if chunk in cache:
                cache.move_to_end(chunk)
                continue
            loads += 1
            cache[chunk] = None
            if len(cache) > cache_chunks:
                cache.popitem(last=False)
    return loads


def test_a_rank_with_a_window_sized_cache_reads_each_chunk_at_most_once_per_epoch():
    plan = [8, 24]
    for group in (False, True):
        loads = [_chunk_loads(_epoch({}, plan, k, 0, group=group), 3) for k in range(2)]
        assert all(n <= len(SIZES) for n in loads), loads
    # a sample-level shuffle reads chunks over and over through the same cache
    order = EpochPermutation(N, seed=7)
    shuffled = [list(GlobalBatchSampler(order, plan, k)) for k in range(2)]
    assert min(_chunk_loads(r, 3) for r in shuffled) > 2 * len(SIZES)


def test_grouping_by_chunk_lets_a_small_share_read_fewer_chunks():
    plan = [8, 24]
    ungrouped = _chunk_loads(_epoch({}, plan, 0, 0, group=False, window=4), 4)
    grouped = _chunk_loads(_epoch({}, plan, 0, 0, group=True, window=4), 4)
    assert grouped < ungrouped == len(SIZES)


# ---------------------------------------------------------------- resuming inside an epoch
def test_a_resumed_sampler_goes_on_with_the_epochs_plans_from_the_saved_step():
    order = ChunkedPermutation(SIZES, seed=2, window=3, group=16)
    order.set_epoch(1)
    whole = GlobalBatchSampler(order, [10, 6], 1)
    first = []
    for step, batch in enumerate(whole):
        first.append(batch)
        if step == 1:
            whole.set_plan([4, 12], from_step=4)
        if step == 2:
            state = whole.state_dict()
    assert state["step"] == 3 and state["changes"] == [[4, [4, 12]]]
    # a fresh sampler (the plan the run ended with) resumes the same epoch
    resumed = GlobalBatchSampler(order, [4, 12], 1)
    resumed.load_state_dict(state)
    assert list(resumed) == first[3:]
    assert resumed.first_step == 3
    again = list(resumed)  # the next iteration is a whole epoch, on the latest plan
    assert len(again) == len(first) and len(again[0]) == 12
    order.set_epoch(2)
    resumed.load_state_dict(state)  # a state of another epoch is ignored
    assert len(list(resumed)) == len(first)
    with pytest.warns(UserWarning, match="order starts over"):  # another global batch
        GlobalBatchSampler(order, [5, 5, 5], 0).load_state_dict(state)


def test_the_streaming_loader_saves_the_batches_it_yielded():
    view = StreamingView(list(range(N)), chunk_sizes=SIZES, window=3)
    sampler = GlobalBatchSampler(epoch_order(view, True, 4, 16), [10, 6], 0)
    loader = with_batch_sampler(DataLoader(view, batch_size=8), sampler)
    assert isinstance(sampler.sampler, ChunkedPermutation)  # the view orders its epochs
    assert sampler.sampler.group == 16 and sampler.sampler.seed == 4
    iterator = iter(loader)
    for _ in range(3):
        next(iterator)
    assert loader.state_dict()["step"] == 3
    rest = list(iterator)
    assert loader.state_dict()["step"] == len(sampler) == 12
    state = {**loader.state_dict(), "step": 3}
    fresh_sampler = GlobalBatchSampler(epoch_order(view, True, 4, 16), [10, 6], 0)
    fresh = with_batch_sampler(DataLoader(view, batch_size=8), fresh_sampler)
    fresh.load_state_dict(state)
    resumed = list(fresh)
    assert [b.tolist() for b in resumed] == [b.tolist() for b in rest]
    assert fresh.state_dict()["step"] == 12


# ---------------------------------------------------------------- views
def test_a_view_reads_by_index_and_a_mosaic_style_get_item():
    class Shards:  # MosaicML streaming's random access: get_item and samples_per_shard
        samples_per_shard = [3, 3, 1]
        num_samples = 7

        def get_item(self, index):
            return index * 10

    view = StreamingView(Shards(), window=2)
    assert view.chunk_sizes == [3, 3, 1] and len(view) == 7 and view[4] == 40
    with pytest.raises(TypeError, match="pass `chunk_sizes`"):
        StreamingView(list(range(5)))
    with pytest.raises(ValueError, match="`chunk_sizes` add up to 4"):
        StreamingView(list(range(5)), chunk_sizes=[2, 2])
    with pytest.raises(TypeError, match="StreamSlice"):
        StreamingView(_Stream(5), chunk_sizes=[5])


class _Stream(IterableDataset):
    """A pure stream that counts the passes over it."""

    def __init__(self, n: int) -> None:
        self.n = n
        self.passes = 0

    def __iter__(self):
        self.passes += 1
        return iter(range(self.n))


def test_stream_slicing_covers_each_epoch_and_reads_the_stream_once_per_epoch():
    stream = _Stream(N)
    views = [StreamSlice(stream, num_samples=N, window=32) for _ in range(2)]
    plan = [10, 6]
    for epoch in range(2):
        used = []
        for rank, view in enumerate(views):
            order = views[0].epoch_order(EpochPermutation(N, seed=1), sum(plan))
            order.set_epoch(epoch)
            for batch in GlobalBatchSampler(order, plan, rank):
                used += [view[i] for i in batch]
        assert sorted(used) == list(range(N))
    assert stream.passes == 4  # once per rank per epoch, never re-read inside an epoch


def test_stream_slicing_in_dataloader_workers():
    stream = _Stream(60)
    data = StreamSlice(stream, num_samples=60, window=16)
    sampler = GlobalBatchSampler(epoch_order(data, True, 3, 12), [4, 8], 1)
    loader = with_batch_sampler(DataLoader(data, num_workers=2), sampler)
    seen = [i for batch in loader for i in batch.tolist()]
    assert len(seen) == len(set(seen)) == 40  # 8 of each global batch of 12
    mine = [i for b in GlobalBatchSampler(sampler.sampler, [4, 8], 1) for i in b]
    assert seen == mine


def test_a_short_stream_is_named():
    view = StreamSlice(_Stream(10), num_samples=12, window=8)
    with pytest.raises(RuntimeError, match="_Stream ended after 10 samples"):
        view[11]
    with pytest.raises(TypeError, match="pass `num_samples`"):
        StreamSlice(iter(range(3)))


def test_an_iterable_dataset_is_refused_with_both_ways_out():
    with pytest.raises(TypeError) as refused:
        check_training_loader(DataLoader(_Stream(10)))
    message = str(refused.value)
    assert "_Stream" in message and "StreamSlice(dataset, num_samples=...)" in message
    assert "StreamingView(dataset, chunk_sizes=...)" in message
    view = StreamingView(TensorDataset(torch.arange(10)), chunk_sizes=[5, 5])
    assert check_training_loader(DataLoader(view, batch_size=2)) == 0  # a view is accepted


# ---------------------------------------------------------------- LitData
@pytest.fixture(scope="module")
def litdata_dir(tmp_path_factory):
    pytest.importorskip("litdata")
    from litdata.streaming.writer import BinaryWriter  # what `litdata.optimize` writes with

    out = tmp_path_factory.mktemp("litdata") / "data"
    writer = BinaryWriter(str(out), chunk_size=8)
    for index in range(50):
        writer[index] = {"index": index, "x": torch.full((3,), float(index))}
    writer.done()
    writer.merge()
    return str(out)


def test_litdata_streaming_dataset_through_the_view(litdata_dir):
    import litdata

    dataset = litdata.StreamingDataset(litdata_dir)
    assert chunk_sizes_of(dataset) == [8] * 6 + [2]
    with pytest.raises(TypeError, match=r"StreamingView\(StreamingDataset\(\.\.\.\)\)"):
        check_training_loader(DataLoader(dataset, batch_size=4))
    view = StreamingView(dataset, window=2)
    assert len(view) == 50 and view[13]["index"] == 13
    plan = [7, 3]
    used = []
    for rank in range(2):
        sampler = GlobalBatchSampler(epoch_order(view, True, 9, sum(plan)), plan, rank)
        workers = {"num_workers": 1, "multiprocessing_context": "fork"} if rank else {}
        loader = with_batch_sampler(DataLoader(view, batch_size=5, **workers), sampler)
        for batch in loader:
            assert len(batch["index"]) == plan[rank]
            assert torch.equal(batch["x"][:, 0].long(), batch["index"])
            used += batch["index"].tolist()
    assert sorted(used) == list(range(50))


def test_rank_variables_are_set_where_the_launcher_left_them_unset(monkeypatch):
    from lightning_hetero.streaming import set_rank_variables

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    # Lightning's launcher sets these two (torchrun, Ray Train: all four)
    monkeypatch.setenv("WORLD_SIZE", "4")
    monkeypatch.setenv("LOCAL_RANK", "1")
    got = set_rank_variables(rank=3, world_size=4, local_rank=1, local_world_size=2)
    assert got == {"RANK": "3", "LOCAL_WORLD_SIZE": "2"}
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # one of the user's own is kept
    assert set_rank_variables(rank=3, world_size=4, local_rank=1, local_world_size=2) == {}
    import os

    assert os.environ["LOCAL_WORLD_SIZE"] == "8" and os.environ["RANK"] == "3"


def test_teardown_removes_the_rank_variables_set_and_keeps_the_rest(monkeypatch):
    # issue 40, failure 8: the strategies' teardown leaves the environment as set-up found it
    import os

    from lightning_hetero.streaming import set_rank_variables, unset_rank_variables

    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE"):
        monkeypatch.delenv(name, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "4")  # the launcher's
    added = set_rank_variables(rank=3, world_size=4, local_rank=1, local_world_size=2)
    monkeypatch.setenv("LOCAL_WORLD_SIZE", "8")  # changed since by someone else: theirs
    unset_rank_variables(added)
    assert "RANK" not in os.environ and "LOCAL_RANK" not in os.environ
    assert os.environ["WORLD_SIZE"] == "4" and os.environ["LOCAL_WORLD_SIZE"] == "8"
