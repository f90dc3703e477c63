"""Benchmark: plain uniform DDP against HeteroStrategy on emulated heterogeneous clusters.

    python -m lightning_hetero.bench                      # HL1, HL2, HL4, HL8; 3 repeats
    python -m lightning_hetero.bench --levels HL4 --repeats 1 --epochs 5 --plot hl4.png
    python -m lightning_hetero.bench --levels HL4 --cluster loader  # loading + fixed costs
    python -m lightning_hetero.bench --simulate           # controllers on the simulator
    python -m lightning_hetero.bench --modes              # time-to-accuracy of the modes
    python -m lightning_hetero.bench --dual               # uniform large vs dual vs hybrid
    python -m lightning_hetero.bench --sharded            # FSDP2: ModelParallel vs hetero
    python -m lightning_hetero.bench --overhead           # per-step cost vs DDPStrategy
    python -m lightning_hetero.bench --boundary           # cost of one boundary by K
    python -m lightning_hetero.bench --planning           # one decision per controller by K

Every repeat runs both strategies back to back (alternating which goes first) on the
same emulated cluster: 4 gloo ranks on this machine, each slowed by
[`Throttle`][lightning_hetero.emulate.Throttle] in proportion to the CPU cores of
OmniLearn's Table I. Ratios are taken within a repeat; the report gives their
minimum, median and maximum over repeats.
"""

import argparse
import importlib.util
import json
import math
import statistics
import sys
import tempfile
from pathlib import Path
from typing import Any

from lightning_hetero.bench._extra import exit_without_extra

if __name__ == "__main__":  # a core install: say what to install, before importing it
    exit_without_extra("python -m lightning_hetero.bench")

from tqdm import tqdm  # noqa: E402

from lightning_hetero.bench._format import spread  # noqa: E402
from lightning_hetero.bench.dual import DUAL_CONFIGS, dual_configs  # noqa: E402
from lightning_hetero.bench.modes import CONFIGS, measure_modes, modes_report  # noqa: E402
from lightning_hetero.bench.run import run_pair  # noqa: E402
from lightning_hetero.bench.simulate import (  # noqa: E402
    DEFAULT_CONTROLLERS,
    predictor_table,
    simulate_report,
    split_spec,
)
from lightning_hetero.planning import (  # noqa: E402
    HETEROGENEITY_LEVELS,
    BatchLimits,
    ClusterSimulator,
    SimulatedWorker,
    SimulationResult,
    StepTimeCurve,
    allowed_speedup,
    ideal_speedup,
    optimal_step_time,
    solve_plan,
)
from lightning_hetero.planning.scenarios import SCENARIOS  # noqa: E402
from lightning_hetero.plots import INSTALL as PLOT_INSTALL  # noqa: E402
from lightning_hetero.plots import plot_speedup  # noqa: E402

#: Columns of the report, with how each is printed.
COLUMNS = {
    "speedup": "epoch-time speedup hetero vs DDP",
    "ideal": "ideal speedup sum(X)/(K min X), nominal speeds",
    "fraction": "speedup / nominal ideal",
    "fraction_measured": "speedup / ideal from measured speeds",
    "allowed": "speedup the measured per-rank step-time curves allow (fixed costs included)",
    "fraction_allowed": "speedup / allowed",
    "gain_capture": "(speedup - 1) / (allowed - 1): the share of the allowed gain reached",
    "allowed_step": "allowed, with the step's time outside every rank's compute (the gradient"
    " all-reduce, the loop; measured at the uniform plan's boundary) added to both plans: no"
    " plan shrinks it",
    "fraction_step": "speedup / allowed_step",
    "plan_fraction": "the curves' optimal compute step / the last plan's slowest measured"
    " compute step (the controller's share of the gap)",
    "balance": "balance efficiency E at the last boundary",
    "adjustments_to_095": "adjustments until E >= 0.95",
    "plan_error": "the last plan's largest relative distance from the optimal plan of the"
    " measured per-rank step-time curves (not with --cluster floor, which has many)",
    "optimal_s": "the emulated costs' optimal step (loading, fixed costs, floors; real compute"
    " left out) / the uniform plan's: 1 / the speedup the emulation allows",
    "reverts": "plan changes undone because steps got slower",
    "overhead": "time spent at boundaries (all-gather + controller + apply) / training time",
    "overhead_local": "the same without the all-gather (whose wait for the last rank to"
    " arrive would be spent in the next all-reduce anyway)",
}


