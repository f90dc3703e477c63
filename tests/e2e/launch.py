"""Helpers that run real multi-process training as a user would: one command, popen launcher."""

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

HERE = Path(__file__).parent


def run_script(*args: str, timeout: float = 300) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    proc = subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, env=env, cwd=HERE
    )
    if proc.returncode != 0:
        raise AssertionError(
            f"{args} failed ({proc.returncode}):\n{proc.stdout[-3000:]}\n{proc.stderr[-6000:]}"
        )
    return proc


def run_training(tmp_path: Path, timeout: float = 300, **config: Any) -> dict[str, Any]:
    """Run ``lightning_hetero.bench.run`` with ``config``; returns rank 0's summary."""
    result = tmp_path / f"result_{len(list(tmp_path.glob('result_*')))}.json"
    config = {"result": str(result), **config}
    run_script("-m", "lightning_hetero.bench.run", json.dumps(config), timeout=timeout)
    return json.loads(result.read_text())
