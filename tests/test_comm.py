import pytest
import torch

from lightning_hetero._comm import CudaStepTimer, HostStepTimer


class FakeClockTimer(HostStepTimer):
    def __init__(self, ticks):
        super().__init__()
        self.ticks = iter(ticks)

    def _now(self):
        return next(self.ticks)


def test_compute_runs_until_gradients_are_ready_and_wait_until_backward_ends():
    timer = FakeClockTimer([10.0, 12.5, 13.0])
    timer.start(batch_size=16)
    timer.grads_ready()
    timer.backward_done()
    assert timer.collect() == [(16, 2.5, 0.5)]
    assert timer.collect() == []


def test_step_without_hook_call_counts_as_all_compute():
    timer = FakeClockTimer([1.0, 4.0])
    timer.start(batch_size=8)
    timer.backward_done()
    assert timer.collect() == [(8, 3.0, 0.0)]


def test_backward_without_a_started_step_records_nothing():
    timer = FakeClockTimer([])
    timer.backward_done()
    assert timer.collect() == []


@pytest.mark.gpu
@pytest.mark.skipif(not torch.cuda.is_available(), reason="needs a CUDA device")
def test_cuda_events_measure_device_work():
    timer = CudaStepTimer()
    x = torch.randn(4096, 4096, device="cuda")
    timer.start(batch_size=1)
    for _ in range(10):
        x = x @ x / 4096
    timer.grads_ready()
    timer.backward_done()
    ((batch_size, compute_s, wait_s),) = timer.collect(synchronize=True)
    assert batch_size == 1 and compute_s > 0 and wait_s >= 0