#: Each rank's batch under uniform DDP (RunConfig's default).
_BATCH_SIZE = 32

#: Emulated clusters of the level benchmark: what a rank's step costs besides real compute.
CLUSTERS = {
    "devices": "rank k's device is slower: --base-cost / cores_k seconds per sample",
    "loader": "devices, plus loading on the training thread (num_workers=0) of --base-cost /"
    " max(cores) s per sample on every rank, a fixed 10%% of the slowest rank's uniform"
    " device time per step, 3%% noise",
    "floor": "loader, plus a floor on every rank but the fastest: its device part never"
    " takes less than at the uniform plan",
}


def cluster_costs(cluster: str, cores: tuple[int, ...], base_cost: float, batch_size: int) -> dict:
    """The ``RunConfig`` cost fields of ``cluster`` (see
    ``CLUSTERS``) for ranks with ``cores`` and a uniform ``batch_size`` per rank."""
    device = [base_cost / c for c in cores]
    costs: dict[str, Any] = {"sample_cost": device}
    if cluster == "devices":
        return costs
    costs["load_cost"] = base_cost / max(cores)
    costs["step_cost"] = 0.1 * max(device) * batch_size
    costs["noise"] = 0.03
    if cluster == "floor":
        fastest = cores.index(max(cores))
        costs["floor"] = [0.0 if k == fastest else d * batch_size for k, d in enumerate(device)]
    return costs


def emulated_workers(costs: dict[str, Any]) -> list[SimulatedWorker]:
    """The emulated step-time curves of a cluster's cost fields (real compute left out)."""
    device = costs["sample_cost"]
    floors = costs.get("floor", [0.0] * len(device))
    return [
        SimulatedWorker(
            d, costs.get("step_cost", 0.0), floor_s=f, load_s=costs.get("load_cost", 0.0)
        )
        for d, f in zip(device, floors)
    ]


def _emulated_optimum(costs: dict[str, Any] | None) -> float:
    """The emulated curves' optimal step time over the uniform plan's (``nan`` without
    the cluster's costs)."""
    if not costs:
        return math.nan
    sim = ClusterSimulator(emulated_workers(costs))
    limits = BatchLimits.build(len(sim.workers), _BATCH_SIZE * len(sim.workers))
    return sim.optimal_step_s(limits, 0) / max(sim.true_step_s([_BATCH_SIZE] * len(sim.workers), 0))


def _steady(epoch_s: list[float], skip: int) -> float:
    return statistics.median(epoch_s[skip:])


def measure(
    levels: list[str],
    repeats: int,
    epochs: int,
    base_cost: float,
    workdir: Path,
    hetero_options: dict[str, Any] | None = None,
    sharded: bool = False,
    cluster: str = "devices",
) -> dict[str, Any]:
    """Run every level ``repeats`` times with both strategies; returns the raw run summaries.

    ``cluster``: what the emulated ranks' steps cost (``CLUSTERS``); each pair keeps its
    cost fields under ``"costs"``.

    ``sharded``: FSDP2 (``ModelParallelStrategy`` against ``HeteroFSDPStrategy``) instead of
    DDP.

    ``hetero_options`` are extra ``RunConfig`` fields for
    the HeteroStrategy runs, e.g. ``{"adjust_every": 1}``.
    """
    raw: dict[str, list[dict[str, Any]]] = {}
    total = len(levels) * repeats * 2
    with tqdm(total=total, desc="benchmark runs", unit="run") as progress:
        for level in levels:
            cores = HETEROGENEITY_LEVELS[level]
            costs = cluster_costs(cluster, cores, base_cost, _BATCH_SIZE)
            common = {"workers": 4, "epochs": epochs, "validate": False, **costs}
            raw[level] = [
                {
                    **run_pair(
                        common,
                        repeat,
                        workdir,
                        hetero_options,
                        progress,
                        f"{level} ",
                        sharded=sharded,
                    ),
                    "costs": costs,
                }
                for repeat in range(repeats)
            ]
    return raw


