"""Mode benchmark: time-to-accuracy of uniform DDP and HeteroStrategy's modes (paper 002).

Every repeat trains each configuration of ``CONFIGS`` once on the same emulated
cluster, back to back, validating after every epoch; the order changes from one repeat to
the next (``run_order``). Speedups against ``ddp`` are taken within a repeat; the
report gives minimum, median and maximum over repeats.
"""

import math
import statistics
import sys
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

from lightning_hetero.bench._tta import figures
from lightning_hetero.bench.run import launch
from lightning_hetero.planning import HETEROGENEITY_LEVELS

__all__ = ["CONFIGS", "COLUMNS", "figures", "measure_modes", "modes_report", "run_order"]

#: The compared configurations: RunConfig fields of each (strategy options in ``extra``).
CONFIGS: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": "ddp"},
    "bsp": {"strategy": "hetero"},
    "bsp-unweighted": {"strategy": "hetero", "weighted": False},
    "async": {"strategy": "hetero", "extra": {"mode": "async"}},
    "async-unscaled": {"strategy": "hetero", "extra": {"mode": "async", "lr_scaling": False}},
    # the run's default controller ("proportional") moves batch sizes: paper 004's rule
    "local": {
        "strategy": "hetero",
        "extra": {"mode": "local", "gamma": 0.9, "local_steps": "equal"},
    },
    "local-gamma0": {
        "strategy": "hetero",
        "extra": {"mode": "local", "gamma": 0.0, "local_steps": "equal"},
    },
}

#: Columns of the report, with what each means.
COLUMNS = {
    "final_acc": "validation accuracy after the last epoch (macro average over the 10 classes)",
    "final_loss": "validation cross-entropy after the last epoch",
    "train_s": "training time in seconds (fit from the start of training, validation excluded)",
    "tta_s": "training seconds until the end of the first epoch whose validation accuracy"
    " reaches the target (- = not reached)",
    "reached": "repeats that reached the target",
    "epochs_to_target": "epochs until the target (- = not reached)",
    "speedup": "time-to-target of ddp / this configuration's, within the same repeat"
    " (0 = this one did not reach the target, inf = ddp did not)",
}


def run_order(names: Sequence[str], repeat: int) -> list[str]:
    """The order of the runs of ``repeat``: backwards on odd repeats, rotated by ``repeat``."""
    order = list(names[::-1] if repeat % 2 else names)
    shift = repeat % len(order)
    return order[shift:] + order[:shift]


