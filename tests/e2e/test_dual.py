"""Dual batch size learning on 4 gloo ranks in async mode, launched as a user would."""

import math

import pytest

from tests.e2e.launch import run_training


def test_dual_plan_runs_each_rank_on_its_batch_and_share(tmp_path):
    summary = run_training(
        tmp_path,
        workers=4,
        epochs=2,
        batch_size=32,
        # per-sample time dominates: a clean linear time fit; ranks 0 and 2 three times slower
        sample_cost=[0.003, 0.001, 0.003, 0.001],
        controller="dual",
        controller_options={"small_workers": 2, "extra_time_ratio": 1.1},
        extra={"mode": "async"},
    )
    plan = summary["dual_plan"]
    assert plan["small_ranks"] == [0, 2]  # the slow ranks, by the time probe
    sizes = plan["batch_sizes"]
    assert sizes[1] == sizes[3] == 32  # the loader's batch size is B_L by default
    assert sizes[0] == sizes[2] and 1 <= sizes[0] < 32
    samples = plan["samples"]
    assert sum(samples) == 1438  # the digits training set, each sample once per epoch
    assert samples[1] + samples[3] > 1438 / 2  # the fast ranks train more than DDP's half
    assert plan["predicted_epoch_s"] <= plan["ddp_epoch_s"]  # never slower than DDP's epoch
    # by default each push is its batch share of DDP's step (4 ranks at B_L = 32)
    assert plan["update_factors"] == pytest.approx([b / 128 for b in plan["batch_sizes"]])
    steps = [math.ceil(n / b) for n, b in zip(samples, plan["batch_sizes"])]
    for entry in summary["history"]:  # the server counted each rank's pushes per epoch
        assert entry["updates"] == steps
        assert entry["batch_sizes"] == plan["batch_sizes"]
    assert summary["metrics"]["val_acc"] > 0.3  # chance is 0.1


def test_hybrid_scheme_replans_both_batches_per_resolution_and_keeps_the_data_split(tmp_path):
    summary = run_training(
        tmp_path,
        workers=4,
        epochs=3,
        batch_size=32,
        sample_cost=[0.001] * 4,
        controller="dual",
        controller_options={"small_workers": 2, "extra_time_ratio": 1.1},
        extra={"mode": "async"},
        progressive=[
            {
                "lr": 0.05,
                "substages": [
                    {"epochs": 1, "resolution": 6, "dropout": 0.1},
                    {"epochs": 1, "resolution": 8, "dropout": 0.2},
                ],
            },
            {"lr": 0.01, "substages": [{"epochs": 1, "resolution": 6, "dropout": 0.1}]},
        ],
    )
    plans = [entry["batch_sizes"] for entry in summary["history"]]
    low, full, low_again = plans
    # equal costs: which ranks are small follows the probe's noise (ranks beyond 10% slower)
    small = summary["dual_plan"]["small_ranks"]
    large = [rank for rank in range(4) if rank not in small]
    assert [full[r] for r in large] == [32, 32]  # B_L at the reference resolution (8x8)
    assert [low[r] for r in large] == [round(32 / (6 / 8) ** 2)] * 2  # 57 for smaller images
    assert all(low[r] >= full[r] for r in small)  # and B_S planned again for them
    assert low_again == low
    # the same data split in every sub-stage: the server counted the steps of each plan
    samples = summary["dual_plan"]["samples"]
    for plan, entry in zip(plans, summary["history"]):
        assert entry["updates"] == [math.ceil(n / b) for n, b in zip(samples, plan)]