def measured_curves(history: list[dict[str, Any]]) -> list[list[tuple[int, float]]]:
    """Per rank, ``(batch_size, median compute seconds per step)`` at each size it ran."""
    seen: list[dict[int, list[float]]] = [{} for _ in history[0]["batch_sizes"]]
    for entry in history:
        for by_size, b, t in zip(seen, entry["batch_sizes"], entry["compute_times"]):
            by_size.setdefault(int(b), []).append(float(t))
    return [[(b, statistics.median(ts)) for b, ts in sorted(s.items())] for s in seen]


def ratios(level: str, pair: dict[str, Any], skip: int) -> dict[str, float]:
    """The report's figures for one repeat of one level."""
    cores = HETEROGENEITY_LEVELS[level]
    ddp, hetero = pair["ddp"], pair["hetero"]
    ddp_epoch, hetero_epoch = _steady(ddp["epoch_s"], 1), _steady(hetero["epoch_s"], skip)
    speedup = ddp_epoch / hetero_epoch
    ideal = ideal_speedup(cores)
    history = hetero["history"]
    first = history[0]
    ideal_measured = ideal_speedup(
        [b / t for b, t in zip(first["batch_sizes"], first["compute_times"])]
    )
    # what the fitted curves allow: below the nominal ideal by the ranks' fixed costs
    limits = BatchLimits.build(len(first["batch_sizes"]), sum(first["batch_sizes"]))
    observations = measured_curves(history)
    allowed = allowed_speedup(observations, limits)
    optimal_s = optimal_step_time([StepTimeCurve.fit(points) for points in observations], limits)
    # the uniform plan's step outside every rank's compute: the same under any plan
    outside_s = max(0.0, first.get("step_time", math.nan) - max(first["compute_times"]))
    if not math.isfinite(outside_s):
        outside_s = 0.0
    allowed_step = (allowed * optimal_s + outside_s) / (optimal_s + outside_s)
    to_095 = SimulationResult(history).adjustments_to_balance(0.95)
    plan_error = math.nan
    if "floor" not in pair.get("costs", {}):  # a floor leaves many optimal plans
        best = solve_plan([StepTimeCurve.fit(points) for points in observations], limits)
        last = history[-1].get("next_batch_sizes", history[-1]["batch_sizes"])
        plan_error = max(abs(b - o) / o for b, o in zip(last, best))
    boundaries_s = sum(e["boundary_s"] for e in history)
    # the same without the all-gather, whose wait for the last rank would be spent anyway
    local_s = sum(e["boundary_s"] - e.get("gather_s", 0.0) for e in history)
    return {
        "speedup": speedup,
        "ideal": ideal,
        "fraction": speedup / ideal,
        "fraction_measured": speedup / ideal_measured,
        "allowed": allowed,
        "fraction_allowed": speedup / allowed,
        "gain_capture": (speedup - 1) / (allowed - 1) if allowed > 1 else math.nan,
        "allowed_step": allowed_step,
        "fraction_step": speedup / allowed_step,
        "plan_fraction": optimal_s / max(history[-1]["compute_times"]),
        "balance": history[-1]["balance"],
        "adjustments_to_095": float("nan") if to_095 is None else float(to_095),
        "plan_error": plan_error,
        "optimal_s": _emulated_optimum(pair.get("costs")),
        "reverts": float(sum(bool(e.get("reverted")) for e in history)),
        # all boundaries' cost (gathering, controller, broadcast) over the training time
        "overhead": boundaries_s / sum(hetero["epoch_s"]),
        "overhead_local": local_s / sum(hetero["epoch_s"]),
    }


