"""Micro-batches under HeteroFSDPStrategy on one process: FSDP2's switches held from a
step's first micro-batch to its last, restored after, and the step exact."""

from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.demos.boring_classes import BoringModel

from lightning_hetero import HeteroFSDPStrategy
from lightning_hetero._fsdp import fsdp_param_groups
from lightning_hetero._fsdp_accumulate import HELD, SWITCHES

BATCH, BOUND = 8, 3  # one step of 8 samples as micro-batches of 3, 3 and 2


def _initial() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(32, 8), torch.nn.Tanh(), torch.nn.Linear(8, 2))


def _switches(module: torch.nn.Module) -> list[dict]:
    return [{name: getattr(g, name) for name in SWITCHES} for g in fsdp_param_groups(module)]


class _Stop(Exception):
    pass


class _Deep(BoringModel):
    def __init__(self, fail_at: int | None = None) -> None:
        super().__init__()
        self.layer = _initial()
        self.fail_at = fail_at
        self.seen: list[int] = []
        self.switches: list[list[dict]] = []  # at each micro-batch's forward

    def training_step(self, batch, batch_idx):
        self.seen.append(len(batch))
        if len(self.seen) == self.fail_at:
            raise _Stop
        self.switches.append(_switches(self))
        return self.layer(batch).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        data = torch.randn(BATCH, 32, generator=torch.Generator().manual_seed(1))
        return torch.utils.data.DataLoader(data, batch_size=BATCH)


def _fit(model: _Deep, **options: Any) -> HeteroFSDPStrategy:
    strategy = HeteroFSDPStrategy(shard_modules=["Linear"], **options)
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model)
    return strategy


def test_the_switches_are_held_until_the_last_micro_batch_and_the_step_is_exact():
    model = _Deep()
    _fit(model, micro_batch_size=BOUND)
    assert model.seen == [3, 3, 2]
    held = [HELD] * 2  # both Linear units
    own = model.switches[-1]  # the last micro-batch runs with each unit's own values
    assert model.switches[:2] == [held, held] and own != held
    assert all(s["reduce_grads"] and s["post_forward_mesh_info"] is not None for s in own)
    assert _switches(model) == own  # and the step leaves them so
    expected = _initial()
    data = next(iter(model.train_dataloader()))
    expected(data).pow(2).mean().backward()
    with torch.no_grad():
        for param in expected.parameters():
            param -= 0.1 * param.grad
    for name, value in expected.state_dict().items():
        got = model.layer.state_dict()[name].full_tensor()
        torch.testing.assert_close(got, value, atol=1e-6, rtol=0, msg=name)


def test_a_failed_micro_batch_restores_the_switches_and_reshards():
    model = _Deep(fail_at=2)  # the second micro-batch raises, the units held gathered
    with pytest.raises(_Stop):
        _fit(model, micro_batch_size=BOUND)
    groups = fsdp_param_groups(model)
    assert model.switches == [[HELD] * 2]
    assert all(s["reduce_grads"] for s in _switches(model))
    assert all(group.is_sharded for group in groups)


def _probing_fit(model: _Deep, **options: Any) -> HeteroFSDPStrategy:
    return _fit(model, probe_batch_sizes=[2, 4], **options)


def test_auto_probes_each_size_as_two_micro_batches_held_as_in_training():
    """``micro_batch_size="auto"``: each probed size runs as two micro-batches, the first
    with every unit held gathered, the last with the units' own switches (the collectives
    of one ordinary step); the bound found becomes the micro-batch bound."""
    model = _Deep()
    strategy = _probing_fit(model, micro_batch_size="auto")
    probe = strategy.memory_probe
    assert probe["micro_batches"] == 2 and [s for s, _ in probe["samples"]] == [2, 4]
    assert model.seen[:4] == [2, 2, 4, 4]  # the probe's micro-batches, then training's
    held, own = [HELD] * 2, model.switches[-1]
    assert model.switches[:4] == [held, own, held, own] and own != held
    assert _switches(model) == own
    assert all(group.is_sharded for group in fsdp_param_groups(model))
    assert strategy.micro_bounds == probe["max_batch_sizes"] == [BATCH]  # the host holds 8
    assert strategy.plan_state.measured_max is None  # the share stays unbounded


def test_max_batch_size_auto_alone_still_probes_ordinary_steps():
    model = _Deep()
    strategy = _probing_fit(model, max_batch_size="auto")
    assert strategy.memory_probe["micro_batches"] == 1
    assert model.seen[:2] == [2, 4] and model.switches[0] == model.switches[-1] != [HELD] * 2
    assert strategy.micro_bounds is None


def test_a_failed_held_probe_step_restores_the_switches_and_reshards():
    model = _Deep(fail_at=2)  # the probe's second micro-batch raises, the units held gathered
    with pytest.raises(_Stop):
        _probing_fit(model, micro_batch_size="auto")
    assert model.switches == [[HELD] * 2]
    assert all(s["reduce_grads"] for s in _switches(model))
    assert all(group.is_sharded for group in fsdp_param_groups(model))


def test_auto_refuses_on_every_rank_when_a_rank_cannot_hold_the_gathered_model(monkeypatch):
    """A budget too small for one held micro-batch: the rank joins the gather of the bounds
    with none (the others would wait for it there), and the refusal says what to give."""
    from lightning_hetero import memory_probe
    from lightning_hetero.collectives import Collectives
    from lightning_hetero.planning import PlanError

    # host RSS is too rough for a robust "does not fit": fix the fit, keep the real steps
    fitted = memory_probe.MemoryModel(fixed_bytes=1000.0, per_sample_bytes=100.0)
    monkeypatch.setattr(memory_probe.MemoryModel, "fit", classmethod(lambda cls, s: fitted))
    monkeypatch.setattr(memory_probe, "host_budget_bytes", lambda: 900.0)
    gathered = []
    original = Collectives.gather_rows

    def gather_rows(self, values):
        gathered.append(list(values))
        return original(self, values)

    monkeypatch.setattr(Collectives, "gather_rows", gather_rows)
    model = _Deep()
    message = (
        r"micro_batch_size='auto'.*no batch size that fits on rank\(s\) \[0\]"
        r".*Not even a batch of 1.*gathered.*as ints.*max_batch_size"
    )
    with pytest.raises(PlanError, match=message):
        _probing_fit(model, micro_batch_size="auto")
    assert model.seen == [2, 2, 4, 4]  # both sizes ran (held) before the fit was refused
    assert gathered == [[0, 0.0, 0.0]]  # this rank's bound: none
    assert all(group.is_sharded for group in fsdp_param_groups(model))
