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
    assert timer.collect() == [(16, 2.5, 0.5, False, 0, ())]
    assert timer.collect() == []


def test_step_without_hook_call_counts_as_all_compute():
    timer = FakeClockTimer([1.0, 4.0])
    timer.start(batch_size=8)
    timer.backward_done()
    assert timer.collect() == [(8, 3.0, 0.0, False, 0, ())]


def test_backward_without_a_started_step_records_nothing():
    timer = FakeClockTimer([])
    timer.backward_done()
    assert timer.collect() == []


def test_every_backward_and_the_optimizer_step_are_timed_and_only_all_reduces_wait():
    # manual optimization: two backwards, each with an all-reduce, then an optimizer step
    timer = FakeClockTimer([0.0, 1.0, 1.5, 3.5, 4.0, 4.25])
    timer.start(batch_size=4)
    timer.grads_ready()  # 1.0
    timer.backward_done()  # 1.5: waited 0.5
    timer.grads_ready()  # 3.5: the second backward took 2.0 of compute
    timer.backward_done()  # 4.0: waited 0.5
    timer.step_done()  # 4.25
    assert timer.collect() == [(4, 3.25, 1.0, False, 0, ())]


def test_a_step_after_the_first_runs_from_the_previous_steps_end_so_loading_is_its_cost():
    # step 1: 0 - 1; then 1 - 4 on the training thread (loop, fetching and collating the
    # next batch with num_workers=0) before step 2's batch is on the device at 4
    timer = FakeClockTimer([0.0, 1.0, 4.0, 5.0, 5.5])
    timer.start(batch_size=8)  # 0.0
    timer.step_done()  # 1.0
    timer.start(batch_size=8)  # 4.0, its arrival: the cycle began at 1.0
    timer.grads_ready()  # 5.0
    timer.backward_done()  # 5.5: waited 0.5 for the other ranks
    assert timer.collect() == [(8, 1.0, 0.0, False, 0, ()), (8, 4.0, 0.5, True, 0, ())]


def test_waits_after_a_steps_end_belong_to_the_next_cycle():
    timer = FakeClockTimer([0.0, 1.0, 2.0, 2.5, 3.0, 9.0, 9.5, 10.0, 12.0])
    timer.start(batch_size=2)
    with timer.waiting():  # 1.0 - 2.0: a sync_dist log in training_step
        pass
    timer.backward_done()  # 2.5, no hook call: compute
    timer.step_done()  # 3.0
    with timer.waiting():  # 9.0 - 9.5: after the step's end (e.g. on_train_batch_end)
        pass
    timer.start(batch_size=2)  # 10.0, its arrival: the next cycle began at 3.0
    timer.step_done()  # 12.0
    assert timer.collect() == [(2, 2.0, 1.0, False, 0, ()), (2, 8.5, 0.5, True, 0, ())]


def test_a_wait_inside_another_counts_once():
    # a sync_dist reduction (timed as waiting) whose collective the FSDP meter also times
    timer = FakeClockTimer([0.0, 1.0, 3.0, 4.0])
    timer.start(batch_size=2)
    with timer.waiting(), timer.waiting():  # 1.0 - 3.0; the inner block reads no clock
        pass
    timer.step_done()  # 4.0
    assert timer.collect() == [(2, 2.0, 2.0, False, 0, ())]


def test_a_break_makes_the_next_step_start_at_its_batch():
    # validation (or a new epoch) between two steps is not the second step's cost
    timer = FakeClockTimer([0.0, 1.0, 7.0, 7.5, 8.0])
    timer.start(batch_size=3)
    timer.step_done()  # 1.0
    timer.break_cycle()
    with timer.waiting():  # no cycle: not read, not counted
        pass
    timer.start(batch_size=3)  # 7.0
    timer.step_done()  # 7.5
    assert timer.collect() == [(3, 1.0, 0.0, False, 0, ()), (3, 0.5, 0.0, False, 0, ())]


