"""The micro-batch benchmark's configuration (its runs are benchmarks, not tests)."""

import pytest

from lightning_hetero.bench.__main__ import cluster_costs
from lightning_hetero.bench.micro import CLUSTERS, MicroCluster, configs, ideal, ratio
from lightning_hetero.bench.run import RunConfig
from lightning_hetero.emulate import Throttle
from lightning_hetero.microbatch import converted_accumulation, micro_sizes
from lightning_hetero.planning import HETEROGENEITY_LEVELS


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
    assert ddp_step / best == pytest.approx(ideal(CLUSTERS["3to1"]))
    assert round(ideal(CLUSTERS["3to1"]), 3) == 1.733


def test_the_hl4_pair_is_four_ranks_holding_2_samples_with_accumulation_8():
    shared, hetero = configs(cluster="hl4")
    ddp, het = RunConfig(**shared), RunConfig(**{**shared, **hetero})
    assert (ddp.workers, ddp.batch_size, ddp.accumulate_grad_batches) == (4, 2, 8)
    assert het.accumulate_grad_batches == 1
    assert het.extra == {"global_batch_size": 64, "micro_batch_size": 2}
    # the level benchmark's HL4 costs (--base-cost 0.048) at the default 1 ms unit
    level = cluster_costs("devices", HETEROGENEITY_LEVELS["HL4"], 0.048, 2)["sample_cost"]
    assert ddp.sample_cost == pytest.approx(level)
    assert ddp.step_cost == pytest.approx(0.001)


def test_the_hl4_ideal_is_ddps_step_over_the_best_integer_plan_under_throttles_charges():
    shared, _ = configs(cluster="hl4")
    throttle = Throttle(shared["sample_cost"], step_cost=shared["step_cost"])
    steps = [[_step_s(throttle, k, b, 2) for b in range(65)] for k in range(4)]
    ddp_step = max(_step_s(throttle, k, 2, 2) * 8 for k in range(4))  # the 6-core rank's
    assert ddp_step == pytest.approx(8 * (2 * 0.008 + 0.001))
    best = max(steps[k][b] for k, b in enumerate([13, 13, 8, 30]))
    # no plan is faster: below `best` the ranks together fit fewer than 64 samples
    fits = [max(b for b in range(65) if steps[k][b] < best - 1e-12) for k in range(4)]
    assert sum(fits) < 64
    assert ddp_step / best == pytest.approx(ideal(CLUSTERS["hl4"]))
    assert round(ideal(CLUSTERS["hl4"]), 3) == 1.782


def test_the_ideal_is_of_integer_plans_and_counts_the_fixed_cost_per_micro_batch():
    # 6 samples at 2 and 3 units per sample plus 1 per micro-batch of 1: DDP 3 x 3 = 9; the
    # continuous optimum 7.2 needs 3.6 samples on rank 0, the best integer plan 4/2 takes 8
    assert ideal(MicroCluster((1.0, 2.0), micro=1, accumulate=3)) == pytest.approx(9 / 8)
    assert ideal(MicroCluster((1.0, 2.0), micro=1, accumulate=3, micro_cost=0.0)) == 1.5
    assert ideal(MicroCluster((2.0, 2.0, 2.0), micro=2, accumulate=4)) == 1.0


def test_the_ratio_is_of_steady_epochs():
    pair = {"ddp": {"epoch_s": [9.0, 9.0, 2.0, 2.0]}, "hetero": {"epoch_s": [5.0, 1.0, 1.0, 1.0]}}
    assert ratio(pair, skip=2) == 2.0


def test_a_run_no_longer_than_the_skip_reports_its_last_epoch():
    pair = {"ddp": {"epoch_s": [9.0, 3.0]}, "hetero": {"epoch_s": [5.0, 2.0]}}
    assert ratio(pair, skip=2) == 1.5


def test_the_unit_scales_every_emulated_cost_and_keeps_the_ideal():
    shared, _ = configs(unit=0.005)
    assert shared["sample_cost"] == pytest.approx([0.005, 0.015])
    assert shared["step_cost"] == pytest.approx(0.005)
    shared, _ = configs(unit=0.005, cluster="hl4")
    assert shared["sample_cost"] == pytest.approx([0.24 / c for c in (9, 9, 6, 24)])
    assert shared["step_cost"] == pytest.approx(0.005)


@pytest.mark.parametrize(
    ("flags", "sharded", "workers", "says"),
    [
        ([], False, 2, "3to1: DDP"),
        (["--fsdp"], True, 2, "3to1: FSDP2"),
        (["--cluster", "hl4"], False, 4, "hl4: DDP"),
        (["--cluster", "hl4", "--fsdp"], True, 4, "hl4: FSDP2"),
    ],
)
def test_main_runs_the_chosen_cluster_and_strategies(
    monkeypatch, capsys, flags, sharded, workers, says
):
    from lightning_hetero.bench import micro

    calls = []

    def pair(shared, repeat, folder, hetero_options, sharded):
        calls.append((shared["workers"], sharded))
        return {k: {"epoch_s": [1.0] * 3, "batch_sizes": [24, 8]} for k in ("ddp", "hetero")}

    monkeypatch.setattr(micro, "run_pair", pair)
    micro.main(["--repeats", "1", *flags])
    assert calls == [(workers, sharded)]
    out = capsys.readouterr().out
    assert says in out
    assert ("HeteroFSDPStrategy" in out) is sharded
    assert f"ideal {ideal(CLUSTERS['hl4' if workers == 4 else '3to1']):.2f}x" in out


@pytest.mark.parametrize(
    ("cluster", "accumulate", "global_batch"), [("3to1", 4, 32), ("hl4", 8, 64)]
)
def test_unchanged_the_hetero_run_is_ddps_program_which_the_strategy_plans_the_same_way(
    cluster, accumulate, global_batch
):
    shared, hetero = configs(unchanged=True, cluster=cluster)
    assert hetero == {}  # DDP's accumulation and loader batch, no hetero option
    assert shared["accumulate_grad_batches"] == accumulate
    assert converted_accumulation(accumulate, None, None, "uniform") == accumulate
    # loader batch x accumulation x ranks: the explicit form's global batch
    assert shared["batch_size"] * accumulate * shared["workers"] == global_batch
    assert configs(cluster=cluster)[1]["extra"]["global_batch_size"] == global_batch
