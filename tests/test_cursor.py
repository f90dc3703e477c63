"""Tests for lightning_hetero/cursor.py: shared claim counters and the mega-batch sampler."""

import multiprocessing as mp
import queue as queue_module
import time
from collections import Counter
from collections.abc import Iterator
from datetime import timedelta

import pytest
import torch.distributed as dist

from lightning_hetero.cursor import BatchTag, MegaBatchSampler, SharedCursor
from lightning_hetero.sampler import EpochPermutation


@pytest.fixture
def store() -> Iterator[dist.TCPStore]:
    """A master TCPStore on a free port, served from the test process."""
    master = dist.TCPStore(
        "127.0.0.1", 0, is_master=True, wait_for_workers=False, timeout=timedelta(seconds=30)
    )
    yield master
    del master


def client(store: dist.TCPStore) -> SharedCursor:
    return SharedCursor.connect("127.0.0.1", store.port, timeout=timedelta(seconds=30))


# --- SharedCursor: one process ----------------------------------------------------------------


def test_claims_partition_the_range(store: dist.TCPStore) -> None:
    cursor = SharedCursor(store)
    claims = [cursor.claim("k", size, 10) for size in (3, 4, 2, 5, 1)]
    assert claims == [(0, 3), (3, 7), (7, 9), (9, 10), (10, 10)]


def test_exhausted_counter_stays_empty(store: dist.TCPStore) -> None:
    cursor = SharedCursor(store)
    assert cursor.claim("k", 8, 8) == (0, 8)
    assert cursor.claim("k", 1, 8) == (8, 8)
    assert cursor.claim("k", 100, 8) == (8, 8)
    assert cursor.claim("empty", 1, 0) == (0, 0)


def test_keys_and_prefixes_are_independent(store: dist.TCPStore) -> None:
    first, second = SharedCursor(store, prefix="a/"), SharedCursor(store, prefix="b/")
    assert first.claim("k", 4, 10) == (0, 4)
    assert first.claim("other", 4, 10) == (0, 4)
    assert second.claim("k", 3, 10) == (0, 3)
    assert first.claim("k", 4, 10) == (4, 8)


def test_client_connection_shares_the_counters(store: dist.TCPStore) -> None:
    local, remote = SharedCursor(store), client(store)
    assert local.claim("k", 2, 5) == (0, 2)
    assert remote.claim("k", 2, 5) == (2, 4)
    assert local.claim("k", 2, 5) == (4, 5)
    assert remote.claim("k", 2, 5) == (5, 5)


@pytest.mark.parametrize(
    ("size", "limit", "match"),
    [(0, 10, "at least 1 item, got 0"), (-2, 10, "got -2"), (1, -1, "must be >= 0, got -1")],
)
def test_claim_validation(store: dist.TCPStore, size: int, limit: int, match: str) -> None:
    with pytest.raises(ValueError, match=match):
        SharedCursor(store).claim("k", size, limit)


# --- SharedCursor: concurrent processes -------------------------------------------------------

NUM_PROCS = 3
LIMIT = 600


# Generous: on a loaded 2-core machine, spawning a process that imports torch can take minutes,
# and so can its exit. None of the assertions depends on these times; the test as a whole is
# bounded by pytest-timeout (pyproject.toml).
STARTUP_S = 500


def _claim_worker(port: int, rank: int, size: int, queue: "mp.Queue") -> None:
    """Wait for every worker, then claim ``size`` at a time until the pool is exhausted."""
    try:
        cursor = SharedCursor.connect("127.0.0.1", port, timeout=timedelta(seconds=STARTUP_S))
        cursor.store.add("ready", 1)
        deadline = time.monotonic() + STARTUP_S
        while cursor.store.add("ready", 0) < NUM_PROCS:  # a start barrier on the store
            if time.monotonic() > deadline:
                raise TimeoutError("the other workers never connected")
            time.sleep(0.005)
        claims = []
        while True:
            start, stop = cursor.claim("pool", size, LIMIT)
            if start >= stop:
                break
            claims.append((start, stop))
            time.sleep(0.001)  # let the other processes interleave
        queue.put((rank, claims, None))
    except Exception as error:  # reported to the test process
        queue.put((rank, [], repr(error)))


def _results(queue: "mp.Queue", procs: list) -> list:
    """One result per process; fails at once when a process died without sending one (a live
    one bounds its own wait: ``STARTUP_S``)."""
    results: list = []
    while len(results) < len(procs):
        try:
            results.append(queue.get(timeout=1))
            continue
        except queue_module.Empty:
            pass
        reported = {rank for rank, _, _ in results}
        dead = [
            (rank, proc.exitcode)
            for rank, proc in enumerate(procs)
            if rank not in reported and proc.exitcode is not None
        ]
        # a result may still be in the pipe of a process that just exited: one last look
        if dead and queue.empty():
            pytest.fail(f"processes (rank, exit code) {dead} exited without a result")
    return results


