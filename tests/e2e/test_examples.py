"""The scripts in examples/ run as their docstrings say (one short epoch each)."""

import subprocess
import sys
from pathlib import Path

import pytest

from lightning_hetero.bench.run import child_env

EXAMPLES = Path(__file__).resolve().parents[2] / "examples"


def _run(tmp_path: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=300,
        env=child_env(),
        cwd=tmp_path,  # lightning_logs/ lands here
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


@pytest.mark.parametrize(("script", "global_batch"), [("train.py", 64), ("fsdp.py", 32)])
def test_the_example_trains_and_prints_its_plan(tmp_path, script, global_batch):
    out = _run(tmp_path, str(EXAMPLES / script), "--epochs", "1")
    line = next(row for row in out.splitlines() if row.startswith("final batch sizes"))
    sizes = [int(s) for s in line.split("[")[1].rstrip("]").split(",")]
    # 2 ranks share the loader's batch times 2 (how, depends on this machine's timing)
    assert len(sizes) == 2 and sum(sizes) == global_batch
    if script == "fsdp.py":  # its loss had fallen to 0.000 (a rule learnt within an epoch)
        loss = next(row for row in out.splitlines() if "mean train_loss" in row)
        assert float(loss.rsplit(":", 1)[1]) > 0.1, loss


def test_the_cli_example_reads_the_yaml(tmp_path):
    config = EXAMPLES / "cli.yaml"
    _run(
        tmp_path, str(EXAMPLES / "cli.py"), "fit", "--config", str(config), "--trainer.max_epochs=1"
    )
    printed = _run(
        tmp_path, str(EXAMPLES / "cli.py"), "fit", "--config", str(config), "--print_config"
    )
    assert "lightning_hetero.HeteroStrategy" in printed and "adjust_every: 8" in printed