def report(raw: dict[str, Any], skip: int) -> str:
    """A Markdown table: min / median / max of each figure over repeats."""
    lines = [
        "| level | " + " | ".join(COLUMNS) + " |",
        "|---|" + "---|" * len(COLUMNS),
    ]
    for level, pairs in raw.items():
        figures = [ratios(level, pair, skip) for pair in pairs]
        cells = []
        for key in COLUMNS:
            cells.append(spread([f[key] for f in figures]))
        lines.append(f"| {level} | " + " | ".join(cells) + " |")
    legend = "\n".join(f"- `{key}`: {text}" for key, text in COLUMNS.items())
    return "\n".join(lines) + "\n\nEach cell: min / median / max over repeats.\n" + legend + "\n"


#: Where the level benchmark's chart goes without --plot or --json (git-ignored folder).
DEFAULT_CHART = Path("bench_logs", "speedup.png")


def speedup_rows(raw: dict[str, Any], skip: int, controller: str) -> list[dict[str, Any]]:
    """The rows of [`plot_speedup`][lightning_hetero.plots.plot_speedup]: each level's speedups over
    repeats and its ideal."""
    rows = []
    for level, pairs in raw.items():
        figures = [ratios(level, pair, skip) for pair in pairs]
        speedups = [f["speedup"] for f in figures]
        rows.append(
            {
                "level": level,
                "controller": controller,
                "ideal": figures[0]["ideal"],
                "speedup": speedups,
            }
        )
    return rows


