"""The compatibility matrix (issue 40, item 6): every cell of ``compat_cases.py`` in one 2-rank
gloo launch of ``compat_matrix.py`` (more only where a cell ends a launch), one test id per
cell reading the shared result."""

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lightning_hetero.bench.run import child_env
from tests.e2e.compat_cases import CASES

HERE = Path(__file__).parent
TOLERANCE = 1e-5
#: the whole matrix's wall-clock limit, under the test's own (a hung cell ends its launch
#: after ``COMPAT_CELL_LIMIT_S`` with every thread's stack in its message)
LAUNCH_TIMEOUT = 480


def run_matrix(
    folder: Path, cells: list[str], timeout: float = LAUNCH_TIMEOUT, collective_timeout: int = 30
) -> dict:
    """Run ``cells`` in launches of ``compat_matrix.py``: one, unless a cell ends a launch
    (the ranks disagree, or the process dies); that cell is recorded as ``launch ended`` and
    the next launch runs the cells after it. ``collective_timeout``: seconds a collective
    waits before it fails its cell. Returns each cell's result and ``_launches``."""
    results: dict = {}
    left, launches, deadline = list(cells), [], time.monotonic() + timeout
    while left:
        out = folder / f"launch{collective_timeout}-{len(launches)}.json"
        start = time.monotonic()
        # the log goes to a file, and the launch's process group is killed once rank 0 has
        # exited: a rank 1 left waiting (rank 0 ended the launch) must not hold a pipe open
        with open(out.with_suffix(".log"), "w+") as log_file:
            proc = subprocess.Popen(
                [sys.executable, "compat_matrix.py", str(out), *left],
                cwd=HERE,
                env=child_env(COMPAT_TIMEOUT_S=str(collective_timeout)),
                stdout=log_file,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=max(deadline - time.monotonic(), 1))
            with contextlib.suppress(ProcessLookupError):
                os.killpg(proc.pid, signal.SIGKILL)
            proc.wait()
            log_file.seek(0)
            log = log_file.read()
        done = json.loads(out.read_text()) if out.exists() else {}
        results.update(done)
        seconds = round(time.monotonic() - start, 1)
        launches.append({"cells": len(done), "seconds": seconds, "returncode": proc.returncode})
        left = [c for c in left if c not in done]
        if proc.returncode == 3:  # the ranks disagreed after the last cell it recorded
            last = next(reversed(done))
            results[last]["message"] = "ranks disagreed: " + results[last].get("message", "")
        elif left and proc.returncode != 0:  # the next cell ended it
            results[left[0]] = {
                "status": "launch ended",
                "returncode": proc.returncode,
                "message": log[-12000:],
            }
            left = left[1:]
        if time.monotonic() > deadline:
            for cell in left:
                results[cell] = {"status": "not run", "message": "the matrix's time ran out"}
            break
    results["_launches"] = launches
    return results


def failures(case, result: dict) -> list[str]:
    """Why the cell did not have the outcome the table expects it to (empty: it did)."""
    kind, _, detail = case.expect.partition(": ")
    status = result.get("status")
    if kind == "refused":
        if status not in ("refused", "raised"):
            return [f"not refused: {status}"]
        return [] if detail in result["message"] else [f"refused otherwise: {result['message']}"]
    if status != "finished":
        return [f"{status}: {result.get('message', '')[-8000:]}"]
    problems = []
    if not result["samples_once"]:
        problems.append(f"samples per epoch {result['per_epoch']}, DDP {result['ddp_per_epoch']}")
    if case.compare:
        if not result["same_samples"]:
            problems.append("other samples than DDP's")
        if result["params_difference"] > TOLERANCE:
            problems.append(f"parameters differ from DDP's by {result['params_difference']}")
        for key in ("validated", "global_step", "last_step", "saved"):
            if key in result and result[key][0] != result[key][1]:
                problems.append(f"{key} {result[key][0]}, DDP {result[key][1]}")
    if case.compare == "all" and result["logged_difference"] > TOLERANCE:
        problems.append(f"logged metrics differ from DDP's by {result['logged_difference']}")
    return problems


@pytest.fixture(scope="module")
def matrix(tmp_path_factory) -> dict:
    # the cells that fail today in launches of their own, after the others' one: a cell that
    # ends its launch (gloo aborts on a collective mismatch; ranks that disagree) costs a
    # launch of the few after it, and a hang there fails its cell after 10 s, not 30
    folder = tmp_path_factory.mktemp("compat")
    failing = [c.id for c in CASES if c.expect.startswith("xfail")]
    start = time.monotonic()
    results = run_matrix(folder, [c.id for c in CASES if c.id not in failing])
    left = LAUNCH_TIMEOUT + 300 - (time.monotonic() - start)
    more = run_matrix(folder, failing, timeout=left, collective_timeout=10)
    return {**results, **more, "_launches": results["_launches"] + more["_launches"]}


@pytest.mark.timeout(900)  # the first cell's includes the matrix's run (LAUNCH_TIMEOUT)
@pytest.mark.parametrize("case", CASES, ids=[c.id for c in CASES])
def test_cell(matrix, case) -> None:
    problems = failures(case, matrix[case.id])
    if case.expect.startswith("xfail"):
        if problems:
            pytest.xfail(f"{case.expect}: {problems[0][:300]}")
        pytest.fail(f"{case.id} passes now: mark it works in compat_cases.py")
    assert not problems, problems
