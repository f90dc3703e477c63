"""Local-SGD mode on 3 gloo ranks, launched as a user would."""

import json

import torch

from tests.e2e.async_run import TRUE_B, TRUE_W
from tests.e2e.launch import run_script


def run(tmp_path, name, **config):
    out = tmp_path / f"{name}.json"
    run_script("async_run.py", json.dumps({"out": str(out), "mode": "local", **config}))
    return json.loads(out.read_text())


def distance_to_optimum(report) -> float:
    weight = torch.tensor(report["weight"])
    return float((weight - TRUE_W.flatten()).abs().max().item() + abs(report["bias"] - TRUE_B))


def test_plain_averaging_converges_to_the_optimum_and_every_sample_is_used_once(tmp_path):
    report = run(tmp_path, "plain", epochs=12, lr=0.1, megabatch_size=96, gamma=0.0)
    assert distance_to_optimum(report) < 1e-3
    assert all(sum(epoch) == 384 for epoch in report["samples_per_epoch"])
    merges = report["merges"]
    assert len(merges) == 12 * 4  # four mega-batches of 96 per epoch, each merged once
    for merge in merges:
        assert abs(sum(merge["weights"]) - 1) < 1e-9 or merge["perturbed"]
        assert sum(merge["updates"]) > 0


def test_paper_defaults_with_momentum_and_slow_ranks_rebalance_and_learn(tmp_path):
    # rank 0 is 4x slower per sample than rank 2: it should end with the smallest batch
    report = run(
        tmp_path,
        "momentum",
        epochs=6,
        lr=0.05,
        megabatch_size=192,
        batch_sizes=[16, 16, 16],
        sample_cost=[0.002, 0.001, 0.0005],
    )
    first = report["merges"][0]  # before any re-planning
    assert first["batch_sizes"] == [16, 16, 16]
    assert first["updates"][0] < first["updates"][2]  # dynamic claiming: fast ranks update more
    assert first["weights"] == [u / sum(first["updates"]) for u in first["updates"]]
    sizes = report["batch_sizes"]
    assert sizes[0] < 16 < sizes[2] and sum(sizes) == 48
    assert distance_to_optimum(report) < 0.5 * 3.0  # far from the start (about 3)
    assert all(sum(epoch) == 384 for epoch in report["samples_per_epoch"])
