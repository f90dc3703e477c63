"""Run Lightning's own tests with and without HeteroStrategy in place of DDPStrategy.

Usage (see tools/upstream/README.md)::

    python tools/upstream/run.py extract --git-dir GIT_DIR --ref 2.6.5 --dest /tmp/lightning
    python tools/upstream/run.py compare /tmp/lightning loops/ trainer/logging_/ [--world1]

``extract`` writes Lightning's ``pyproject.toml`` (its pytest options) and
``tests/tests_pytorch`` at a tag into a scratch folder. ``compare`` runs the selected paths
(relative to ``tests/tests_pytorch``) there twice, unpatched and with ``patch/sitecustomize.py``
on ``PYTHONPATH``, and prints every test that passes unpatched and does not pass patched,
with the first line of its error. Outcomes are kept as JSON lines in ``--out``; a run whose
file exists is reused unless ``--fresh``.
"""

import argparse
import json
import os
import subprocess
import sys
import tarfile
import tempfile
from pathlib import Path

HERE = Path(__file__).resolve().parent
SITE = HERE / "patch"
sys.path.insert(0, str(HERE.parents[1]))
from lightning_hetero.bench.run import child_env  # noqa: E402

#: Lightning's addopts less ``--color=yes``
ADDOPTS = "--strict-markers --doctest-modules --disable-pytest-warnings --ignore=legacy/checkpoints"
BAD = ("failed", "error", "xpassed", "missing")


def extract(git_dir: str, ref: str, dest: Path) -> None:
    dest.mkdir(parents=True, exist_ok=True)
    with tempfile.TemporaryFile() as archive:
        # tests/legacy: back-compatible-versions.txt, which checkpointing/ reads at collection
        paths = ["pyproject.toml", "tests/tests_pytorch", "tests/legacy"]
        command = ["git", f"--git-dir={git_dir}", "archive", ref, *paths]
        subprocess.run(command, stdout=archive, check=True)
        archive.seek(0)
        with tarfile.open(fileobj=archive) as tar:
            tar.extractall(dest, filter="data")
    print(f"Lightning {ref}'s tests are in {dest}/tests/tests_pytorch")


def run_pytest(
    lightning: Path, selection: list[str], outcomes: Path, patched: bool, args: argparse.Namespace
) -> None:
    outcomes.unlink(missing_ok=True)
    # patched: lightning_hetero from the checkout this harness is in (e.g. a clean copy of HEAD)
    paths = [str(HERE)] + ([str(SITE), str(HERE.parents[1])] if patched else [])
    if os.environ.get("PYTHONPATH"):
        paths.append(os.environ["PYTHONPATH"])
    extra = {"PYTHONPATH": os.pathsep.join(paths), "HETERO_UPSTREAM_OUTCOMES": str(outcomes)}
    if patched:
        trace = outcomes.with_suffix(".trace")
        trace.unlink(missing_ok=True)
        extra["LIGHTNING_HETERO_UPSTREAM_TRACE"] = str(trace)
    if patched and args.world1:
        extra["LIGHTNING_HETERO_UPSTREAM_WORLD1"] = "1"
    env = child_env(warnings=True, **extra)
    env.pop("PL_RUN_STANDALONE_TESTS", None)
    if args.standalone:  # Lightning's conftest then keeps only RunIf(standalone=True) tests
        env["PL_RUN_STANDALONE_TESTS"] = "1"
    root = lightning / "tests"
    paths = [
        str(p.relative_to(root)) for s in selection for p in sorted(root.glob(f"tests_pytorch/{s}"))
    ]
    options = ["-p", "hetero_upstream_outcomes", "-p", "no:cacheprovider"]
    options += ["-o", f"addopts={ADDOPTS}"]
    options += [f"--timeout={args.timeout}", "--color=no", "-q", "-rN"]
    if args.k:
        options += ["-k", args.k]
    runs = [paths]
    if args.standalone:
        # one process per test, as Lightning's run_standalone_tasks.sh: the `popen` launcher
        # re-runs the command for the other ranks, which must be that one test
        listed = subprocess.run(
            [sys.executable, "-m", "pytest", *paths, *options, "--collect-only"],
            cwd=root,
            env=env,
            capture_output=True,
            text=True,
        )
        # node ids are relative to Lightning's root, the command runs in its tests/
        ids = [line for line in listed.stdout.splitlines() if "::" in line]
        runs = [[nodeid.removeprefix("tests/")] for nodeid in ids]
    log = outcomes.with_suffix(".log")
    label = "patched" if patched else "unpatched"
    with log.open("w") as out:
        for run in runs:
            command = [sys.executable, "-m", "pytest", *run, *options]
            print(f"{label}: {' '.join(command)} (log: {log})", flush=True)
            out.flush()
            subprocess.run(command, cwd=root, env=env, stdout=out, stderr=subprocess.STDOUT)