def test_a_step_is_closed_by_the_next_start_and_unmarked_steps_record_nothing():
    timer = FakeClockTimer([0.0, 1.0, 2.0, 5.0, 7.0])
    timer.start(batch_size=3)
    timer.backward_done()  # 1.0
    timer.start(batch_size=5)  # 2.0, its arrival: the cycle began at 1.0
    timer.start(batch_size=6)  # 5.0: the second had no backward, so no cycle to continue
    timer.finish()
    assert timer.collect() == [(3, 1.0, 0.0, False, 0, ())]


def test_marks_outside_a_step_are_ignored():
    timer = FakeClockTimer([])
    timer.grads_ready()
    timer.step_done()
    with timer.waiting():
        pass
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
    for _ in range(10):  # work after the backward, e.g. the optimizer step
        x = x @ x / 4096
    timer.step_done()
    ((batch_size, compute_s, wait_s, *_),) = timer.collect(synchronize=True)
    assert batch_size == 1 and compute_s > 0 and wait_s >= 0


def test_each_micro_batch_is_timed_from_the_arrival_or_the_backward_before_less_its_waits():
    # a share of 10 as micro-batches of 4, 3, 3: loading 1.0 before the batch arrives, each
    # backward told its samples; only the last all-reduces (waits 0.5), then the optimizer
    timer = FakeClockTimer([0.0, 1.0, 2.0, 4.0, 6.0, 7.0, 7.5, 8.0, 9.0, 11.0, 11.5])
    timer.start(batch_size=10)  # 0.0: the first step (its arrival too)
    timer.backward_done(10)  # 1.0
    timer.step_done()  # 2.0
    timer.start(batch_size=10)  # 4.0: arrival; the cycle began at 2.0 (2.0 of loading)
    timer.backward_done(4)  # 6.0
    timer.backward_done(3)  # 7.0
    with timer.waiting():  # 7.5 - 8.0: a wait inside the last micro-batch
        pass
    timer.grads_ready()  # 9.0
    timer.backward_done(3)  # 11.0: 2.0 of all-reduce
    timer.step_done()  # 11.5
    first, second = timer.collect()
    assert first.micro == ()  # one backward: no micro-batches
    assert second[:5] == (10, 7.0, 2.5, True, 0)
    assert second.micro == ((4, 2.0), (3, 1.0), (3, 1.5))


def test_backwards_that_are_not_the_batchs_micro_batches_give_no_micro_timings():
    # two backwards of the whole batch (manual optimization), and backwards without samples
    timer = FakeClockTimer([0.0, 1.0, 2.0, 3.0, 4.0, 5.0, 6.0])
    timer.start(batch_size=4)
    timer.backward_done(4)
    timer.backward_done(4)
    timer.step_done()
    timer.start(batch_size=4)
    timer.backward_done()
    timer.backward_done()
    (whole, unknown) = timer.collect()
    assert whole.micro == () and unknown.micro == ()


def test_a_fit_with_micro_batches_hands_each_micro_batch_to_the_timer(tmp_path, monkeypatch):
    # one process, a share of 16 in micro-batches of 4: every step records four micro-batches
    import lightning.pytorch as pl
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_hetero import HeteroStrategy

    records = []
    collect = HostStepTimer.collect

    def spy(self, synchronize=False):
        out = collect(self, synchronize)
        records.extend(out)
        return out

    monkeypatch.setattr(HostStepTimer, "collect", spy)

    class Tiny(pl.LightningModule):
        def __init__(self):
            super().__init__()
            self.net = torch.nn.Linear(4, 1)

        def training_step(self, batch, batch_idx):
            return self.net(batch[0]).pow(2).mean()

        def configure_optimizers(self):
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self):
            return DataLoader(TensorDataset(torch.randn(96, 4)), batch_size=16)

    trainer = pl.Trainer(
        strategy=HeteroStrategy(controller="static", micro_batch_size=4),
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(Tiny())
    assert len(records) == 6
    for record in records:
        assert [n for n, _ in record.micro] == [4, 4, 4, 4]
        assert all(t > 0 for _, t in record.micro)
        assert sum(t for _, t in record.micro) <= record.compute_s
