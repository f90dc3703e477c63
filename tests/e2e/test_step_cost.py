"""What a rank's measured step cost holds, through real 2-rank gloo runs of
``step_cost_program.py``: loading on the training thread is in it, loading that worker
processes hide behind the step is not, and equal loading adds to unequal device costs.

These tests read durations, but none is a speed criterion ("this took less than X"): the
property under test is what the timer counts. Sleeps can only add time, so a cost that must
include a known sleep is checked as a lower bound (it holds on any machine load); where a
sleep must *not* be counted, two runs that differ only in where the loading happens are
compared, with a margin of half the sleep (timings on a busy machine are noisy).
"""

import json
from pathlib import Path
from typing import Any

import pytest

from tests.e2e.launch import run_script
from tests.e2e.step_cost_program import BATCH_SIZE

# The sleeps are long beside the tiny model's real compute and its noise between ranks and
# between runs on a busy machine (tens of ms): each margin below is 48 ms or more.
SLEEP = 0.016  # seconds per sample in the dataset's __getitem__
DEVICE = 0.015  # Throttle's seconds per sample: the step outlasts two workers' loading
LOAD = 0.003  # Throttle's load_cost: seconds per sample on the training thread
UNEQUAL = [0.004, 0.016]  # Throttle's sample_cost of ranks 0 and 1


def _history(folder: Path, name: str, *args: str) -> list[dict[str, Any]]:
    out = folder / f"{name}.json"
    run_script("step_cost_program.py", str(out), *args)
    return json.loads(out.read_text())


# The first two tests' runs: 120 ms of device work a step, 128 ms of loading a batch.
DEVICE_AND_LOADING = ["--sample-cost", f"{DEVICE},{DEVICE}", "--sleep", str(SLEEP)]


@pytest.fixture(scope="module")
def on_thread(tmp_path_factory) -> list[dict[str, Any]]:
    """The run with num_workers=0: each batch is read on the training thread."""
    return _history(tmp_path_factory.mktemp("step_cost"), "thread", *DEVICE_AND_LOADING)


def test_loading_on_the_training_thread_is_in_the_cost(on_thread):
    loading_s, device_s = BATCH_SIZE * SLEEP, BATCH_SIZE * DEVICE  # 128 ms, 120 ms
    assert len(on_thread) == 2, on_thread  # one boundary per epoch
    for entry in on_thread:
        assert entry["batch_sizes"] == [BATCH_SIZE, BATCH_SIZE], entry  # static: fixed
        # Every fully timed step holds both sleeps, so their sum is a lower bound (with 10% to
        # spare). Without the loading a step costs the 120 ms plus the tiny model's few
        # ms, far below it.
        assert all(t >= 0.9 * (loading_s + device_s) for t in entry["compute_times"]), entry
        assert entry["step_time"] >= 0.9 * (loading_s + device_s), entry
        assert not entry["reverted"], entry


def test_loading_in_worker_processes_hidden_behind_the_step_is_not_in_the_cost(tmp_path, on_thread):
    # The same loading with num_workers=2 (128 ms a batch per worker, 64 ms a batch for two)
    # behind a step of 120 ms: batches wait ready in the queue, the step never waits for one.
    in_workers = _history(tmp_path, "workers", *DEVICE_AND_LOADING, "--workers", "2")
    loading_s, device_s = BATCH_SIZE * SLEEP, BATCH_SIZE * DEVICE
    for thread_entry, workers_entry in zip(on_thread, in_workers, strict=True):
        assert workers_entry["batch_sizes"] == [BATCH_SIZE, BATCH_SIZE], workers_entry
        # the device's sleep is still there (lower bound) ...
        assert all(t >= 0.9 * device_s for t in workers_entry["compute_times"]), workers_entry
        # ... but not the loading: each rank's cost is lower by most of it than on the thread
        pairs = zip(thread_entry["compute_times"], workers_entry["compute_times"], strict=True)
        for thread_s, workers_s in pairs:
            assert workers_s <= thread_s - 0.5 * loading_s, (thread_entry, workers_entry)
    # and so is the synchronous step once the workers run: a plain mean (the step-time check
    # must see stalls), which in epoch 0 also holds the workers' start, a one-off cost of the
    # loader that a busy machine stretches (seen at 6 steps an epoch: 220 ms against 277)
    thread_entry, workers_entry = on_thread[-1], in_workers[-1]
    assert workers_entry["step_time"] <= thread_entry["step_time"] - 0.5 * loading_s, (
        thread_entry,
        workers_entry,
    )


def test_equal_loading_adds_to_each_ranks_unequal_device_cost(tmp_path):
    # Throttle: LOAD s per sample before the forward on both ranks, UNEQUAL[k] s per sample
    # of device work on rank k; the adaptive controller re-plans from these costs.
    costs = ",".join(map(str, UNEQUAL))
    history = _history(
        tmp_path, "unequal", "--sample-cost", costs, "--load-cost", str(LOAD), "--adaptive"
    )
    first = history[0]
    compute = first["compute_times"]
    assert first["batch_sizes"] == [BATCH_SIZE, BATCH_SIZE], first
    for rank, device in enumerate(UNEQUAL):
        # both sleeps are the rank's own cost (lower bound, with 10% to spare)
        assert compute[rank] >= 0.9 * BATCH_SIZE * (LOAD + device), first
    # the slower device's rank costs more by most of the difference (96 ms); the faster
    # one waits for it rather than computing
    assert compute[1] - compute[0] >= 0.5 * BATCH_SIZE * (UNEQUAL[1] - UNEQUAL[0]), first
    assert first["wait_times"][0] >= 0.5 * BATCH_SIZE * (UNEQUAL[1] - UNEQUAL[0]), first
    # and the plan gives the faster rank more samples
    moved = first["next_batch_sizes"]
    assert moved[0] > BATCH_SIZE > moved[1], first
    # the end-of-fit summary says so, from this run's history
    summary = json.loads((tmp_path / "unequal.json.summary").read_text())
    assert summary["boundaries"] == len(history) and summary["replans"] >= 1, summary
    assert summary["first_plan"] == [BATCH_SIZE, BATCH_SIZE], summary
    assert summary["final_plan"] == history[-1]["next_batch_sizes"], summary
    assert summary["step_time_uniform"] == first["step_time"], summary
    assert summary["pace_setter"] == 1, summary  # the slower device's rank
    assert {"reverts", "holds", "hold_reasons", "final_balance", "speedup"} <= set(summary)
    assert "lightning_hetero.plots" in summary["pictures"], summary