def test_concurrent_processes_claim_each_index_once(store: dist.TCPStore) -> None:
    context = mp.get_context("spawn")
    queue = context.Queue()
    sizes = [1, 3, 7]
    procs = [
        context.Process(target=_claim_worker, args=(store.port, rank, sizes[rank], queue))
        for rank in range(NUM_PROCS)
    ]
    for proc in procs:
        proc.start()
    try:
        results = _results(queue, procs)
        for proc in procs:  # each has sent its result: let it finish exiting, however slowly
            proc.join()
        assert [proc.exitcode for proc in procs] == [0] * NUM_PROCS
    finally:
        for proc in procs:  # only after a failure above: no process outlives the test
            if proc.is_alive():
                proc.kill()
                proc.join()
    errors = [error for _, _, error in results if error]
    assert not errors, errors
    counts: Counter[int] = Counter()
    for rank, claims, _ in results:
        assert claims, f"process {rank} claimed nothing"
        for start, stop in claims:
            assert 0 < stop - start <= sizes[rank]
            counts.update(range(start, stop))
    assert sorted(counts) == list(range(LIMIT))
    assert set(counts.values()) == {1}


# --- MegaBatchSampler -------------------------------------------------------------------------


def make_sampler(
    cursor: SharedCursor, batch_size: int, megabatch_size: int = 10, num_samples: int = 25
) -> MegaBatchSampler:
    permutation = EpochPermutation(num_samples, shuffle=True, seed=3)
    return MegaBatchSampler(permutation, cursor, batch_size, megabatch_size, run_id="run")


def test_single_sampler_covers_the_permutation_once(store: dist.TCPStore) -> None:
    sampler = make_sampler(SharedCursor(store), batch_size=4)
    batches = list(sampler)
    permutation = sampler.sampler.permutation()
    # Mega-batches of 10, 10, 5 positions, claimed 4 at a time without crossing a boundary.
    assert [len(b) for b in batches] == [4, 4, 2, 4, 4, 2, 4, 1]
    assert [i for b in batches for i in b] == permutation
    assert [tag.megabatch for tag in sampler.tags] == [0, 0, 0, 1, 1, 1, 2, 2]
    assert list(sampler.tags) == [
        BatchTag(m, len(b)) for m, b in zip([0, 0, 0, 1, 1, 1, 2, 2], batches)
    ]
    assert sampler.claimed == 25
    assert sampler.claimed_batches == 8
    assert sampler.num_megabatches == 3
    # Each index's tag is the mega-batch of its position in the permutation.
    for tag, batch in zip(sampler.tags, batches):
        for index in batch:
            assert sampler.megabatch_of(permutation.index(index)) == tag.megabatch


def test_two_samplers_round_robin_share_the_pool(store: dist.TCPStore) -> None:
    samplers = [make_sampler(SharedCursor(store), 3), make_sampler(client(store), 4)]
    iterators = [iter(s) for s in samplers]
    drawn: list[list[tuple[int, list[int]]]] = [[], []]
    active = [0, 1]
    while active:
        for rank in list(active):
            batch = next(iterators[rank], None)
            if batch is None:
                active.remove(rank)
            else:
                drawn[rank].append((samplers[rank].tags[-1].megabatch, batch))
    permutation = samplers[0].sampler.permutation()
    everything = [i for rank in drawn for _, b in rank for i in b]
    assert sorted(everything) == list(range(25))
    assert all(drawn), "both samplers should have drawn batches"
    for rank, batches in enumerate(drawn):
        megabatches = [m for m, _ in batches]
        assert megabatches == sorted(megabatches)  # tags never decrease
        for megabatch, batch in batches:
            assert 0 < len(batch) <= [3, 4][rank]
            start, stop = samplers[rank].megabatch_bounds(megabatch)
            assert set(batch) <= set(permutation[start:stop])  # no claim crosses a boundary
    assert samplers[0].claimed + samplers[1].claimed == 25