#: what ``check`` runs in a patched interpreter
CHECK = """
from lightning.pytorch import Trainer
from lightning.pytorch.callbacks import GradientAccumulationScheduler
from lightning.pytorch.strategies import DDPStrategy, SingleDeviceStrategy, StrategyRegistry
from lightning_hetero import HeteroStrategy
built = DDPStrategy(find_unused_parameters=True, start_method="spawn")
assert type(built) is HeteroStrategy and built._ddp_kwargs == {"find_unused_parameters": True}
assert built._start_method == "spawn"
names = [name for name in StrategyRegistry if name.startswith("ddp")]
assert names and all(type(StrategyRegistry.get(name)) is HeteroStrategy for name in names), names
assert type(DDPStrategy.__new__(type("Sub", (DDPStrategy,), {}))) is not HeteroStrategy
common = dict(accelerator="cpu", logger=False, enable_progress_bar=False)
assert type(Trainer(devices=2, **common).strategy) is HeteroStrategy
one = Trainer(devices=1, accumulate_grad_batches=2, **common).strategy
assert type(one) is HeteroStrategy and one.world_size == 1
scheduler = GradientAccumulationScheduler({0: 2})
assert type(Trainer(devices=1, callbacks=[scheduler], **common).strategy) is HeteroStrategy
assert type(Trainer(devices=1, **common).strategy) is SingleDeviceStrategy
import lightning_hetero
print(f"patched: DDPStrategy and {len(names)} ddp* names build HeteroStrategy; world size 1 ok")
print(f"lightning_hetero from {lightning_hetero.__file__}")
"""


def check() -> int:
    """Run ``CHECK`` with the patch on ``PYTHONPATH`` (``--world1``): 0 when it holds."""
    extra = {"PYTHONPATH": f"{SITE}{os.pathsep}{HERE.parents[1]}"}
    extra["LIGHTNING_HETERO_UPSTREAM_WORLD1"] = "1"
    command = [sys.executable, "-c", CHECK]
    return subprocess.run(command, env=child_env(**extra), cwd=tempfile.gettempdir()).returncode


def load(path: Path) -> dict[str, dict[str, str]]:
    if not path.exists():
        return {}
    rows = [json.loads(line) for line in path.read_text().splitlines() if line.strip()]
    return {row["nodeid"]: row for row in rows}


def compare(args: argparse.Namespace) -> int:
    lightning = Path(args.lightning).resolve()
    out = Path(args.out).resolve()
    out.mkdir(parents=True, exist_ok=True)
    tag = "-".join(s.strip("/").replace("/", "_").replace("*", "X") for s in args.selection)
    tag += f"-k_{args.k}".replace(" ", "_") if args.k else ""
    tag += "-standalone" if args.standalone else ""
    before = out / f"{tag}.unpatched.jsonl"
    after = out / f"{tag}.patched{'-world1' if args.world1 else ''}.jsonl"
    for path, patched in ((before, False), (after, True)):
        if args.fresh or not path.exists():
            run_pytest(lightning, args.selection, path, patched, args)
    plain, hetero = load(before), load(after)
    regressions = []
    for nodeid, row in plain.items():
        if row["outcome"] not in ("passed", "xfailed"):
            continue
        new = hetero.get(nodeid, {"outcome": "missing", "message": "no outcome (process killed?)"})
        if new["outcome"] in BAD:
            regressions.append((nodeid, new))
    count = {}
    for row in plain.values():
        count[row["outcome"]] = count.get(row["outcome"], 0) + 1
    trace = after.with_suffix(".trace")
    built = set(trace.read_text().split("\n")) if trace.exists() else set()
    built = {line.split("\t")[0] for line in built if line}
    print(f"unpatched: {len(plain)} tests {count}; patched: {len(hetero)} tests")
    print(f"{len(built)} tests built HeteroStrategy in place of DDPStrategy (trace: {trace})")
    print(f"{len(regressions)} pass unpatched and fail patched:")
    for nodeid, row in regressions:
        print(f"  {nodeid}  [{row['outcome']}] {row['message']}")
    (out / f"{tag}.regressions{'-world1' if args.world1 else ''}.json").write_text(
        json.dumps([{"nodeid": n, **r} for n, r in regressions], indent=1)
    )
    return 1 if regressions else 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    sub = parser.add_subparsers(dest="command", required=True)
    ex = sub.add_parser("extract", help="copy Lightning's tests at a tag into a scratch folder")
    ex.add_argument("--git-dir", required=True, help="a Lightning repository's git directory")
    ex.add_argument("--ref", required=True, help="the tag of the installed Lightning")
    ex.add_argument("--dest", required=True, type=Path)
    sub.add_parser("check", help="check that the patch builds HeteroStrategy where it should")
    co = sub.add_parser("compare", help="run tests unpatched and patched; print the regressions")
    co.add_argument("lightning", help="the folder `extract` wrote")
    co.add_argument("selection", nargs="+", help="paths (or globs) under tests/tests_pytorch")
    co.add_argument(
        "--world1",
        action="store_true",
        help="single-device accumulating Trainers get HeteroStrategy at world size 1",
    )
    co.add_argument("--timeout", type=int, default=300, help="seconds per test (pytest-timeout)")
    co.add_argument("-k", default=None, help="pytest's -k expression")
    co.add_argument("--out", default="/tmp/hetero-upstream", help="where outcomes and logs go")
    co.add_argument(
        "--standalone",
        action="store_true",
        help="Lightning's RunIf(standalone=True) tests only, each in its own process",
    )
    co.add_argument("--fresh", action="store_true", help="run again even where outcomes exist")
    args = parser.parse_args()
    if args.command == "extract":
        extract(args.git_dir, args.ref, args.dest)
        return 0
    if args.command == "check":
        return check()
    return compare(args)


if __name__ == "__main__":
    sys.exit(main())
