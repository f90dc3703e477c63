from types import SimpleNamespace

import pytest
import torch

from lightning_hetero.emulate import Throttle


def test_schedule_uses_the_latest_entry_at_or_before_the_epoch():
    throttle = Throttle({2: [0.1, 0.2], 5: [0.3, 0.4]})
    assert throttle.cost(rank=1, epoch=0) == 0.0
    assert throttle.cost(rank=1, epoch=2) == 0.2
    assert throttle.cost(rank=0, epoch=4) == 0.1
    assert throttle.cost(rank=0, epoch=9) == 0.3


def test_constant_costs_apply_from_the_first_epoch():
    assert Throttle([0.5, 0.25]).cost(rank=1, epoch=0) == 0.25


@pytest.mark.parametrize(
    "bad", [[], {}, [-0.1, 0.2], {-1: [0.1]}, {0: [0.1, 0.2], 3: [0.1]}], ids=str
)
def test_bad_costs_are_refused(bad):
    with pytest.raises(ValueError):
        Throttle(bad)


def test_rank_without_a_cost_is_refused():
    with pytest.raises(ValueError, match="rank 2"):
        Throttle([0.1, 0.2]).cost(rank=2, epoch=0)


def test_bad_unit_is_refused():
    with pytest.raises(ValueError, match="'epoch' or 'step'"):
        Throttle([0.1], unit="batch")


@pytest.mark.parametrize(("unit", "expected"), [("epoch", [0, 0, 0]), ("step", [0, 0.5, 0.5])])
def test_schedule_keys_count_epochs_or_global_steps(monkeypatch, unit, expected):
    throttle = Throttle({0: [0.0], 7: [0.05]}, unit=unit)
    delays = []
    for step in (6, 7, 8):  # all in epoch 0, ten samples per batch
        slept = []
        monkeypatch.setattr("lightning_hetero.emulate.time.sleep", slept.append)
        trainer = SimpleNamespace(global_rank=0, current_epoch=0, global_step=step)
        throttle.on_train_batch_start(trainer, None, torch.zeros(10, 3), 0)
        throttle.on_before_backward(trainer, None, None)
        delays.append(sum(slept))
    assert delays == pytest.approx(expected)
