"""SynchronousMode (``mode="bsp"``) on a real run context."""

import pytest
import torch
from torch.nn.parallel import DistributedDataParallel

from lightning_hetero._comm import HostStepTimer
from lightning_hetero.modes.bsp import SynchronousMode
from lightning_hetero.sampler import EpochPermutation

from .conftest import bound


def _drawing(samples: int, plan: list[int], **options) -> SynchronousMode:
    mode, _ = bound("bsp", plan, world_size=len(plan), **options)
    assert isinstance(mode, SynchronousMode)
    mode.batch_sampler(EpochPermutation(samples, shuffle=False), plan, drop_last=False, lower=1)
    return mode


def test_rank_ks_loss_is_scaled_by_world_size_times_its_share_so_ddps_mean_weighs_b_k_over_b():
    mode = _drawing(16, [3, 5])
    mode.on_train_batch_start(0)
    assert mode.share == (3, 8)
    given = []
    mode.backward(torch.tensor(2.0), given.append)
    assert given[0].item() == pytest.approx(2.0 * 2 * 3 / 8)


def test_weighted_false_runs_backward_on_the_loss_as_it_is():
    mode = _drawing(16, [3, 5], weighted=False)
    mode.on_train_batch_start(0)
    loss, given = torch.tensor(2.0), []
    mode.backward(loss, given.append)
    assert given == [loss] and given[0] is loss


def test_a_plan_change_takes_effect_at_the_step_given_and_the_share_follows_it():
    mode = _drawing(24, [3, 5])
    mode.apply_plan([6, 2], from_step=1)
    shares = []
    for batch_idx in range(3):
        mode.on_train_batch_start(batch_idx)
        shares.append(mode.share)
    assert shares == [(3, 8), (6, 8), (6, 8)]


def test_only_steps_that_run_the_plan_are_timed_not_an_epochs_short_last_one():
    mode = _drawing(20, [3, 5])  # two steps of 8, then one of the 4 samples left
    timer = mode.ctx.timer
    for batch_idx in range(3):
        mode.on_train_batch_start(batch_idx)
        mode.post_backward()
        mode.optimizer_step(torch.optim.SGD([torch.zeros(1)], lr=0.1), lambda: None)
    assert mode.share != (3, 8)  # the last step's own layout
    assert [record.batch_size for record in timer.collect()] == [3, 3]


class _CountingTimer(HostStepTimer):
    def __init__(self) -> None:
        super().__init__()
        self.ready_calls = 0

    def grads_ready(self) -> None:
        self.ready_calls += 1
        super().grads_ready()


def test_each_parameters_accumulated_gradient_marks_ready_until_teardown_removes_the_hooks(
    group,
):
    timer = _CountingTimer()
    mode, _ = bound("bsp", [4], timer=timer, port=group)
    model = DistributedDataParallel(torch.nn.Linear(4, 1))
    mode.register_hooks(model)
    model(torch.randn(2, 4)).sum().backward()
    assert timer.ready_calls == 2  # weight and bias
    mode.teardown()
    model(torch.randn(2, 4)).sum().backward()
    assert timer.ready_calls == 2
