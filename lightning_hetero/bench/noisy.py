"""A busy shared node (issue 33): uniform DDP against HeteroStrategy when ranks stall.

Two gloo ranks train the digits task (32 samples per rank under DDP, a global batch of
64). Each rank stalls ``--stall-s`` seconds (200 ms) on ``--stall-p`` (15%) of its
optimizer steps (``Throttle(stalls=...)``, drawn per seed, rank and step: DDP and the hetero
run stall at the same steps). Two clusters:

- ``slower``: rank 1 is 1.5x slower per sample (``--cost`` and ``1.5 * --cost`` seconds per
  sample); the speed-proportional split of 64 is ``[38.4, 25.6]``;
- ``equal``: both ranks at ``--cost``; the plan should stay uniform.

``--load-cost`` adds per-sample loading on the training thread on every rank (Lightning's
default ``num_workers=0``: ``Throttle(load_cost=...)``), which a smaller batch also saves;
the speed-proportional target and the ideal ratio then count it.

Every repeat runs DDP and HeteroStrategy back to back on each cluster (alternating which
goes first). The report gives the plan after every boundary (one per epoch), how many
boundaries the plan took to come within ``--tolerance`` of the target (the proportional
split; uniform for ``equal``) and whether it stayed there, and DDP's steady epoch time
over the hetero run's:

    nice -n 10 python -m lightning_hetero.bench.noisy --repeats 3 --epochs 6 --cost 0.005
"""

import argparse
import itertools
import os
import statistics
import tempfile
from pathlib import Path
from typing import Any

from lightning_hetero.bench._format import spread
from lightning_hetero.bench.run import run_pair
from lightning_hetero.planning import proportional_split

__all__ = [
    "CLUSTERS",
    "configs",
    "expected_step_s",
    "ideal",
    "main",
    "plan_figures",
    "ratio",
    "target",
    "wall_ratio",
]

#: Per-sample cost of each rank, in units of ``--cost``.
CLUSTERS = {"slower": [1.0, 1.5], "equal": [1.0, 1.0]}
BATCH_SIZE = 32  # per rank under DDP


def configs(
    cluster: str,
    epochs: int,
    cost: float,
    stall_p: float,
    stall_s: float,
    load_cost: float = 0.0,
) -> dict[str, Any]:
    """The pair's run config (``RunConfig`` fields) on ``cluster``; ``load_cost``: seconds of
    loading per sample on every rank's training thread."""
    return {
        "workers": len(CLUSTERS[cluster]),
        "sample_cost": [cost * units for units in CLUSTERS[cluster]],
        "load_cost": load_cost,
        "stalls": [stall_p, stall_s],
        "epochs": epochs,
        "batch_size": BATCH_SIZE,
        "validate": False,
    }


def target(cluster: str, cost: float = 1.0, load_cost: float = 0.0) -> list[float]:
    """The speed-proportional split of the global batch (not rounded): each rank's speed is
    one over its per-sample cost, loading included."""
    speeds = [1.0 / (cost * units + load_cost) for units in CLUSTERS[cluster]]
    total = BATCH_SIZE * len(speeds)
    return [total * s / sum(speeds) for s in speeds]


def expected_step_s(costs: list[float], plan: list[int], stall_p: float, stall_s: float) -> float:
    """The mean emulated step of ``plan``: the slowest rank's ``cost * b`` plus its stall,
    over every combination of ranks stalling (each independently with ``stall_p``)."""
    mean = 0.0
    for stalled in itertools.product((False, True), repeat=len(costs)):
        chance = 1.0
        for s in stalled:
            chance *= stall_p if s else 1.0 - stall_p
        step = max(c * b + (stall_s if s else 0.0) for c, b, s in zip(costs, plan, stalled))
        mean += chance * step
    return mean


def ideal(
    cluster: str, cost: float, stall_p: float, stall_s: float, load_cost: float = 0.0
) -> float:
    """DDP's mean emulated step over that of the rounded proportional plan (real compute left
    out): the ratio of epoch times the emulation allows."""
    costs = [cost * units + load_cost for units in CLUSTERS[cluster]]
    uniform = [BATCH_SIZE] * len(costs)
    best = proportional_split([1.0 / c for c in costs], sum(uniform))
    return expected_step_s(costs, uniform, stall_p, stall_s) / expected_step_s(
        costs, best, stall_p, stall_s
    )


