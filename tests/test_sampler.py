import itertools

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero._data import with_batch_sampler
from lightning_hetero.planning import PlanError
from lightning_hetero.sampler import EpochPermutation, GlobalBatchSampler


def make_samplers(num_samples, plan, shuffle=True, drop_last=False, seed=3):
    return [
        GlobalBatchSampler(EpochPermutation(num_samples, shuffle, seed), plan, rank, drop_last)
        for rank in range(len(plan))
    ]


def epoch_batches(samplers, epoch=0):
    for sampler in samplers:
        sampler.sampler.set_epoch(epoch)
    return [list(sampler) for sampler in samplers]


@pytest.mark.parametrize("num_samples", [60, 61, 63, 64, 100, 127])
@pytest.mark.parametrize("plan", [[4, 4, 4, 4], [2, 3, 5, 6], [1, 1, 1, 13], [7, 9]])
@pytest.mark.parametrize("drop_last", [False, True])
def test_every_sample_used_once_per_epoch_with_equal_step_counts(num_samples, plan, drop_last):
    samplers = make_samplers(num_samples, plan, drop_last=drop_last)
    batches = epoch_batches(samplers)
    steps = {len(b) for b in batches}
    assert len(steps) == 1 and steps == {len(samplers[0])}
    used = [i for rank_batches in batches for batch in rank_batches for i in batch]
    assert len(used) == len(set(used)), "a sample was used twice"
    total = sum(plan)
    if drop_last:
        assert len(used) == (num_samples // total) * total
    else:
        assert sorted(used) == list(range(num_samples))
    assert all(len(batch) >= 1 for rank_batches in batches for batch in rank_batches)


def test_full_steps_follow_the_plan_and_tail_is_split_in_proportion():
    samplers = make_samplers(16 * 3 + 8, [2, 4, 4, 6], shuffle=False)
    batches = epoch_batches(samplers)
    for step in range(3):
        assert [len(b[step]) for b in batches] == [2, 4, 4, 6]
    assert [len(b[3]) for b in batches] == [1, 2, 2, 3]
    assert batches[0][0] == [0, 1] and batches[1][0] == [2, 3, 4, 5]


def test_a_tail_below_the_minimums_is_padded_with_the_first_samples_like_ddp():
    samplers = make_samplers(16 * 2 + 2, [2, 4, 4, 6], shuffle=False)
    batches = epoch_batches(samplers)
    assert len(samplers[0]) == 3
    assert [b[2] for b in batches] == [[32], [33], [0], [1]]


def test_no_rank_gets_fewer_than_its_minimum_in_the_tail_step():
    # 643 samples, 2 ranks of 32, a BatchNorm model (minimum 2): DDP runs this
    plan, lower = [32, 32], [2, 2]
    epoch = EpochPermutation(643, shuffle=True, seed=0)
    samplers = [GlobalBatchSampler(epoch, plan, k, min_batch_sizes=lower) for k in (0, 1)]
    batches = epoch_batches(samplers)
    assert [len(b[-1]) for b in batches] == [2, 2]
    used = [i for rank in batches for batch in rank for i in batch]
    assert sorted(set(used)) == list(range(643)) and len(used) == 644
    # enough leftovers: split in proportion, each at least its minimum
    samplers = make_samplers(16 * 3 + 9, [2, 4, 4, 6], shuffle=False)
    for sampler in samplers:
        sampler.min_batch_sizes = [2, 2, 2, 2]
    assert samplers[0].layout(3) == (48, [2, 2, 2, 3])


def test_shuffle_is_shared_across_ranks_and_changes_with_the_epoch():
    samplers = make_samplers(40, [3, 5, 2])
    first = epoch_batches(samplers, epoch=0)
    again = epoch_batches(samplers, epoch=0)
    second = epoch_batches(samplers, epoch=1)
    assert first == again
    assert first != second
    unshuffled = epoch_batches(make_samplers(40, [3, 5, 2], shuffle=False))
    assert unshuffled[0][0] == [0, 1, 2]


def test_plan_change_mid_epoch_keeps_exact_coverage():
    plan, new_plan = [4, 4, 4, 4], [2, 3, 3, 8]
    samplers = make_samplers(100, plan)
    iterators = [iter(s) for s in samplers]
    drawn = [[next(it) for _ in range(3)] for it in iterators]
    for sampler in samplers:
        sampler.set_plan(new_plan, from_step=3)
    drawn = [d + list(it) for d, it in zip(drawn, iterators)]
    assert [len(d[3]) for d in drawn] == new_plan
    used = [i for rank in drawn for batch in rank for i in batch]
    assert sorted(used) == list(range(100))
    assert all(s.batch_sizes == new_plan for s in samplers)
    # the next epoch starts with the new plan
    assert [len(b[0]) for b in epoch_batches(samplers, 1)] == new_plan


def test_plan_scheduled_past_the_epoch_end_starts_with_the_next_epoch():
    samplers = make_samplers(48, [4, 4, 4])
    first = epoch_batches(samplers)
    for sampler in samplers:
        sampler.set_plan([2, 4, 6], from_step=len(sampler))
    assert [len(b[-1]) for b in first] == [4, 4, 4]
    assert [len(b[0]) for b in epoch_batches(samplers, 1)] == [2, 4, 6]


def test_changing_a_step_already_drawn_is_refused():
    (sampler,) = make_samplers(40, [8])
    iterator = iter(sampler)
    next(iterator), next(iterator)
    with pytest.raises(ValueError, match="already drawn"):
        sampler.set_plan([8], from_step=1)


def test_plans_with_the_wrong_sum_or_length_are_refused():
    (sampler, _) = make_samplers(40, [4, 4])
    with pytest.raises(PlanError, match="sums to"):
        sampler.set_plan([4, 5])
    with pytest.raises(PlanError, match="entries"):
        sampler.set_plan([8])
    with pytest.raises(PlanError, match="positive"):
        sampler.set_plan([0, 8])


def test_dataset_smaller_than_one_global_batch_is_refused():
    with pytest.raises(PlanError, match="fewer than one global batch"):
        make_samplers(10, [4, 8])


@pytest.mark.parametrize("persistent", [False, True])
def test_coverage_holds_through_dataloader_workers_across_epochs(persistent):
    data = TensorDataset(torch.arange(90))
    plan = [5, 7, 11]
    samplers = make_samplers(len(data), plan)
    loaders = [
        DataLoader(
            data, batch_sampler=s, num_workers=2, persistent_workers=persistent, prefetch_factor=2
        )
        for s in samplers
    ]
    for epoch in range(2):
        for s in samplers:
            s.sampler.set_epoch(epoch)
        seen = [torch.cat([batch[0] for batch in loader]).tolist() for loader in loaders]
        flat = list(itertools.chain.from_iterable(seen))
        assert sorted(flat) == list(range(90))


def test_plan_change_while_workers_prefetch_keeps_coverage():
    data = TensorDataset(torch.arange(200))
    samplers = make_samplers(len(data), [5, 5, 10])
    loaders = [
        DataLoader(data, batch_sampler=s, num_workers=2, prefetch_factor=2) for s in samplers
    ]
    iterators = [iter(loader) for loader in loaders]
    seen = [[next(it)[0] for _ in range(2)] for it in iterators]
    first_free = max(s.cursor for s in samplers)
    assert first_free > 2  # the workers have prefetched
    for s in samplers:
        s.set_plan([2, 6, 12], from_step=first_free)
    for rank, it in enumerate(iterators):
        seen[rank].extend(batch[0] for batch in it)
    flat = torch.cat([torch.cat(batches) for batches in seen]).tolist()
    assert sorted(flat) == list(range(200))
    assert [len(seen[k][-1]) for k in range(3)] == [2, 6, 12]


def test_partition_sampler_pads_a_short_last_batch_to_the_minimum():
    from lightning_hetero.sampler import PartitionBatchSampler

    epoch = EpochPermutation(10, shuffle=False)
    sampler = PartitionBatchSampler(epoch, [7, 3], [3, 3], rank=0, min_batch_size=2)
    assert list(sampler) == [[0, 1, 2], [3, 4, 5], [6, 0]]
    assert [sampler.size_at(step) for step in range(4)] == [3, 3, 2, 0]


# ---------------------------------------------------------------- resuming inside an epoch
def _loaders(plan, seed=5, epoch=1, samples=50):
    loaders = []
    for rank in range(len(plan)):
        order = EpochPermutation(samples, seed=seed)
        order.set_epoch(epoch)
        sampler = GlobalBatchSampler(order, plan, rank)
        data = list(range(samples))
        loaders.append(with_batch_sampler(DataLoader(data, batch_size=8), sampler))
    return loaders


def test_a_map_style_loader_resumes_inside_an_epoch_training_each_sample_once():
    first = []
    for loader in _loaders([10, 6]):
        iterator = iter(loader)
        first.append([next(iterator).tolist() for _ in range(2)])
        state = loader.state_dict()  # what Lightning checkpoints after 2 steps
        assert state["step"] == 2 and state["steps"] == 4
        resumed = _loaders([10, 6])[loader.batch_sampler.rank]
        resumed.load_state_dict(state)
        first[-1] += [batch.tolist() for batch in resumed]
    trained = sorted(i for rank in first for batch in rank for i in batch)
    assert trained == list(range(50))


def test_the_state_of_an_ended_epoch_resumes_on_any_world_size():
    (loader,) = _loaders([16], epoch=0)
    list(loader)
    state = loader.state_dict()
    assert state["step"] == state["steps"] == 4
    fresh = _loaders([5, 5, 5], epoch=0)[0]
    fresh.load_state_dict(state)  # nothing left of that epoch: the next starts afresh
    assert len(list(fresh)) == 4
    with pytest.warns(UserWarning, match="a global batch of 16.*global batch of 15.*starts over"):
        fresh.load_state_dict({**state, "step": 2})  # another global batch: see below
    assert len(list(fresh)) == 4


@pytest.mark.parametrize(
    ("samples", "plan", "changed"),
    [(60, [10, 6], "samples"), (50, [8, 8, 8], "global batch"), (51, [10, 6], "samples")],
)
def test_a_mid_epoch_state_of_other_data_or_batch_starts_the_epochs_order_over(
    samples, plan, changed
):
    # issue 40, failure 6: a changed training set (100 -> 120 samples) or global batch
    # resumed at the saved step of a different order, silently
    (saved,) = _loaders([16], samples=50)
    iterator = iter(saved)
    for _ in range(2):
        next(iterator)
    state = saved.state_dict()
    assert state["samples"] == 50 and state["step"] == 2
    for loader in _loaders(plan, samples=samples):
        with pytest.warns(UserWarning, match="starts over") as record:
            loader.load_state_dict(state)
        assert len(record) == 1, changed
        fresh = _loaders(plan, samples=samples)[loader.batch_sampler.rank]
        assert [b.tolist() for b in loader] == [b.tolist() for b in fresh]  # from step 0


def test_a_mid_epoch_state_goes_on_with_the_same_steps_on_another_number_of_ranks():
    trained = []
    for loader in _loaders([10, 6], samples=51):
        iterator = iter(loader)
        trained += [i for _ in range(2) for i in next(iterator).tolist()]
        state = loader.state_dict()
    for loader in _loaders([5, 5, 6], samples=51):  # one more rank, the same global batch
        loader.load_state_dict(state)
        batches = [batch.tolist() for batch in loader]
        assert [len(b) for b in batches[:1]] == [[5, 5, 6][loader.batch_sampler.rank]]
        trained += [i for batch in batches for i in batch]
    assert sorted(trained) == list(range(51))
