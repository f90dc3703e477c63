"""The library imports without the ``bench`` extra; the bench commands say what to install.

The subprocesses emulate an install without the extra. scikit-learn and matplotlib are
hidden from the whole process as if not installed: importing them fails,
``importlib.util.find_spec`` gives ``None`` and ``importlib.metadata`` does not know them
(torchmetrics asks it about matplotlib). tqdm cannot be missing where Lightning is
installed (Lightning requires it), so it is refused only to imports made by
``lightning_hetero``'s own modules outside ``lightning_hetero.bench``.
"""

import importlib.util
import json
import subprocess
import sys
import warnings

import pytest

from lightning_hetero.bench import _extra

BLOCKER = r"""
import builtins, importlib, importlib.metadata as metadata, sys

BLOCKED = {"sklearn", "matplotlib", "tqdm"}
HIDDEN = {"sklearn": "scikit-learn", "matplotlib": "matplotlib"}

for _module in HIDDEN:
    sys.modules[_module] = None  # import: ModuleNotFoundError; find_spec: None

_from_name = metadata.Distribution.from_name.__func__


def _hidden_from_name(cls, name):
    if name.lower().replace("_", "-") in HIDDEN.values():
        raise metadata.PackageNotFoundError(name)
    return _from_name(cls, name)


metadata.Distribution.from_name = classmethod(_hidden_from_name)


def _ours(importer):
    if importer == "lightning_hetero.bench" or importer.startswith("lightning_hetero.bench."):
        return False
    return importer == "lightning_hetero" or importer.startswith("lightning_hetero.")


def _refuse(name, importer):
    if name.partition(".")[0] in BLOCKED and _ours(importer):
        raise ModuleNotFoundError(f"No module named {name!r} (blocked in {importer})", name=name)


_import = builtins.__import__


def _guarded_import(name, globals=None, locals=None, fromlist=(), level=0):
    if level == 0:
        _refuse(name, (globals or {}).get("__name__") or "")
    return _import(name, globals, locals, fromlist, level)


builtins.__import__ = _guarded_import
_import_module = importlib.import_module


def _guarded_import_module(name, package=None):
    if not name.startswith("."):
        _refuse(name, sys._getframe(1).f_globals.get("__name__") or "")
    return _import_module(name, package)


importlib.import_module = _guarded_import_module
"""

IMPORT_ALL = r"""
import json, pkgutil, traceback

failed = {}


def attempt(name):
    try:
        importlib.import_module(name)
    except (Exception, SystemExit):
        failed[name] = traceback.format_exc()
        return False
    return True


walked = []  # every module and package; those that failed to import, too (onerror)
if attempt("lightning_hetero"):
    root = sys.modules["lightning_hetero"]
    for info in pkgutil.walk_packages(root.__path__, "lightning_hetero.", onerror=walked.append):
        walked.append(info.name)
names = ["lightning_hetero", "lightning_hetero.planning"]
for name in walked:
    if name != "lightning_hetero.bench" and not name.startswith("lightning_hetero.bench."):
        names.append(name)
names = list(dict.fromkeys(names))
for name in names:
    if name not in failed:
        attempt(name)
probes = {}
for module in sorted(BLOCKED):
    try:
        exec(f"import {module}", {"__name__": "lightning_hetero._probe"})
        probes[module] = "imported"
    except ModuleNotFoundError:
        probes[module] = "blocked"
print("RESULT " + json.dumps({"names": names, "failed": failed, "probes": probes}))
"""


#: The same walk with nothing blocked, to tell a module that cannot be imported at all.
CONTROL = "import importlib, sys\n\nBLOCKED = set()\n" + IMPORT_ALL


def _run(args: list[str], timeout: float = 300) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, *args], capture_output=True, text=True, timeout=timeout, check=False
    )


