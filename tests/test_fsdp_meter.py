"""CollectiveWaitMeter on stand-ins for FSDP2's parameter groups (no process group needed)."""

import time

import pytest
import torch
from torch import nn

from lightning_hetero._fsdp import CollectiveWaitMeter, FSDPWaitMeterWarning


class _Group:
    """An FSDP2 parameter group as the meter sees it: the methods that wait for other ranks."""

    device = torch.device("cpu")

    def unshard(self, async_op=False):
        time.sleep(0.02)

    def wait_for_unshard(self):
        time.sleep(0.01)

    def post_backward(self):
        raise ValueError("FSDP's own error")

    def finalize_backward(self):
        pass


class _Sharded(nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.group = _Group()

    def _get_fsdp_state(self):
        return type("State", (), {"_fsdp_param_groups": [self.group]})()


def test_time_blocked_in_the_groups_waits_is_measured_and_taken_once():
    module = _Sharded()
    meter = CollectiveWaitMeter(clock="host").install(module)
    module.group.unshard()
    module.group.wait_for_unshard()
    with pytest.raises(ValueError, match="FSDP's own error"):  # FSDP's errors pass through
        module.group.post_backward()
    waited = meter.take()
    assert 0.03 <= waited < 0.5
    assert meter.take() == 0.0  # taken: the next step starts from nothing
    meter.remove()
    assert "unshard" not in vars(module.group)  # FSDP's own methods are back


def test_a_module_without_fsdp_state_warns_and_measures_no_wait():
    with pytest.warns(FSDPWaitMeterWarning):
        meter = CollectiveWaitMeter(clock="host").install(nn.Linear(2, 2))
    assert meter.take() == 0.0