def _chart_path(parser: argparse.ArgumentParser, args: argparse.Namespace) -> Path | None:
    """Where the speedup chart goes (``None``: no chart), checked before the runs."""
    if args.plot is False:
        return None
    path = args.plot or (args.json.with_suffix(".png") if args.json else DEFAULT_CHART)
    if importlib.util.find_spec("matplotlib") is None:
        if args.plot:
            parser.error(f"--plot needs matplotlib: {PLOT_INSTALL}")
        print(f"no speedup chart: matplotlib is not installed ({PLOT_INSTALL})", file=sys.stderr)
        return None
    return path


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_hetero.bench", description=__doc__.split("\n")[0]
    )
    parser.add_argument(
        "--levels",
        nargs="+",
        choices=list(HETEROGENEITY_LEVELS),
        help="default: all levels; HL4 HL8 with --modes",
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, help="default: 6; 8 with --modes")
    parser.add_argument(
        "--base-cost",
        type=float,
        help="emulated seconds per sample on a 1-core worker (default: 0.048; 0 with --dual,"
        " whose time savings come from real compute at lower resolution)",
    )
    parser.add_argument(
        "--skip", type=int, default=2, help="hetero epochs left out of the steady state"
    )
    parser.add_argument(
        "--adjust-every",
        default="epoch",
        help="HeteroStrategy(adjust_every=...): 'epoch' or a number of steps",
    )
    parser.add_argument(
        "--controller",
        default="proportional",
        metavar="SPEC",
        help="the hetero runs' controller, name[:option=value,...]",
    )
    parser.add_argument(
        "--cluster",
        choices=list(CLUSTERS),
        default="devices",
        help="what the emulated ranks' steps cost: "
        + "; ".join(f"{name}: {text}" for name, text in CLUSTERS.items()),
    )
    parser.add_argument("--json", type=Path, help="also write the raw runs here")
    parser.add_argument(
        "--plot",
        type=Path,
        default=None,
        metavar="PATH",
        help="the level benchmark's chart of speedup vs ideal (PNG, needs matplotlib); default:"
        f" the --json path with .png, else {DEFAULT_CHART}",
    )
    parser.add_argument(
        "--no-plot", dest="plot", action="store_false", default=None, help="draw no chart"
    )
    parser.add_argument(
        "--sharded",
        action="store_true",
        help="sharded training (FSDP2): ModelParallelStrategy vs HeteroFSDPStrategy",
    )
    simulated = parser.add_argument_group(
        "simulator", "compare controllers on simulated clusters instead of training"
    )
    simulated.add_argument("--simulate", action="store_true", help="run the simulator report")
    simulated.add_argument(
        "--controllers",
        nargs="+",
        default=DEFAULT_CONTROLLERS,
        metavar="SPEC",
        help="controllers as name[:option=value,...], e.g. lbbsp:predictor=narx",
    )
    simulated.add_argument("--scenarios", nargs="+", default=list(SCENARIOS), choices=SCENARIOS)
    simulated.add_argument("--seeds", type=int, default=5, help="noise seeds per scenario")
    simulated.add_argument(
        "--verbose",
        action="store_true",
        help="print the controllers' warnings (by default only counted under the table)",
    )
    simulated.add_argument(
        "--no-predictors",
        dest="predictors",
        action="store_false",
        help="leave out the LB-BSP predictor table",
    )
    modes = parser.add_argument_group(
        "modes",
        "time-to-accuracy of uniform DDP and HeteroStrategy's modes (validation every epoch)",
    )
    modes.add_argument("--modes", action="store_true", help="run the mode benchmark")
    modes.add_argument(
        "--target",
        type=float,
        nargs="+",
        default=[0.9],
        help="validation accuracy of time-to-accuracy; one table per target",
    )
    modes.add_argument(
        "--configs",
        nargs="+",
        metavar="NAME",
        help=f"configurations to compare (default: all): {', '.join(CONFIGS)}; with --dual:"
        f" {', '.join(DUAL_CONFIGS)}",
    )
    dual = parser.add_argument_group(
        "dual",
        "dual batch size learning on 4 equal workers: uniform large batch vs dual batch vs"
        " hybrid with progressive resizing (digits at 32x32, validation every epoch)",
    )
    dual.add_argument("--dual", action="store_true", help="run the dual batch size benchmark")
    dual.add_argument("--small-workers", type=int, default=2, help="small-batch workers (of 4)")
    dual.add_argument("--extra-time-ratio", type=float, default=1.05, help="k > 1 (paper 003)")
    dual.add_argument("--large-batch", type=int, default=32, help="B_L, the large batch")
    costs = parser.add_argument_group(
        "costs", "the plugin's own costs (no emulated cluster; --repeats applies)"
    )
    costs.add_argument(
        "--overhead",
        action="store_true",
        help="per-step time of HeteroStrategy vs DDPStrategy on a tiny model, 2 ranks",
    )
    costs.add_argument("--steps", type=int, default=400, help="timed steps per --overhead run")
    costs.add_argument(
        "--interleave",
        type=int,
        default=0,
        metavar="BLOCK",
        help="with --overhead --adjust-every N: one run per repeat whose boundaries are on and"
        " off in alternate blocks of BLOCK batches (e.g. 128, with --steps 4000); the ratio of"
        " on to off blocks' mean step, robust to the load's drift between runs",
    )
    costs.add_argument(
        "--boundary", action="store_true", help="cost of one re-planning boundary by K"
    )
    costs.add_argument(
        "--planning", action="store_true", help="one decision of every controller by K"
    )
    args = parser.parse_args(argv)
    if args.interleave and (not args.overhead or args.interleave < 2):
        parser.error(
            "--interleave BLOCK (at least 2 batches) goes with --overhead --adjust-every N"
        )
    chosen = args.simulate + args.modes + args.dual + args.overhead + args.boundary + args.planning
    if chosen > 1:
        parser.error(
            "--simulate, --modes, --dual, --overhead, --boundary and --planning are separate"
            " benchmarks; pick one"
        )
    if args.overhead or args.boundary or args.planning:
        _run_costs(parser, args)
        return
    if args.base_cost is None:
        args.base_cost = 0.0 if args.dual else 0.048
    if args.simulate:
        if args.seeds < 1:
            parser.error("need --seeds >= 1")
        try:
            print(
                simulate_report(
                    args.controllers, args.scenarios, range(args.seeds), verbose=args.verbose
                )
            )
            if args.predictors:
                print(predictor_table(range(args.seeds)))
        except ValueError as err:
            parser.error(str(err))
        return
    if args.modes:
        _run_modes(parser, args)
        return
    if args.dual:
        _run_dual(parser, args)
        return
    args.levels = args.levels or list(HETEROGENEITY_LEVELS)
    args.epochs = 6 if args.epochs is None else args.epochs
    if args.repeats < 1 or args.epochs <= args.skip:
        parser.error("need --repeats >= 1 and --epochs > --skip")
    adjust_every = args.adjust_every
    if adjust_every != "epoch":
        if not adjust_every.isdigit() or int(adjust_every) < 1:
            parser.error(f"--adjust-every must be 'epoch' or an integer >= 1, got {adjust_every!r}")
        adjust_every = int(adjust_every)
    try:
        name, options = split_spec(args.controller)
    except ValueError as err:
        parser.error(str(err))
    hetero = {"adjust_every": adjust_every, "controller": name, "controller_options": options}
    chart = _chart_path(parser, args)
    with tempfile.TemporaryDirectory() as tmp:
        raw = measure(
            args.levels,
            args.repeats,
            args.epochs,
            args.base_cost,
            Path(tmp),
            hetero,
            sharded=args.sharded,
            cluster=args.cluster,
        )
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    print(report(raw, args.skip))
    if chart is not None:
        label = f"{args.controller} (FSDP2)" if args.sharded else args.controller
        chart.parent.mkdir(parents=True, exist_ok=True)
        plot_speedup(speedup_rows(raw, args.skip, label), chart)
        print(f"chart: {chart}")


