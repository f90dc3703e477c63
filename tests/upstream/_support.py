"""Helpers for the adapted copies of Lightning's own tests (tests/upstream/).

``RunIf`` is Lightning's ``tests_pytorch/helpers/runif.py`` (Lightning-AI/pytorch-lightning,
tag 2.6.5, Apache-2.0) verbatim. ``standalone`` replaces Lightning's ``RunIf(standalone=True)``
CI job (each such test run alone in a fresh ``python -m pytest FILE::TEST``): it runs the test
in a fresh process that way, with ``accelerator="cpu"`` and the gloo backend; Lightning's
subprocess launcher re-runs that same command for the other ranks.
"""

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest
from lightning.pytorch.utilities.testing import _runif_reasons

from lightning_hetero.bench.run import child_env

ROOT = Path(__file__).resolve().parents[2]
#: set in the fresh process (and so in the ranks Lightning launches from it): run the body
CHILD = "LIGHTNING_HETERO_UPSTREAM_STANDALONE"


def RunIf(**kwargs):  # noqa: N802 (upstream's name)
    reasons, marker_kwargs = _runif_reasons(**kwargs)
    return pytest.mark.skipif(
        condition=len(reasons) > 0, reason=f"Requires: [{' + '.join(reasons)}]", **marker_kwargs
    )


def standalone(timeout: float = 300):
    """Run the decorated test alone in a fresh ``python -m pytest NODEID`` (all its ranks)."""

    def decorate(test):
        @functools.wraps(test)
        def run(*args, **kwargs):
            if os.environ.get(CHILD) == "1":
                return test(*args, **kwargs)
            nodeid = os.environ["PYTEST_CURRENT_TEST"].rsplit(" ", 1)[0]
            command = [sys.executable, "-m", "pytest", nodeid, "-q", "-x", "-p", "no:cacheprovider"]
            # `addopts=`: the child runs this one test whatever its markers (`slow`); --runxfail:
            # the child reports the real outcome, the xfail marker is judged here
            command += ["-o", "addopts=-ra", "--runxfail"]
            # -s and unbuffered: a rank killed mid-run (Lightning's launcher SIGKILLs rank 0 when
            # another rank exits non-zero) still leaves its log for the report below
            command += ["-s"]
            proc = subprocess.run(
                command,
                capture_output=True,
                text=True,
                timeout=timeout,
                cwd=ROOT,
                env=child_env(warnings=True, PYTHONUNBUFFERED="1", **{CHILD: "1"}),
            )
            if proc.returncode != 0:
                raise AssertionError(
                    f"{nodeid} failed in its own process ({proc.returncode}):\n"
                    f"{proc.stdout[-12000:]}\n{proc.stderr[-6000:]}"
                )

        return run

    return decorate
