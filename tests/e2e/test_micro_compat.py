"""Lightning's step-keyed features beside micro-batches (issue 40): one 2-rank launch runs
every case of ``micro_compat.py``."""

import pytest
import torch

from tests.e2e.launch import run_script

pytestmark = pytest.mark.e2e

CASES = ("logging",)


@pytest.fixture(scope="module")
def results(tmp_path_factory):
    out = tmp_path_factory.mktemp("compat") / "results.pt"
    run_script("micro_compat.py", str(out), *CASES)
    return torch.load(out, weights_only=False)


def test_synced_step_logging_runs_one_sync_per_step_whatever_the_micro_batch_counts(results):
    """Failure 1: ``self.log(sync_dist=True)`` in ``training_step`` and a backward hook, and a
    torchmetrics metric with ``dist_sync_on_step``, while rank 0 runs 4 micro-batches per step
    and rank 1 one: every rank finishes (a mismatched collective aborts gloo), and the logged
    step value is DDP's: the last accumulated batch's, synced (each rank's last micro-batch,
    weighted by its samples)."""
    got = results["logging"]
    assert [len(calls) for calls in got["calls"]] == [12, 3]
    assert [n for _, n in got["calls"][0]] == [2] * 12
    assert got["metrics"]["train_loss"] == pytest.approx(got["expected_loss"], rel=1e-5)
    assert {"grad", "metric", "target"} <= got["metrics"].keys()
