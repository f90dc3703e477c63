"""The micro-batch benchmark's configuration (its runs are benchmarks, not tests)."""

import pytest

from lightning_hetero.bench.micro import IDEAL, configs, ratio
from lightning_hetero.bench.run import RunConfig
from lightning_hetero.emulate import Throttle
from lightning_hetero.microbatch import converted_accumulation, micro_sizes


def _step_s(throttle, rank, samples, bound):
    """Emulated compute of a step: one backward per micro-batch (loading is not charged)."""
    return sum(throttle.delay_s(rank, 0, m)[1] for m in micro_sizes(samples, bound))


def test_the_pair_is_ddp_with_accumulation_against_one_global_batch_of_micro_batches():
    shared, hetero = configs()
    ddp, het = RunConfig(**shared), RunConfig(**{**shared, **hetero})
    assert ddp.accumulate_grad_batches * ddp.batch_size * ddp.workers == 32
    assert het.accumulate_grad_batches == 1
    assert het.extra == {"global_batch_size": 32, "micro_batch_size": 4}
    # the ideal ratio follows from Throttle's charges: DDP 16 + 16, hetero at best 24 + 8
    throttle = Throttle(ddp.sample_cost, step_cost=ddp.step_cost)
    ddp_step = max(_step_s(throttle, k, 4, 4) * 4 for k in range(2))
    best = max(_step_s(throttle, 0, 24, 4), _step_s(throttle, 1, 8, 4))
    assert ddp_step / best == pytest.approx(IDEAL)
    assert round(IDEAL, 3) == 1.733


def test_the_ratio_is_of_steady_epochs():
    pair = {"ddp": {"epoch_s": [9.0, 9.0, 2.0, 2.0]}, "hetero": {"epoch_s": [5.0, 1.0, 1.0, 1.0]}}
    assert ratio(pair, skip=2) == 2.0


def test_the_unit_scales_every_emulated_cost_and_keeps_the_ideal():
    shared, _ = configs(unit=0.005)
    assert shared["sample_cost"] == pytest.approx([0.005, 0.015])
    assert shared["step_cost"] == pytest.approx(0.005)


@pytest.mark.parametrize(("flags", "sharded"), [([], False), (["--fsdp"], True)])
def test_fsdp_runs_the_pair_sharded(monkeypatch, capsys, flags, sharded):
    from lightning_hetero.bench import micro

    calls = []

    def pair(shared, repeat, folder, hetero_options, sharded):
        calls.append(sharded)
        return {k: {"epoch_s": [1.0] * 3, "batch_sizes": [24, 8]} for k in ("ddp", "hetero")}

    monkeypatch.setattr(micro, "run_pair", pair)
    micro.main(["--repeats", "1", *flags])
    assert calls == [sharded]
    assert ("HeteroFSDPStrategy" in capsys.readouterr().out) is sharded


def test_unchanged_the_hetero_run_is_ddps_program_which_the_strategy_plans_the_same_way():
    shared, hetero = configs(unchanged=True)
    assert hetero == {}  # accumulate_grad_batches=4 and loader batch 4, no hetero option
    assert converted_accumulation(shared["accumulate_grad_batches"], None, None, "uniform") == 4
    # loader batch x accumulation x ranks: the explicit form's global batch
    assert (
        shared["batch_size"] * 4 * shared["workers"] == configs()[1]["extra"]["global_batch_size"]
    )