def measure_modes(
    levels: Sequence[str],
    repeats: int,
    epochs: int,
    base_cost: float,
    workdir: Path,
    configs: Sequence[str] = tuple(CONFIGS),
    timeout: float | None = 900.0,
    log: Callable[[str], None] | None = None,
    catalog: dict[str, dict[str, Any]] = CONFIGS,
    common: dict[str, Any] | None = None,
) -> dict[str, list[dict[str, Any]]]:
    """Run every configuration on every level ``repeats`` times; returns the raw summaries.

    ``raw[level][repeat][config]`` is rank 0's run summary (with ``accuracy_curve``), or
    ``{"error": message}`` if the run failed. ``log`` gets one line per finished run
    (default: standard error). ``catalog`` maps the names in ``configs`` to RunConfig
    fields; ``common`` adds fields to every run.
    """
    if log is None:

        def log(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

    raw: dict[str, list[dict[str, Any]]] = {}
    total, done, started = len(levels) * repeats * len(configs), 0, time.perf_counter()
    for level in levels:
        cost = [base_cost / cores for cores in HETEROGENEITY_LEVELS[level]]
        fields = {
            "workers": 4,
            "sample_cost": cost,
            "epochs": epochs,
            "validate": False,
            "val_every_epoch": True,
            **(common or {}),
        }
        raw[level] = []
        for repeat in range(repeats):
            runs: dict[str, Any] = {}
            for name in run_order(configs, repeat):
                config = {**fields, **catalog[name], "seed": repeat, "progress_bar": False}
                run_start = time.perf_counter()
                try:
                    runs[name] = launch(config, workdir, timeout=timeout)
                    curve = runs[name]["accuracy_curve"]
                    outcome = f"val acc {curve[-1][1]:.3f}" if curve else "no validation"
                except Exception as err:  # a failed run is reported, not fatal
                    runs[name] = {"error": f"{type(err).__name__}: {err}"[-4000:]}
                    outcome = f"FAILED ({type(err).__name__})"
                done += 1
                elapsed = time.perf_counter() - started
                log(
                    f"[{done}/{total}] {level} repeat {repeat + 1} {name}:"
                    f" {time.perf_counter() - run_start:.0f} s, {outcome}"
                    f" (elapsed {elapsed // 60:.0f}:{elapsed % 60:02.0f})"
                )
            raw[level].append(runs)
    return raw


def _fmt(value: float, key: str) -> str:
    if math.isinf(value) and key in ("tta_s", "epochs_to_target"):
        return "-"
    if key in ("final_acc", "final_loss"):
        return f"{value:.3f}"
    if key == "speedup":
        return f"{value:.2f}"
    return f"{value:.1f}" if key in ("tta_s", "train_s") else f"{value:g}"


def _cell(values: list[float], key: str) -> str:
    """min / median / max ("not reached" is inf: the median of a pair holding one is inf)."""
    values = sorted(v for v in values if not math.isnan(v))
    if not values:
        return "n/a"
    parts = [_fmt(v, key) for v in (values[0], statistics.median(values), values[-1])]
    return parts[0] if len(set(parts)) == 1 else " / ".join(parts)


def modes_report(
    raw: dict[str, list[dict[str, Any]]],
    target: float,
    configs: Sequence[str] | None = None,
    baseline: str = "ddp",
) -> str:
    """A Markdown table per level and configuration: min / median / max over repeats."""
    lines = [
        "| level | config | " + " | ".join(COLUMNS) + " |",
        "|---|---|" + "---|" * len(COLUMNS),
    ]
    failures: list[str] = []
    for level, repeats in raw.items():
        per_repeat = [figures(runs, target, baseline) for runs in repeats]
        seen = {name for runs in repeats for name in runs}
        names = configs or [n for n in CONFIGS if n in seen] + sorted(seen - set(CONFIGS))
        for name in names:
            rows = [f[name] for f in per_repeat if name in f]
            ran = sum(name in runs for runs in repeats)
            failed = [runs[name]["error"] for runs in repeats if "error" in runs.get(name, {})]
            failures += [f"{level} {name}: {error.splitlines()[0]}" for error in failed]
            cells = []
            for key in COLUMNS:
                if key == "reached":
                    cells.append(f"{sum(int(r['reached']) for r in rows)}/{ran}")
                else:
                    cells.append(_cell([r[key] for r in rows], key) if rows else "failed")
            lines.append(f"| {level} | `{name}` | " + " | ".join(cells) + " |")
    legend = "\n".join(
        f"- `{key}`: {text.replace('ddp', f'`{baseline}`')}" for key, text in COLUMNS.items()
    )
    text = (
        "\n".join(lines)
        + f"\n\nTarget accuracy {target:g}. Each cell: min / median / max over repeats"
        " (one value when all agree).\n" + legend + "\n"
    )
    if failures:
        text += "\nFailed runs:\n" + "\n".join(f"- {line}" for line in failures) + "\n"
    return text


# -------------------------------------------------------------------- convergence against DDP
#: The tasks of the convergence benchmark: RunConfig fields, and the global batch ``B``.
TASKS: dict[str, dict[str, Any]] = {
    # one-layer transformer reversing 16 digits; Adam 5e-4, 50-step warm-up, cosine decay
    "reverse": {"model": "reverse", "lr": 5e-4, "epochs": 2, "global_batch": 128},
    # the digits CNN with SGD + momentum 0.9
    "digits": {"model": "cnn", "lr": 0.05, "epochs": 6, "global_batch": 128},
}
#: Every mode with default options against DDP, and the rules the defaults replaced.
CONVERGENCE_CONFIGS: dict[str, dict[str, Any]] = {
    "ddp": {"strategy": "ddp"},
    "bsp": {"strategy": "hetero"},
    # the first epoch on the first plan to its end, as before `first_boundary`
    "bsp-epoch": {"strategy": "hetero", "extra": {"first_boundary": None}},
    "async": {"strategy": "hetero", "extra": {"mode": "async"}},
    # async's first epoch on the first plan to its end, as before its early boundary
    "async-epoch": {"strategy": "hetero", "extra": {"mode": "async", "first_boundary": None}},
    "async-plain": {"strategy": "hetero", "extra": {"mode": "async", "lookahead": False}},
    "async-last": {"strategy": "hetero", "extra": {"mode": "async", "epoch_average": False}},
    "async-sqrt": {"strategy": "hetero", "extra": {"mode": "async", "lr_scaling": "sqrt"}},
    "async-linear": {"strategy": "hetero", "extra": {"mode": "async", "lr_scaling": "linear"}},
    "dual": {"strategy": "hetero", "controller": "dual", "extra": {"mode": "async"}},
    "dual-sqrt": {
        "strategy": "hetero",
        "controller": "dual",
        "extra": {"mode": "async", "lr_scaling": "sqrt"},
    },
    "dual-linear": {
        "strategy": "hetero",
        "controller": "dual",
        "extra": {"mode": "async", "lr_scaling": "linear"},
    },
    "dual-last": {
        "strategy": "hetero",
        "controller": "dual",
        "extra": {"mode": "async", "epoch_average": False},
    },
    "dual-paper": {
        "strategy": "hetero",
        "controller": "dual",
        "controller_options": {"update_factor": "ratio"},
        "extra": {"mode": "async"},
    },
    # paper 004's equal updates, as measured before issue 41; "local-prop": the default now
    "local": {
        "strategy": "hetero",
        "controller": "updates",
        "extra": {"mode": "local", "local_steps": "equal"},
    },
    "local-linear": {
        "strategy": "hetero",
        "controller": "updates",
        "extra": {"mode": "local", "lr_scaling": "linear", "local_steps": "equal"},
    },
    "local-prop": {"strategy": "hetero", "controller": "static", "extra": {"mode": "local"}},
}
#: Emulated speeds: the slow rank's Throttle delay per sample over the others' (``"slow"``:
#: the last rank; ``"slow-first"``: rank 0, which hosts the parameter server in the modes
#: that have one).
SPEEDS = {"equal": 1.0, "slow": 3.0, "slow-first": 3.0}


def rank_costs(speed: str, workers: int, sample_cost: float) -> list[float]:
    """Each rank's Throttle seconds per sample under the speed setting ``speed``.

    Example:
        >>> rank_costs("slow-first", 3, 1.0), rank_costs("slow", 2, 1.0)
        ([3.0, 1.0, 1.0], [1.0, 3.0])
    """
    costs = [sample_cost] * workers
    costs[0 if speed == "slow-first" else -1] *= SPEEDS[speed]
    return costs


def measure_convergence(
    task: str,
    workers: int,
    speeds: Sequence[str],
    seeds: Sequence[int],
    configs: Sequence[str],
    workdir: Path,
    sample_cost: float = 2e-4,
    epochs: int | None = None,
    lr_factor: float = 1.0,
    timeout: float | None = 1800.0,
    log: Callable[[str], None] | None = None,
    global_batch: int | None = None,
    accelerator: str = "cpu",
    fields: dict[str, Any] | None = None,
) -> dict[str, Any]:
    """Train ``task`` with each of ``configs`` on ``workers`` ranks for every speed
    setting and seed (the configurations of one seed back to back, in ``run_order``);
    returns ``{"task": ..., "runs": {speed: [{config: summary}, ...]}}``
    with one dict per seed (rank 0's summaries, with ``accuracy_curve``).

    ``lr_factor`` multiplies the task's learning rate (e.g. 2: is the rule safe at a learning
    rate above DDP's best?); ``epochs`` and ``global_batch`` (split evenly over the ranks)
    override the task's. ``accelerator="gpu"``: every rank on ``cuda:0`` (gloo), the speeds
    still set by ``Throttle`` (the modes' CUDA paths, on one GPU). ``fields``: more RunConfig
    fields for every run; with ``mps_shares`` among them the ranks' SM shares set the speeds
    and no ``Throttle`` runs (``speeds`` is then a label only; run under ``mps.mps_daemon``).
    """
    spec = TASKS[task]
    batch = global_batch or spec["global_batch"]
    if batch % workers:
        raise ValueError(f"The global batch {batch} does not split evenly over {workers} ranks.")
    common = {
        "model": spec["model"],
        "lr": spec["lr"] * lr_factor,
        "epochs": epochs or spec["epochs"],
        "workers": workers,
        "batch_size": batch // workers,
        "accelerator": accelerator,
        **(fields or {}),
    }
    if log is None:

        def log(line: str) -> None:
            print(line, file=sys.stderr, flush=True)

    runs: dict[str, list[dict[str, Any]]] = {}
    for speed in speeds:
        costs = None if common.get("mps_shares") else rank_costs(speed, workers, sample_cost)
        runs[speed] = []
        for seed in seeds:
            per_config: dict[str, Any] = {}
            for name in run_order(configs, seed):
                config = {
                    **common, "sample_cost": costs, "validate": False, "val_every_epoch": True,
                    **CONVERGENCE_CONFIGS[name], "seed": seed, "progress_bar": False,
                }  # fmt: skip
                began = time.perf_counter()
                try:
                    per_config[name] = launch(config, workdir, timeout=timeout)
                    curve = per_config[name]["accuracy_curve"]
                    outcome = " / ".join(f"{acc:.3f}" for _, acc, _ in curve)
                except Exception as err:  # a failed run is reported, not fatal
                    per_config[name] = {"error": f"{type(err).__name__}: {err}"[-4000:]}
                    outcome = f"FAILED ({type(err).__name__})"
                log(
                    f"{task} K={workers} {speed} seed {seed} {name}:"
                    f" {time.perf_counter() - began:.0f} s, val acc {outcome}"
                )
            runs[speed].append({name: per_config[name] for name in configs})
    return {"task": task, "workers": workers, "common": common, "runs": runs}


#: The simulator's name of each task, whose issue-41 targets (``target_misses``) apply.
SIM_TASKS = {"reverse": "transformer", "digits": "digits"}


def as_sim_run(summary: dict[str, Any]) -> tuple[list[float], list[float]] | None:
    """A real run's accuracy after each epoch and its seconds since the start of ``fit``
    (validation left out), as the simulator's ``Run``; ``None`` for a failed run."""
    curve = summary.get("accuracy_curve")
    if not curve:
        return None
    offset = summary.get("setup_s", 0.0)
    return [acc for _, acc, _ in curve], [offset + train_s for train_s, _, _ in curve]


def _fit_seconds(summary: dict[str, Any]) -> float:
    """A run's seconds from the start of ``fit`` to the end of training, validation left out."""
    return summary.get("setup_s", 0.0) + summary["train_s"]


def convergence_report(
    result: dict[str, Any],
    baseline: str = "ddp",
    misses: Callable[[str, str, dict[str, float]], list[str]] | None = None,
) -> str:
    """Per speed setting, seed and configuration: validation accuracy after each epoch, the
    seconds of ``fit`` (validation left out) and their ratio to DDP's, DDP's time / this
    one's to DDP's best accuracy less 1 point (same seed, from the start of ``fit``; "never":
    not reached), the final accuracy less DDP's at equal epochs, and the targets missed:
    ``misses(config, speeds, figures)`` (``figures`` of ``tta_figures`` with ``time_ratio``,
    this run's fit seconds over DDP's), by default issue 41's (``target_misses``)."""
    from lightning_hetero.bench.mode_sim import SLOW_TARGETS, target_misses, tta_figures

    sim_task = SIM_TASKS.get(result["task"])
    lines = [
        f"Task `{result['task']}`, {result['workers']} ranks: {result['common']}",
        "",
        "| speeds | seed | config | val acc per epoch | fit s (/ DDP's) | DDP time / time,"
        " to DDP's best - 1 point | final acc - DDP's (points) | targets missed |",
        "|---|---|---|---|---|---|---|---|",
    ]
    for speed, per_seed in result["runs"].items():
        for seed, runs in enumerate(per_seed):
            seed_value = runs.get(baseline, {}).get("config", {}).get("seed", seed)
            sim_runs = {name: as_sim_run(summary) for name, summary in runs.items()}
            ok = {name: run for name, run in sim_runs.items() if run is not None}
            figs = tta_figures(ok, baseline) if baseline in ok else {}
            seconds = {name: _fit_seconds(runs[name]) for name in ok}
            base_s = seconds.get(baseline, math.nan)
            for name, run in sim_runs.items():
                if run is None:
                    lines.append(f"| {speed} | {seed_value} | `{name}` | failed | | | | |")
                    continue
                accs = " / ".join(f"{acc:.3f}" for acc in run[0])
                fit_s = f"{seconds[name]:.1f} ({seconds[name] / base_s:.2f})"
                if name not in figs:
                    lines.append(f"| {speed} | {seed_value} | `{name}` | {accs} | {fit_s} | | | |")
                    continue
                fig = figs[name]
                ratio = "never" if fig["speedup"] == 0 else f"{fig['speedup']:.2f}x"
                fig = {**fig, "time_ratio": seconds[name] / base_s}
                mode = name.split("-")[0]  # "async-plain" is judged as "async"
                missed = "-"
                if name != baseline and misses is not None:
                    missed = ", ".join(misses(name, speed, fig))
                elif name != baseline and sim_task and mode in SLOW_TARGETS:
                    missed = ", ".join(target_misses(sim_task, mode, speed != "equal", fig))
                lines.append(
                    f"| {speed} | {seed_value} | `{name}` | {accs} | {fit_s} | {ratio}"
                    f" | {fig['acc_delta']:+.1f} | {missed or 'none'} |"
                )
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lightning_hetero.bench.modes --task reverse --workers 2 ...``"""
    import argparse
    import contextlib
    import json
    import tempfile

    parser = argparse.ArgumentParser(description=convergence_report.__doc__)
    parser.add_argument("--task", choices=list(TASKS), default="reverse")
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--speeds", nargs="+", choices=list(SPEEDS), default=list(SPEEDS))
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument(
        "--configs", nargs="+", choices=list(CONVERGENCE_CONFIGS), default=list(CONVERGENCE_CONFIGS)
    )
    parser.add_argument("--epochs", type=int, help="default: the task's")
    parser.add_argument(
        "--global-batch",
        type=int,
        help="the global batch, split evenly over the ranks (default: the task's, 128;"
        " issue 41 measured digits at 64)",
    )
    parser.add_argument("--lr-factor", type=float, default=1.0, help="times the task's lr")
    parser.add_argument(
        "--sample-cost",
        type=float,
        default=2e-4,
        help="Throttle seconds per sample of the equal ranks (the slow rank: 3 times it);"
        " default 2e-4, raise it (e.g. 2e-3) so the slow rank, not per-step overhead, sets"
        " the time to accuracy",
    )
    parser.add_argument(
        "--accelerator",
        choices=("cpu", "gpu"),
        default="cpu",
        help="gpu: every rank on cuda:0 over gloo, speeds still from Throttle (default: cpu)",
    )
    parser.add_argument(
        "--mps-shares",
        type=int,
        nargs="+",
        help="real heterogeneous GPU workers instead of Throttle: each rank's share of the SMs"
        " (CUDA_MPS_ACTIVE_THREAD_PERCENTAGE, one per rank; needs --accelerator gpu and"
        " nvidia-cuda-mps-control; --speeds is then ignored)",
    )
    parser.add_argument(
        "--resolution", type=int, help="digits: images upsampled to this size (default 8)"
    )
    parser.add_argument("--width", type=int, help="digits: the CNN's channel multiplier (1)")
    parser.add_argument(
        "--load-cost",
        type=float,
        help="Throttle: every rank's seconds of loading per sample, on the training thread"
        " (num_workers=0), beside --sample-cost's compute (default 0)",
    )
    parser.add_argument(
        "--step-cost", type=float, help="Throttle: every rank's fixed seconds per step (0)"
    )
    parser.add_argument(
        "--noise", type=float, help="Throttle: relative standard deviation of every delay (0)"
    )
    parser.add_argument("--json", type=Path, help="also write the raw summaries here")
    args = parser.parse_args(argv)
    given = ("resolution", "width", "load_cost", "step_cost", "noise")
    fields = {key: getattr(args, key) for key in given if getattr(args, key)}
    speeds = args.speeds
    daemon: Any = contextlib.nullcontext()
    if args.mps_shares:
        if args.accelerator != "gpu" or args.workers != [len(args.mps_shares)]:
            parser.error("--mps-shares needs --accelerator gpu and --workers with one per share")
        from lightning_hetero.bench.mps import mps_daemon

        fields["mps_shares"] = args.mps_shares
        speeds = ["mps " + "/".join(map(str, args.mps_shares))]
        daemon = mps_daemon()
    results = []
    with daemon, tempfile.TemporaryDirectory() as tmp:
        for workers in args.workers:
            result = measure_convergence(
                args.task, workers, speeds, args.seeds, args.configs, Path(tmp),
                sample_cost=args.sample_cost, epochs=args.epochs, lr_factor=args.lr_factor,
                global_batch=args.global_batch, accelerator=args.accelerator, fields=fields,
            )  # fmt: skip
            results.append(result)
            print(convergence_report(result), flush=True)
    if args.json:
        args.json.write_text(json.dumps(results, indent=1))


if __name__ == "__main__":
    main()
