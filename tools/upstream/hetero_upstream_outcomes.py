"""pytest plugin (``-p hetero_upstream_outcomes``): one JSON line per test to a file.

The file is ``$HETERO_UPSTREAM_OUTCOMES``; each line holds ``nodeid``, ``outcome``
(``passed``, ``failed``, ``error``, ``skipped``, ``xfailed``, ``xpassed``) and ``message``
(the first line of the error). Only the process pytest was started in writes: the ranks
Lightning's ``popen`` launcher starts (``LOCAL_RANK`` set before pytest starts) re-run the
same command and stay silent.
"""

import json
import os

import pytest

_PATH = os.environ.get("HETERO_UPSTREAM_OUTCOMES")
_ENABLED = bool(_PATH) and os.environ.get("LOCAL_RANK", "0") == "0"
_outcomes: dict[str, tuple[str, str]] = {}


def _first_line(report: pytest.TestReport | pytest.CollectReport) -> str:
    crash = getattr(report.longrepr, "reprcrash", None)
    text = crash.message if crash is not None else str(report.longrepr or "")
    if isinstance(report.longrepr, tuple):  # skips: (path, line, reason)
        text = str(report.longrepr[2])
    lines = [line.strip() for line in text.splitlines() if line.strip()]
    if not lines:
        return ""
    if lines[0].endswith(":") and len(lines) > 2:  # a rank's traceback: its last lines say why
        return f"{lines[0]} ... {' | '.join(lines[-2:])}"[:300]
    return lines[0][:300]


def _write(nodeid: str, outcome: str, message: str) -> None:
    with open(_PATH, "a") as file:  # noqa: PTH123
        file.write(json.dumps({"nodeid": nodeid, "outcome": outcome, "message": message}) + "\n")


def pytest_collectreport(report: pytest.CollectReport) -> None:
    if _ENABLED and report.failed:
        _write(report.nodeid, "error", _first_line(report))


def pytest_runtest_logreport(report: pytest.TestReport) -> None:
    if not _ENABLED:
        return
    if hasattr(report, "wasxfail"):
        outcome = "xfailed" if report.skipped else "xpassed"
    elif report.failed:
        outcome = "failed" if report.when == "call" else "error"
    else:
        outcome = "skipped" if report.skipped else "passed"
    previous = _outcomes.get(report.nodeid)
    # the first phase that did not pass decides (a failed teardown after a passed call counts)
    if previous is None or (previous[0] == "passed" and outcome != "passed"):
        _outcomes[report.nodeid] = (outcome, "" if outcome == "passed" else _first_line(report))
    if report.when == "teardown":
        _write(report.nodeid, *_outcomes.pop(report.nodeid))


def pytest_configure(config: pytest.Config) -> None:
    # Lightning marks some tests `flaky` (pytest-rerunfailures): without that plugin
    # --strict-markers refuses the marker at collection; here they run once
    if not config.pluginmanager.hasplugin("rerunfailures"):
        config.addinivalue_line("markers", "flaky: pytest-rerunfailures' marker (run once here)")
