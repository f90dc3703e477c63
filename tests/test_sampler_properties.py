"""Property-based tests of the global-batch slicing sampler (hypothesis)."""

from collections import Counter

from hypothesis import given
from hypothesis import strategies as st

from lightning_hetero.planning import PlanError, proportional_split
from lightning_hetero.sampler import EpochPermutation, GlobalBatchSampler, PartitionBatchSampler


@st.composite
def setups(draw):
    n = draw(st.integers(1, 6))
    lower = draw(st.lists(st.integers(1, 3), min_size=n, max_size=n))
    total = draw(st.integers(sum(lower), 48))
    weights = draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    plan = proportional_split(weights, total, lower)
    num_samples = draw(st.integers(total, 6 * total + 7))
    return n, plan, lower, num_samples, draw(st.booleans()), draw(st.booleans())


def _epoch(samplers, changes):
    """Iterate every rank's sampler in lock-step, applying plan changes as they come due."""
    iterators = [iter(s) for s in samplers]
    batches = [[] for _ in samplers]
    step = 0
    while True:
        for at, plan in changes:
            if at == step:
                for sampler in samplers:
                    sampler.set_plan(plan, from_step=step)
        drawn = [next(it, None) for it in iterators]
        if all(b is None for b in drawn):
            return batches
        assert all(b is not None for b in drawn), "ranks disagree on the number of steps"
        for rank, batch in enumerate(drawn):
            batches[rank].append(batch)
        step += 1


@given(setups(), st.data())
def test_each_sample_once_per_epoch_equal_steps_and_plan_sized_batches(setup, data):
    n, plan, lower, num_samples, shuffle, drop_last = setup
    total = sum(plan)
    epoch = EpochPermutation(num_samples, shuffle=shuffle, seed=data.draw(st.integers(0, 9)))
    samplers = [
        GlobalBatchSampler(epoch, plan, rank, drop_last=drop_last, min_batch_sizes=lower)
        for rank in range(n)
    ]
    steps = len(samplers[0])
    changes = []
    for _ in range(data.draw(st.integers(0, 3))):
        at = data.draw(st.integers(0, max(steps - 1, 0)))
        weights = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
        changes.append((at, proportional_split(weights, total, lower)))
    changes.sort(key=lambda change: change[0])
    for number in range(2):  # two epochs: set_epoch draws a new permutation
        epoch.set_epoch(number)
        batches = _epoch(samplers, changes if number == 0 else [])
        assert all(len(b) == steps for b in batches)
        # no rank trains on fewer samples than its minimum, the tail step included
        assert all(len(b) >= lo for rank, lo in zip(batches, lower) for b in rank)
        seen = Counter(i for rank in batches for batch in rank for i in batch)
        remainder = num_samples % total
        if drop_last:
            assert set(seen.values()) == {1}
            assert len(seen) == steps * total == num_samples - remainder
        else:
            assert sorted(seen) == list(range(num_samples))
            # only a tail below the minimums' sum is padded, by exactly the missing samples
            padding = sum(lower) - remainder if 0 < remainder < sum(lower) else 0
            assert sum(seen.values()) == num_samples + padding
        full_steps = num_samples // total
        for step in range(min(steps, full_steps) - (0 if drop_last else 1)):
            in_force = samplers[0].plan_at(step)
            assert [len(batches[k][step]) for k in range(n)] == in_force


@given(
    st.lists(st.integers(1, 300), min_size=1, max_size=6),
    st.data(),
    st.booleans(),
)
def test_partition_sampler_gives_each_rank_its_share_once(samples, data, shuffle):
    n = len(samples)
    batch_sizes = data.draw(st.lists(st.integers(1, 64), min_size=n, max_size=n))
    epoch = EpochPermutation(sum(samples), shuffle=shuffle, seed=3)
    seen = Counter()
    for rank in range(n):
        batches = list(PartitionBatchSampler(epoch, samples, batch_sizes, rank))
        assert sum(map(len, batches)) == samples[rank]
        assert all(len(b) == batch_sizes[rank] for b in batches[:-1])
        seen.update(i for batch in batches for i in batch)
    assert sorted(seen) == list(range(sum(samples))) and set(seen.values()) == {1}


@given(st.integers(1, 6), st.data())
def test_a_plan_larger_than_the_dataset_is_refused(n, data):
    plan = data.draw(st.lists(st.integers(1, 9), min_size=n, max_size=n))
    try:
        GlobalBatchSampler(EpochPermutation(sum(plan) - 1), plan, 0)
    except PlanError as err:
        assert "fewer than one global batch" in str(err)
    else:
        raise AssertionError("no error")
