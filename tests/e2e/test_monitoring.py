"""hetero/* metrics drive Lightning's ModelCheckpoint and EarlyStopping from the first epoch."""

import json

import pytest

from tests.e2e.launch import run_script


def test_checkpoint_and_early_stopping_monitor_hetero_metrics_from_the_first_epoch(tmp_path):
    out = tmp_path / "monitor.json"
    # a missing key raises in the program (strict EarlyStopping; ModelCheckpoint once
    # validation has run); the warning ModelCheckpoint gives before that is checked here
    proc = run_script("monitor_program.py", str(out), warnings=True)
    assert "could not find the monitored key" not in proc.stderr + proc.stdout
    result = json.loads(out.read_text())
    history = result["history"]
    assert len(history) == 2  # one boundary per epoch
    # a checkpoint every epoch, the first one included, scored with that epoch's balance
    # (not the one of the epoch before)
    assert [s["path"] for s in result["saved"]] == ["epoch=0.ckpt", "epoch=1.ckpt"]
    scores = [s["score"] for s in result["saved"]]
    assert scores == pytest.approx([entry["balance"] for entry in history], rel=1e-6)
    assert result["early_stopping_best"] == max(h["batch_sizes"][0] for h in history)