def _run_blocked_module(module: str, *argv: str) -> subprocess.CompletedProcess:
    """``python -m module *argv`` with the extra emulated away."""
    script = BLOCKER + (
        "import runpy\n"
        f"sys.argv = [{module!r}, *{list(argv)!r}]\n"
        f"runpy.run_module({module!r}, run_name='__main__', alter_sys=True)\n"
    )
    return _run(["-c", script])


def _import_all(script: str) -> dict:
    proc = _run(["-c", script])
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = [ln for ln in proc.stdout.splitlines() if ln.startswith("RESULT ")][-1]
    return json.loads(line[len("RESULT ") :])


def test_every_module_outside_bench_imports_without_scikit_learn_matplotlib_and_tqdm():
    result = _import_all(BLOCKER + IMPORT_ALL)
    # the emulation holds: none of the three reaches a module of ours
    assert result["probes"] == dict.fromkeys(["matplotlib", "sklearn", "tqdm"], "blocked")
    names = result["names"]
    # the walk went through the packages, and left bench alone
    for name in ("lightning_hetero.strategy", "lightning_hetero.planning.split"):
        assert name in names
    assert "lightning_hetero.pytorch_lightning" in names
    assert not [name for name in names if name.startswith("lightning_hetero.bench")]
    failed = result["failed"]
    if failed:  # tell the three packages from a module that is broken anyway
        broken = _import_all(CONTROL)["failed"]
        for name in ("lightning_hetero", "lightning_hetero.planning"):
            assert name not in broken, f"{name} does not import at all:\n{broken[name]}"
        if broken:
            warnings.warn(
                f"could not check these modules, which do not import at all: {sorted(broken)}",
                stacklevel=1,
            )
        failed = {name: trace for name, trace in failed.items() if name not in broken}
    assert failed == {}, "\n\n".join(f"{name}:\n{trace}" for name, trace in failed.items())


@pytest.mark.parametrize("module", ["lightning_hetero.bench", "lightning_hetero.bench.mps"])
def test_the_bench_commands_without_the_extra_exit_2_with_what_to_install(module):
    proc = _run_blocked_module(module, "--repeats", "1")
    assert proc.returncode == 2, proc.stderr[-4000:]
    assert "usage:" not in proc.stdout
    assert "Traceback" not in proc.stderr
    assert "pip install 'lightning_hetero[bench]'" in proc.stderr
    assert "scikit-learn" in proc.stderr  # tqdm comes with Lightning: only sklearn is missing
    assert f"python -m {module} needs the bench extra" in proc.stderr


@pytest.mark.parametrize("module", ["lightning_hetero.bench", "lightning_hetero.bench.mps"])
def test_the_bench_commands_show_their_help_without_the_extra(module):
    proc = _run_blocked_module(module, "--help")
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.startswith(f"usage: python -m {module}")
    assert "pip install 'lightning_hetero[bench]'" in proc.stderr


@pytest.mark.parametrize("module", ["lightning_hetero.bench", "lightning_hetero.bench.mps"])
def test_the_bench_commands_with_the_extra_show_their_help(module):
    proc = _run(["-m", module, "--help"])
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.startswith(f"usage: python -m {module}")
    assert "needs the bench extra" not in proc.stderr


def test_the_message_names_every_missing_package(monkeypatch, capsys):
    find_spec = importlib.util.find_spec

    def without_extra(name, package=None):
        return None if name in ("sklearn", "tqdm") else find_spec(name, package)

    monkeypatch.setattr(importlib.util, "find_spec", without_extra)
    assert _extra.missing() == ["scikit-learn", "tqdm"]
    with pytest.raises(SystemExit) as exit_info:
        _extra.exit_without_extra("prog")
    assert exit_info.value.code == 2
    err = capsys.readouterr().err
    assert "prog needs the bench extra: scikit-learn and tqdm are not installed" in err
    assert "pip install 'lightning_hetero[bench]'" in err
    assert err.count("\n") == 1  # one paragraph


def test_nothing_is_said_when_the_extra_is_installed(capsys):
    assert _extra.missing() == []
    _extra.exit_without_extra("prog")  # returns
    assert capsys.readouterr().err == ""
