"""Helpers that run real multi-process training as a user would: one command, popen launcher."""

import subprocess
import sys
from pathlib import Path
from typing import Any

from lightning_hetero.bench.run import child_env, launch

HERE = Path(__file__).parent


def run_script(
    *args: str, timeout: float = 300, warnings: bool = False
) -> subprocess.CompletedProcess:
    """Run a script of this folder as a fresh job; ``warnings``: show them (tests read them)."""
    proc = subprocess.run(
        [sys.executable, *args],
        capture_output=True,
        text=True,
        timeout=timeout,
        env=child_env(warnings=warnings),
        cwd=HERE,
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def run_training(tmp_path: Path, timeout: float = 300, **config: Any) -> dict[str, Any]:
    """Run ``lightning_hetero.bench.run`` with ``config``; returns rank 0's summary."""
    workdir = tmp_path / f"run_{len(list(tmp_path.glob('run_*')))}"
    workdir.mkdir()
    return launch(config, workdir, timeout=timeout)
