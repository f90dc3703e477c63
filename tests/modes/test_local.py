"""LocalSGDMode (``mode="local"``) on a real run context."""

import math

import pytest
import torch

from lightning_hetero.modes.local import LocalSGDMode
from lightning_hetero.sampler import EpochPermutation

from .conftest import bound


def _local(plan: list[int], **kwargs) -> tuple[LocalSGDMode, list]:
    mode, replans = bound("local", plan, world_size=len(plan), **kwargs)
    assert isinstance(mode, LocalSGDMode)
    return mode, replans


@pytest.mark.parametrize(("lr_scaling", "factor"), [(True, 2 * 3 / 8), (False, 1.0)])
def test_the_learning_rate_is_scaled_by_world_size_times_share_for_the_step_only(
    lr_scaling, factor
):
    mode, _ = _local([3, 5], lr_scaling=lr_scaling)
    mode.share = (3, 8)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    seen = mode.optimizer_step(optimizer, lambda: optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx(0.1 * factor)
    assert optimizer.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize(
    ("lr_scaling", "factor"),
    [("auto", 2 * math.sqrt(3 / 8)), ("sqrt", 2 * math.sqrt(3 / 8)), ("linear", 2 * 3 / 8)],
)
def test_an_adaptive_replica_steps_k_times_the_square_root_of_its_share(lr_scaling, factor):
    # the merge moves the model 1/K of each replica's step: K times an async push's factor
    # (at an even split sqrt(K) times lr; K Adam replicas at lr trailed DDP, issue 32)
    mode, _ = _local([3, 5], lr_scaling=lr_scaling)
    mode.share = (3, 8)
    optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=0.1)
    seen = mode.optimizer_step(optimizer, lambda: optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx(0.1 * factor)
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_replicas_merge_after_each_megabatch_and_replan_with_the_update_counts(group):
    module = torch.nn.Linear(2, 1)
    mode, replans = _local([4], port=group, module=module, megabatch_size=8)
    mode.setup_environment()  # the claim counter in the group's store
    sampler = mode.batch_sampler(EpochPermutation(16), [4], drop_last=False, lower=1)
    mode.on_train_start()
    mode.on_train_epoch_start()
    drawn: list[int] = []
    for batch_idx, batch in enumerate(sampler):
        # read before the step (Throttle does) without consuming the step's tag
        assert mode.step_samples(batch_idx) == mode.step_samples(batch_idx) == len(batch)
        mode.on_train_batch_start(batch_idx)
        drawn += batch
        if batch_idx == 2:  # the first batch of the second mega-batch merged the first
            assert replans == [[2]]
    assert sorted(drawn) == list(range(16))  # every sample once
    assert mode.on_train_epoch_end() is False  # it re-planned at each merge instead
    assert replans == [[2], [2]]
    assert [merge["megabatch"] for merge in mode.merges] == [0, 1]
    assert all(merge["weights"] == [1.0] for merge in mode.merges)


def test_proportional_local_steps_keep_the_batch_sizes_and_refuse_a_controller_that_moves_them():
    from lightning_hetero.planning import StaticController

    mode, _ = _local([4, 4])  # the default: local_steps="proportional"
    assert isinstance(mode.controller, StaticController)  # each rank's steps follow its speed
    mode, _ = _local([4, 4], local_steps="equal")
    assert mode.controller.name == "updates"  # paper 004's controller
    with pytest.raises(ValueError, match="local_steps='proportional' keeps"):
        _local([4, 4], controller="updates")


def test_the_outer_optimizer_moves_the_merged_model_by_nesterov_on_the_pseudo_gradient():
    from lightning_hetero.localsgd import ReplicaMerger

    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(1.0)
    merger = ReplicaMerger(module, rank=0, gamma=0.0, outer_lr=0.5)
    with torch.no_grad():
        module.weight.fill_(0.8)  # the replica's local steps (one rank: the average itself)
    merger.merge([1.0])
    assert module.weight.item() == pytest.approx(1.0 - 0.5 * (0.2 + 0.9 * 0.2))  # 0.81
    with torch.no_grad():
        module.weight.fill_(0.71)
    merger.merge([1.0])
    assert module.weight.item() == pytest.approx(0.81 - 0.5 * (0.1 + 0.9 * 0.28))  # 0.634