def test_new_epoch_uses_fresh_keys(store: dist.TCPStore) -> None:
    sampler = make_sampler(SharedCursor(store), batch_size=6)
    first = [i for b in sampler for i in b]
    assert list(sampler) == []  # the same epoch again: everything is already claimed
    sampler.sampler.set_epoch(1)
    second = [i for b in sampler for i in b]
    assert sorted(first) == sorted(second) == list(range(25))
    assert first != second  # a different shuffle
    assert second == sampler.sampler.permutation()
    assert sampler.claimed == 25
    assert sampler.key(2) == "run/e1/m2"


def test_other_run_ids_do_not_interfere(store: dist.TCPStore) -> None:
    make_sampler(SharedCursor(store), batch_size=5).__iter__().__next__()
    other = MegaBatchSampler(EpochPermutation(25, seed=3), SharedCursor(store), 5, 10, "other")
    assert sorted(i for b in other for i in b) == list(range(25))


def test_len_raises_type_error(store: dist.TCPStore) -> None:
    sampler = make_sampler(SharedCursor(store), batch_size=4)
    with pytest.raises(TypeError, match="no length"):
        len(sampler)


def test_batch_size_change_applies_at_the_next_claim(store: dist.TCPStore) -> None:
    sampler = make_sampler(SharedCursor(store), batch_size=2, megabatch_size=25)
    iterator = iter(sampler)
    assert len(next(iterator)) == 2
    assert len(next(iterator)) == 2
    sampler.set_batch_size(7)
    assert len(next(iterator)) == 7
    sampler.batch_size = 5
    assert [len(b) for b in iterator] == [5, 5, 4]
    assert [tag.size for tag in sampler.tags] == [2, 2, 7, 5, 5, 4]


def test_megabatch_larger_than_the_dataset_is_one_megabatch(store: dist.TCPStore) -> None:
    sampler = make_sampler(SharedCursor(store), batch_size=10, megabatch_size=1000)
    assert sampler.num_megabatches == 1
    assert [len(b) for b in sampler] == [10, 10, 5]


def test_tags_are_reset_by_a_new_pass(store: dist.TCPStore) -> None:
    sampler = make_sampler(SharedCursor(store), batch_size=4)
    next(iter(sampler))
    assert len(sampler.tags) == 1
    sampler.sampler.set_epoch(5)
    assert len(list(sampler)) == 8
    assert len(sampler.tags) == 8


@pytest.mark.parametrize(
    ("batch_size", "megabatch_size", "match"),
    [(0, 10, "batch size must be an int >= 1"), (2.5, 10, "got 2.5"), (4, 0, "megabatch_size")],
)
def test_sampler_validation(
    store: dist.TCPStore, batch_size: int, megabatch_size: int, match: str
) -> None:
    with pytest.raises(ValueError, match=match):
        make_sampler(SharedCursor(store), batch_size, megabatch_size)


def test_set_batch_size_validation(store: dist.TCPStore) -> None:
    sampler = make_sampler(SharedCursor(store), batch_size=4)
    with pytest.raises(ValueError, match="got 0"):
        sampler.set_batch_size(0)
    assert sampler.batch_size == 4


def test_position_helpers(store: dist.TCPStore) -> None:
    sampler = make_sampler(SharedCursor(store), batch_size=4)
    assert [sampler.megabatch_of(p) for p in (0, 9, 10, 24)] == [0, 0, 1, 2]
    assert sampler.megabatch_bounds(2) == (20, 25)
    with pytest.raises(IndexError):
        sampler.megabatch_of(25)
    with pytest.raises(IndexError):
        sampler.megabatch_bounds(3)


def test_a_short_last_claim_is_padded_to_the_minimum_batch(store: dist.TCPStore) -> None:
    # 10 samples in one mega-batch, claims of 4: the last claim gets 2, padded to 3
    epoch = EpochPermutation(10, shuffle=False)
    sampler = MegaBatchSampler(epoch, client(store), 4, 10, "pad", min_batch_size=3)
    batches = list(sampler)
    assert batches == [[0, 1, 2, 3], [4, 5, 6, 7], [8, 9, 0]]
    assert [tag.size for tag in sampler.tags] == [4, 4, 3]
    with pytest.raises(ValueError, match="min_batch_size"):
        MegaBatchSampler(epoch, client(store), 4, 10, "bad", min_batch_size=11)


def test_a_last_mega_batch_smaller_than_the_minimum_is_padded_to_it(store: dist.TCPStore) -> None:
    # 11 samples in mega-batches of 5: the last holds one sample, the minimum is 3
    epoch = EpochPermutation(11, shuffle=False)
    sampler = MegaBatchSampler(epoch, client(store), 5, 5, "small-last", min_batch_size=3)
    assert list(sampler) == [[0, 1, 2, 3, 4], [5, 6, 7, 8, 9], [10, 0, 1]]