def plan_figures(
    history: list[dict[str, Any]], goal: list[float], tolerance: float
) -> dict[str, Any]:
    """The plans after each boundary, their largest relative distance from ``goal``, the
    boundaries until the plan came within ``tolerance`` for good (``None``: it never
    did) and whether it stayed there once it first came within."""
    plans = [entry.get("next_batch_sizes", entry["batch_sizes"]) for entry in history]
    distances = [max(abs(b - g) / g for b, g in zip(plan, goal)) for plan in plans]
    inside = [d <= tolerance for d in distances]
    first = inside.index(True) if True in inside else None
    settled = next((i for i in range(len(inside)) if all(inside[i:])), None)
    return {
        "plans": plans,
        "distances": distances,
        "boundaries_to_reach": None if settled is None else settled + 1,
        "stays": first is not None and all(inside[first:]),
    }


def ratio(pair: dict[str, dict[str, Any]], skip: int) -> float:
    """DDP's steady epoch time over the hetero run's (epochs after the first ``skip``)."""
    ddp, hetero = (statistics.median(pair[k]["epoch_s"][skip:]) for k in ("ddp", "hetero"))
    return ddp / hetero


def wall_ratio(pair: dict[str, dict[str, Any]]) -> float:
    """DDP's whole ``fit`` over the hetero run's: every epoch, the first boundaries included."""
    return pair["ddp"]["fit_s"] / pair["hetero"]["fit_s"]


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_hetero.bench.noisy", description=__doc__.splitlines()[0]
    )
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--skip", type=int, default=2, help="epochs left out of the steady state")
    parser.add_argument("--cost", type=float, default=0.005, help="seconds per sample of rank 0")
    parser.add_argument("--stall-p", type=float, default=0.15, help="share of steps that stall")
    parser.add_argument("--stall-s", type=float, default=0.2, help="seconds of a stall")
    parser.add_argument(
        "--load-cost",
        type=float,
        default=0.0,
        help="seconds of loading per sample on every rank's training thread (num_workers=0)",
    )
    parser.add_argument("--clusters", nargs="+", choices=list(CLUSTERS), default=list(CLUSTERS))
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs <= args.skip or args.cost <= 0 or args.load_cost < 0:
        parser.error("need --repeats >= 1, --epochs > --skip, --cost > 0 and --load-cost >= 0")
    tolerances = {"slower": 0.15, "equal": 0.10}
    print("load average at the start: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))
    with tempfile.TemporaryDirectory() as folder:
        for cluster in args.clusters:
            config = configs(
                cluster, args.epochs, args.cost, args.stall_p, args.stall_s, args.load_cost
            )
            goal = target(cluster, args.cost, args.load_cost)
            tolerance = tolerances[cluster]
            ratios, walls, reached = [], [], []
            print(
                f"{cluster}: sample_cost {config['sample_cost']}, load_cost {args.load_cost},"
                f" stalls {config['stalls']},"
            )
            allowed = ideal(cluster, args.cost, args.stall_p, args.stall_s, args.load_cost)
            print(
                f"  target {[round(g, 1) for g in goal]} within {tolerance:.0%};"
                f" ideal DDP/hetero {allowed:.3f}x (emulated costs, stalls included)"
            )
            for repeat in range(args.repeats):
                pair = run_pair(config, repeat, Path(folder))
                figures = plan_figures(pair["hetero"]["history"], goal, tolerance)
                ratios.append(ratio(pair, args.skip))
                walls.append(wall_ratio(pair))
                reached.append(figures["boundaries_to_reach"])
                distances = [f"{d:.0%}" for d in figures["distances"]]
                print(
                    f"  repeat {repeat}: plans {figures['plans']}\n"
                    f"    distance {distances}, boundaries to reach"
                    f" {figures['boundaries_to_reach']}, stays {figures['stays']},"
                    f" DDP/hetero {ratios[-1]:.3f}x (whole fit {walls[-1]:.3f}x)"
                )
            print(f"  DDP/hetero steady epoch time (min / median / max): {spread(ratios)}")
            print(f"  DDP/hetero whole fit wall time (min / median / max): {spread(walls)}")
            print(f"  boundaries to reach per repeat: {reached}")
    print("load average at the end: {:.1f} {:.1f} {:.1f}".format(*os.getloadavg()))


if __name__ == "__main__":
    main()
