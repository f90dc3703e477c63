"""Manual optimization timing and sample-weighted training metrics, through real Trainer runs."""

import json

import pytest

from tests.e2e.launch import run_script
from tests.e2e.step_timing import BATCH_SIZE, COST
from tests.e2e.weighted_logging import N_TRAIN, PLAN


@pytest.mark.parametrize(
    "mode",
    [
        # rank 1 sleeps between its two backwards; rank 0 waits in the second all-reduce
        "manual",
        # rank 1 sleeps before a sync_dist log; rank 0 waits in the log's all-reduce
        "logged",
    ],
)
def test_compute_holds_the_slow_ranks_work_and_the_plan_leaves_it(tmp_path, mode):
    out = tmp_path / "history.json"
    run_script("step_timing.py", mode, str(out))
    first, second = json.loads(out.read_text())
    sleep_s = COST[1] * BATCH_SIZE  # rank 1's sleep, every step
    compute, wait = first["compute_times"], first["wait_times"]
    assert first["batch_sizes"] == [BATCH_SIZE, BATCH_SIZE]
    # rank 1's compute holds the sleep (a lower bound); rank 0 spends it waiting, not computing
    # (counted as compute, the wait would make the two equal). As a difference, with half the
    # sleep to spare: the real compute both ranks pay alike grows on a busy machine, and a
    # ratio of the two would fail once it reached the sleep
    assert compute[1] >= 0.9 * sleep_s, first
    assert compute[1] - compute[0] >= 0.5 * sleep_s, first
    assert wait[0] >= 0.5 * sleep_s, first
    assert first["changed"]
    moved = first["next_batch_sizes"]
    assert moved[0] > BATCH_SIZE > moved[1], first
    assert second["batch_sizes"] == moved


def test_step_and_epoch_training_metrics_are_per_sample_means_of_the_global_batch(tmp_path):
    out = tmp_path / "logged.json"
    run_script("weighted_logging.py", str(out))
    result = json.loads(out.read_text())
    rank0, rank1 = result["seen"]  # the values each rank's batches held, step by step
    steps_per_epoch = N_TRAIN // sum(PLAN)
    assert len(rank0) == len(rank1) == 2 * steps_per_epoch
    global_batches = [a + b for a, b in zip(rank0, rank1)]
    expected_steps = [sum(batch) / len(batch) for batch in global_batches]
    logged_steps = [r["x_step"] for r in result["records"] if "x_step" in r]
    assert logged_steps == pytest.approx(expected_steps, rel=1e-6)
    # the plain mean of the two ranks' means differs: the runs tell the two apart
    plain = [(sum(a) / len(a) + sum(b) / len(b)) / 2 for a, b in zip(rank0, rank1)]
    assert all(abs(p - e) > 1e-3 for p, e in zip(plain, expected_steps))

    epochs = [global_batches[:steps_per_epoch], global_batches[steps_per_epoch:]]
    expected_epochs = [sum(map(sum, e)) / sum(map(len, e)) for e in epochs]
    logged_epochs = [r["x_epoch"] for r in result["records"] if "x_epoch" in r]
    assert logged_epochs == pytest.approx(expected_epochs, rel=1e-6)
    logged_metric = [r["x_metric"] for r in result["records"] if "x_metric" in r]
    assert logged_metric == pytest.approx(expected_epochs, rel=1e-6)

    # validation keeps Lightning's equal shards and its per-sample mean
    val_epoch = [v for rank in result["val_seen"] for v in rank[: len(rank) // 2]]
    logged_val = [r["val_x"] for r in result["records"] if "val_x" in r]
    assert logged_val == pytest.approx([sum(val_epoch) / len(val_epoch)] * 2, rel=1e-6)
