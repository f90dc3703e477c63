"""ShardedMode (``HeteroFSDPStrategy(mode="bsp")``) on a real run context."""

import pytest
import torch
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard

from lightning_hetero.fsdp import FSDP_MODES
from lightning_hetero.modes.sharded import ShardedMode, norm_buffers

from .conftest import bound


class _Net(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 2)
        self.norm = torch.nn.BatchNorm1d(2)

    def step(self, x: torch.Tensor) -> torch.Tensor:
        return self.norm(self.layer(x)).sum()  # as a training step: submodules, not self(x)


def _sharded(plan: list[int], **kwargs) -> ShardedMode:
    mode, _ = bound("bsp", plan, world_size=len(plan), modes=FSDP_MODES, **kwargs)
    assert isinstance(mode, ShardedMode)
    return mode


def test_a_step_method_runs_inside_the_sharded_roots_forward_so_its_parameters_are_gathered(
    group,
):
    root = fully_shard(_Net(), mesh=init_device_mesh("cpu", (1,)))
    x = torch.randn(3, 4)
    with pytest.raises(Exception, match="DTensor"):
        root.step(x)  # outside the root's forward its parameters stay sharded
    mode = _sharded([3], port=group)
    loss = mode.redirect(root, "step", x)
    loss.backward()
    assert root.layer.weight.grad is not None
    assert "forward" not in vars(root)  # the replaced forward is undone


def test_rank_ks_loss_is_scaled_by_world_size_times_its_share_before_the_reduce_scatter():
    mode = _sharded([3, 5])
    mode.share = (3, 8)  # rank 0's batch of the step
    given = []
    mode.backward(torch.tensor(2.0), given.append)
    assert given[0].item() == pytest.approx(2.0 * 2 * 3 / 8)


def test_the_statistics_averaged_over_ranks_are_the_norm_layers_floating_point_buffers():
    net = _Net()
    buffers = norm_buffers(net)
    # not the integer batch count, nor any buffer of another layer
    assert len(buffers) == 2
    assert buffers[0] is net.norm.running_mean and buffers[1] is net.norm.running_var


def test_one_rank_keeps_its_own_statistics_without_communicating():
    net = _Net()
    net.norm.running_mean.fill_(3.0)
    mode = _sharded([4], module=net)  # no process group: a collective would fail
    assert mode.on_train_epoch_end() is True  # the re-planner's epoch boundary follows
    assert torch.equal(net.norm.running_mean, torch.full((2,), 3.0))
