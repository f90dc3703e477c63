"""Lightning's step-keyed features beside micro-batches (issue 40): one 2-rank launch runs
every case of ``micro_compat.py``."""

import pytest
import torch

from tests.e2e.launch import run_script

pytestmark = pytest.mark.e2e

CASES = ("logging", "logging_fsdp", "schedule", "partial")


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("compat") / "results.pt"
    run_script("micro_compat.py", str(out), *CASES)
    return torch.load(out, weights_only=False)


@pytest.mark.parametrize("case", ["logging", "logging_fsdp"])
def test_synced_step_logging_runs_one_sync_per_step_whatever_the_micro_batch_counts(results, case):
    """Failure 1: ``self.log(sync_dist=True)`` in ``training_step`` and a backward hook, and a
    torchmetrics metric with ``dist_sync_on_step``, while rank 0 runs 4 micro-batches per step
    and rank 1 one: every rank finishes (a mismatched collective aborts gloo), and the logged
    step value is DDP's: the last accumulated batch's, synced (each rank's last micro-batch,
    weighted by its samples). Under ``HeteroStrategy`` and ``HeteroFSDPStrategy``."""
    got = results[case]
    assert [len(calls) for calls in got["calls"]] == [12, 3]
    assert [n for _, n in got["calls"][0]] == [2] * 12
    assert got["metrics"]["train_loss"] == pytest.approx(got["expected_loss"], rel=1e-5)
    assert {"grad", "metric", "target"} <= got["metrics"].keys()
    assert got["metrics"]["grad"] == 2.0  # the backward hook's value, synced in the last
    assert got["metrics"]["target"] == pytest.approx(got["target"], rel=1e-5)  # per sample


def test_validation_and_checkpoints_fall_at_ddps_global_steps_the_epochs_last_included(results):
    """Failure 2: 10 loader batches per rank, accumulation 2 taken over,
    ``val_check_interval=0.5``, 2 epochs: DDP validates at global steps 2, 5, 7 and 10, and
    ``last.ckpt`` holds the final step."""
    got = results["schedule"]
    assert got["validated"] == [2, 5, 7, 10]
    assert got["global_step"] == got["last_step"] == 10
    assert got["best_step"] in got["validated"]


def test_a_limit_that_accumulation_does_not_divide_runs_ddps_last_partial_window(results):
    """Failure 7: ``limit_train_batches=5`` with accumulation 2 on 2 ranks: DDP's 3 optimizer
    steps (2, 2 and 1 loader batches: 20 samples, each once), and ``val_check_interval=3``
    validates after loader batch 3, at step 1."""
    got = results["partial"]
    assert got["global_step"] == 3
    assert len(got["indices"]) == len(set(got["indices"])) == 20  # shuffled: 20 of 40
    assert got["validated"] == [1]