def _check_accuracy_options(
    parser: argparse.ArgumentParser, args: argparse.Namespace, epochs: int, known: list[str]
) -> list[str]:
    """Validate the options of the accuracy benchmarks; returns the configurations."""
    if args.repeats < 1 or epochs < 1:
        parser.error("need --repeats >= 1 and --epochs >= 1")
    for target in args.target:
        if not 0.0 < target <= 1.0:
            parser.error(f"--target must be an accuracy in (0, 1], got {target}")
    if args.base_cost < 0:
        parser.error(f"--base-cost must be >= 0, got {args.base_cost}")
    configs = list(dict.fromkeys(args.configs or known))
    unknown = [name for name in configs if name not in known]
    if unknown:
        parser.error(f"unknown --configs {unknown}; choose from {known}")
    return configs


#: The overhead pair's dead-band: no measured gain passes it, so both runs keep the uniform
#: plan and differ only in their boundaries.
_HOLD_DEADBAND = 0.95


def _run_interleaved(args: argparse.Namespace, options: dict[str, Any]) -> None:
    from lightning_hetero.bench._format import spread
    from lightning_hetero.bench.overhead import measure_interleaved

    with tqdm(total=args.repeats, desc="interleaved", unit="repeat") as bar:
        runs = measure_interleaved(
            args.repeats, args.steps, args.interleave, options, progress=bar, control=True
        )
    if args.json:
        args.json.write_text(json.dumps(runs, indent=1))
    cells = [
        spread([r[key] for r in runs], fmt, scale)
        for key, fmt, scale in (
            ("ratio", ".3f", 1), ("cpu_ratio", ".3f", 1), ("thread_ratio", ".3f", 1),
            ("control_ratio", ".3f", 1), ("control_cpu_ratio", ".3f", 1),
            ("control_thread_ratio", ".3f", 1), ("boundary_share", ".4f", 1),
            ("step_s", ".3f", 1e3), ("interval", ".0f", 1), ("boundaries", ".0f", 1),
        )
    ]  # fmt: skip
    print(
        "| boundaries on / off: wall time | CPU time | its training thread's |"
        " A/A control: wall time | CPU time | training thread |"
        " boundaries / on-block time | step (ms) | interval (batches) | boundaries |\n"
        "|---|---|---|---|---|---|---|---|---|---|\n| " + " | ".join(cells) + " |"
    )


