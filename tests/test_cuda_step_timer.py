"""CudaStepTimer's cost on the step path, counted with fake CUDA events (no GPU needed).

Each test drives the timer as a training loop does (start, one gradients-ready call per
parameter, backward end, optimizer step end, collect) on a fake device clock, and counts
what a GPU would pay for: events created, event records, synchronisations. The same loop on
a ``HostStepTimer`` reading the same clock gives the times the CUDA timer must reproduce.
"""

import math
from typing import Any

import pytest
import torch

from lightning_hetero._comm import CudaStepTimer, HostStepTimer


class FakeDevice:
    """A device clock and its counters; events complete once ``done_until`` reaches them."""

    def __init__(self) -> None:
        self.now = 0.0
        self.done_until = math.inf
        self.created = self.records = self.syncs = 0

    def event(self, **kwargs: Any) -> "FakeEvent":
        assert kwargs in ({}, {"enable_timing": True})
        self.created += 1
        return FakeEvent(self)


class FakeEvent:
    def __init__(self, device: FakeDevice) -> None:
        self.device, self.time = device, None

    def record(self, stream: Any = None) -> None:
        self.device.records += 1
        self.time = self.device.now

    def query(self) -> bool:
        return self.time is not None and self.time <= self.device.done_until

    def synchronize(self) -> None:
        self.device.syncs += 1
        self.device.done_until = max(self.device.done_until, self.time)

    def elapsed_time(self, end: "FakeEvent") -> float:
        assert self.query() and end.query(), "an event read before it completed"
        return (end.time - self.time) * 1e3


class HostOnClock(HostStepTimer):
    def __init__(self, device: FakeDevice) -> None:
        super().__init__()
        self.device = device

    def _now(self) -> float:
        return self.device.now


def train(timer: HostStepTimer, device: FakeDevice, steps: int, **kwargs: Any) -> list:
    """``steps`` training steps; returns every record collected."""
    params = kwargs.get("params", 20)
    collect_every = kwargs.get("collect_every", 1)
    lag = kwargs.get("lag", 0.0)  # how far the device runs behind the host
    calls_at = kwargs.get("calls_at", {})  # step -> hook calls in its backward
    micro = kwargs.get("micro", 1)  # backwards a step (micro-batches of 16 / micro samples)
    records = []
    for step in range(steps):
        device.done_until = device.now - lag
        device.now += 0.5 + 0.01 * (step % 7)  # loading the batch
        timer.start(16)
        for _ in range(micro):
            device.now += 2.0 + 0.1 * (step % 3)  # forward
            for _ in range(calls_at.get(step, params)):
                device.now += 0.05  # one parameter's gradient
                timer.grads_ready()
            device.now += 1.0 + 0.2 * (step % 5)  # the all-reduce and waiting for the others
            timer.backward_done(16 // micro if micro > 1 else None)
        device.now += 0.3  # the optimizer step
        timer.step_done()
        if step % 10 == 9:
            with timer.waiting():  # a synced log inside the cycle; a report collects in it
                device.now += 0.2
                records += timer.collect()
        if (step + 1) % collect_every == 0:
            records += timer.collect()
    device.done_until = device.now
    return records + timer.collect()


def runs(steps: int = 200, **kwargs: Any) -> tuple[list, list, FakeDevice, CudaStepTimer]:
    device, host_device = FakeDevice(), FakeDevice()
    timer = CudaStepTimer(event_factory=device.event)
    cuda_records = train(timer, device, steps, **kwargs)
    host_records = train(HostOnClock(host_device), host_device, steps, **kwargs)
    return cuda_records, host_records, device, timer


def assert_same(cuda_records: list, host_records: list) -> None:
    assert len(cuda_records) == len(host_records) > 0
    for got, want in zip(cuda_records, host_records):
        assert got.batch_size == want.batch_size and got.full == want.full
        assert got.compute_s == pytest.approx(want.compute_s, abs=1e-9)
        assert got.wait_s == pytest.approx(want.wait_s, abs=1e-9)
        assert len(got.micro) == len(want.micro)
        for (n, t), (m, u) in zip(got.micro, want.micro):
            assert n == m and t == pytest.approx(u, abs=1e-9)


@pytest.mark.parametrize("micro", [1, 4])
def test_cuda_timer_gives_the_host_timers_times_on_the_same_clock(micro: int) -> None:
    cuda_records, host_records, _, _ = runs(micro=micro, lag=7.0)
    assert_same(cuda_records, host_records)
    assert all(len(r.micro) == (micro if micro > 1 else 0) for r in cuda_records)
    assert all(r.wait_s > 0.9 for r in cuda_records)  # the all-reduce is a wait, not compute


@pytest.mark.parametrize("collect_every", [1, 10])
def test_events_come_from_a_pool_whose_size_does_not_grow_with_the_steps(
    collect_every: int,
) -> None:
    _, _, short, _ = runs(100, collect_every=collect_every)
    _, _, long, timer = runs(400, collect_every=collect_every)
    assert long.created == short.created == timer.events_created
    assert long.created <= 6 * collect_every + 6  # a few per step not yet read, at most


def test_one_event_per_backward_marks_the_gradients_ready_not_one_per_parameter() -> None:
    _, _, device, _ = runs(1, params=20)
    first = device.records  # the first backward records at every call: it learns the count
    _, _, device, _ = runs(101, params=20)
    # each later step: its batch's arrival, gradients ready, backward end, optimizer step end
    # (every tenth step also a waiting block's two)
    assert device.records - first == 100 * 4 + 10 * 2


def test_the_step_path_never_synchronizes_and_a_boundary_waits_once_per_unfinished_step() -> None:
    device = FakeDevice()
    timer = CudaStepTimer(event_factory=device.event)
    for _ in range(50):
        device.done_until = device.now - 10.0  # the device runs well behind the host
        timer.start(8)
        device.now += 1.0
        timer.grads_ready()
        device.now += 1.0
        timer.backward_done()
        timer.step_done()
        timer.collect()
    assert device.syncs == 0
    pending = len(timer._pending)
    assert pending > 0
    assert len(timer.collect(synchronize=True)) == pending
    assert device.syncs == pending


def test_an_event_is_recorded_again_only_after_every_step_using_it_was_read() -> None:
    # the device lags three steps behind: pending steps hold their events meanwhile (a
    # re-recorded one would change their times, and reading it early fails the fake)
    cuda_records, host_records, _, _ = runs(120, lag=12.0)
    assert_same(cuda_records, host_records)


def test_a_backward_with_fewer_hook_calls_counts_as_compute_once_then_is_learned() -> None:
    # step 5 leaves half the parameters unused; from step 6 on the timer records from the
    # tenth call, so full backwards (their last call still records) and short ones agree
    calls_at = {5: 10, 8: 10}
    cuda_records, host_records, _, _ = runs(20, calls_at=calls_at)
    step5 = cuda_records[5]
    assert step5.wait_s == 0.0  # its gradients-ready mark was not recorded: all compute
    assert step5.compute_s == pytest.approx(host_records[5].compute_s + host_records[5].wait_s)
    del cuda_records[5], host_records[5]
    assert_same(cuda_records, host_records)


def test_the_default_events_are_torch_cuda_events_with_timing(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    device = FakeDevice()
    monkeypatch.setattr(torch.cuda, "Event", device.event)
    timer = CudaStepTimer()
    timer.start(4)
    timer.grads_ready()
    device.now = 1.0
    timer.backward_done()
    (record,) = timer.collect()
    assert device.created == timer.events_created == 3
    assert record.wait_s == pytest.approx(1.0)