def _run_costs(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    if args.repeats < 1 or args.steps < 1:
        parser.error("need --repeats >= 1 and --steps >= 1")
    if args.overhead:
        from lightning_hetero.bench.overhead import measure_overhead, overhead_table

        every, options, baseline = args.adjust_every, None, None
        names = ("DDPStrategy", "HeteroStrategy")
        if every != "epoch":  # re-planning every N steps against once an epoch
            if not every.isdigit() or int(every) < 1:
                parser.error(f"--adjust-every must be 'epoch' or an integer >= 1, got {every!r}")
            # both keep the uniform plan (a dead-band no gain passes): the pair then differs
            # only in the boundaries' work, not in where the timings of equal ranks on
            # 2.5 ms steps move the plan (they did move it, and made steps slower)
            hold = {"deadband": _HOLD_DEADBAND}
            options = {"adjust_every": int(every), **hold}
            baseline = {"adjust_every": "epoch", **hold}
            names = ('adjust_every="epoch"', f"adjust_every={int(every)}")
            if args.interleave:
                _run_interleaved(args, options)
                return
        elif args.interleave:
            parser.error("--interleave needs --adjust-every N (boundaries to turn on and off)")
        with tqdm(total=2 * args.repeats, desc="overhead", unit="run") as bar:
            pairs = measure_overhead(
                args.repeats, args.steps, defaults=True, progress=bar, options=options,
                baseline=baseline,
            )  # fmt: skip
        if args.json:
            args.json.write_text(json.dumps(pairs, indent=1))
        print(overhead_table(pairs, names))
    elif args.boundary:
        from lightning_hetero.bench.boundary_cost import boundary_table

        print(boundary_table(repeats=args.repeats))
    else:
        from lightning_hetero.bench.planning_cost import planning_cost_table

        print(planning_cost_table(repeats=args.repeats))


def _run_modes(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    levels = args.levels or ["HL4", "HL8"]
    epochs = 8 if args.epochs is None else args.epochs
    configs = _check_accuracy_options(parser, args, epochs, list(CONFIGS))
    with tempfile.TemporaryDirectory() as tmp:
        raw = measure_modes(levels, args.repeats, epochs, args.base_cost, Path(tmp), configs)
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    print("\n".join(modes_report(raw, target, configs) for target in args.target))


def _run_dual(parser: argparse.ArgumentParser, args: argparse.Namespace) -> None:
    levels = args.levels or ["HL1"]
    epochs = 14 if args.epochs is None else args.epochs
    configs = _check_accuracy_options(parser, args, epochs, list(DUAL_CONFIGS))
    if not 0 < args.small_workers < 4 or args.extra_time_ratio <= 1 or args.large_batch < 2:
        parser.error("need 0 < --small-workers < 4, --extra-time-ratio > 1, --large-batch >= 2")
    try:
        catalog = dual_configs(epochs, args.small_workers, args.extra_time_ratio, configs)
    except ValueError as err:
        parser.error(str(err))
    common = {"resolution": 32, "batch_size": args.large_batch}
    with tempfile.TemporaryDirectory() as tmp:
        raw = measure_modes(
            levels,
            args.repeats,
            epochs,
            args.base_cost,
            Path(tmp),
            configs,
            catalog=catalog,
            common=common,
        )
    if args.json:
        args.json.write_text(json.dumps(raw, indent=1))
    for target in args.target:
        print(modes_report(raw, target, configs, baseline="uniform-large"))


if __name__ == "__main__":
    main()
