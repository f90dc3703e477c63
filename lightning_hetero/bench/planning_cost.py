"""What one controller decision costs at scale (DESIGN section 6: 1,024 ranks under 1 ms).

    python -m lightning_hetero.bench.planning_cost
    python -m lightning_hetero.bench.planning_cost --sizes 1024 4096 --repeats 50
    python -m lightning_hetero.bench.planning_cost --controllers proportional lbbsp:predictor=last

Every controller of ``CONTROLLERS`` decides, for
``K`` ranks, on realistic inputs: ranks cycle through the speeds of OmniLearn's
heterogeneity levels (HL8, HL4, HL2, HL1: 16 ranks per cycle), every rank runs the
uniform plan (64 samples), which needs changing, their compute times carry 2% noise, the
per-rank maximum is 160 samples (the fastest ranks hit it) and every rank reports
resource readings. The table gives, per controller and ``K``, the minimum, median and
maximum wall time of one ``controller.update(...)`` call in microseconds, after one
untimed call that builds the controller's per-rank state.

``lbbsp:predictor=narx`` is timed before its networks are trained (the EMA fallback plus
the bookkeeping of the observations): a trained NARX predictor trains one small network
per rank at every boundary (paper 001), milliseconds per rank whatever the planning
code does. ``--narx-sizes`` times such trained decisions separately.

Standard library and the planning layer only: the numbers are those of the code that
runs at every boundary of a real run.
"""

import argparse
import random
import time
from collections.abc import Callable, Sequence

from lightning_hetero.bench._format import spread
from lightning_hetero.bench.simulate import parse_spec
from lightning_hetero.planning.base import BatchLimits, Controller, RankStats
from lightning_hetero.planning.registry import CONTROLLERS
from lightning_hetero.planning.simulator import HETEROGENEITY_LEVELS

__all__ = [
    "DEFAULT_CONTROLLERS",
    "DEFAULT_SIZES",
    "VARIANTS",
    "cluster_inputs",
    "decision_times",
    "main",
    "narx_cost_table",
    "planning_cost_table",
]

#: Variants timed besides a registered controller's defaults.
VARIANTS: dict[str, list[str]] = {
    "proportional": ["proportional", "proportional:renormalization=omnilearn"],
    "lbbsp": ["lbbsp:predictor=last", "lbbsp:predictor=ema", "lbbsp:predictor=narx"],
}

#: Controllers timed by default, as ``name[:option=value,...]`` specs: every registered
#: controller, the OmniLearn renormalisation and each LB-BSP predictor.
DEFAULT_CONTROLLERS = [spec for name in CONTROLLERS for spec in VARIANTS.get(name, [name])]

#: Cluster sizes timed by default.
DEFAULT_SIZES = (4, 64, 256, 1024, 4096)

#: Levels the ranks cycle through, most heterogeneous first (so 4 ranks are HL8).
_LEVELS = ("HL8", "HL4", "HL2", "HL1")
_PER_RANK = 64
_MAX_PER_RANK = 160
_SAMPLE_S = 0.001
#: Most timed NARX decisions before its default warm-up ends (1 untimed call first).
_NARX_UNTRAINED = 20


def _factory(spec: str) -> Callable[[], Controller]:
    """``"name:key=value,..."`` -> a factory of fresh controllers (checked once now)."""
    return parse_spec(spec)[1]


def cluster_inputs(
    size: int, seed: int = 0
) -> tuple[list[int], list[float], BatchLimits, list[RankStats]]:
    """Inputs of one boundary for ``size`` ranks: plan, compute times, limits, readings.

    Rank ``k`` has the speed of core count ``k % 16`` of the HL8, HL4, HL2, HL1 cycle;
    the plan is uniform, so it needs changing.

    Example:
        >>> plan, times, limits, stats = cluster_inputs(4)
        >>> plan, limits.global_batch_size, [round(t / times[3]) for t in times]
        ([64, 64, 64, 64], 256, [5, 5, 8, 1])
    """
    cores = [c for level in _LEVELS for c in HETEROGENEITY_LEVELS[level]]
    fastest = max(cores)
    rng = random.Random(seed)
    plan = [_PER_RANK] * size
    times = [
        _PER_RANK * _SAMPLE_S * fastest / cores[k % len(cores)] * (1.0 + rng.gauss(0.0, 0.02))
        for k in range(size)
    ]
    limits = BatchLimits.build(size, _PER_RANK * size, 1, _MAX_PER_RANK)
    stats = [
        RankStats(
            memory_used=_PER_RANK / _MAX_PER_RANK,
            cpu_available=cores[k % len(cores)] / fastest,
            memory_available=0.5,
        )
        for k in range(size)
    ]
    return plan, times, limits, stats


def decision_times(
    factory: Callable[[], Controller], size: int, repeats: int, warmup: int = 1
) -> list[float]:
    """Seconds of ``repeats`` timed ``update`` calls of one controller at ``size`` ranks.

    The controller sees fresh noise at every call and always the uniform plan, so every
    decision has a plan to change; ``warmup`` untimed calls come first.
    """
    controller = factory()
    seconds = []
    for call in range(warmup + repeats):
        plan, times, limits, stats = cluster_inputs(size, seed=call)
        start = time.perf_counter()
        controller.update(plan, times, limits, stats)
        elapsed = time.perf_counter() - start
        if call >= warmup:
            seconds.append(elapsed)
    return seconds


def planning_cost_table(
    sizes: Sequence[int] = DEFAULT_SIZES,
    repeats: int = 15,
    controllers: Sequence[str] = tuple(DEFAULT_CONTROLLERS),
) -> str:
    """Time one decision of each controller at each cluster size; returns a Markdown table.

    Each cell is min / median / max microseconds over ``repeats`` decisions.
    """
    if repeats < 1:
        raise ValueError(f"`repeats` must be >= 1, got {repeats}.")
    factories = [(spec, _factory(spec)) for spec in controllers]
    lines = [
        "| controller | " + " | ".join(f"K={k}" for k in sizes) + " |",
        "|---|" + "---|" * len(sizes),
    ]
    for spec, factory in factories:
        # NARX trains after 20 samples (23 boundaries): time it untrained (see narx_cost_table)
        calls = min(repeats, _NARX_UNTRAINED) if "predictor=narx" in spec else repeats
        cells = [spread(decision_times(factory, k, calls), ".0f", 1e6) for k in sizes]
        lines.append(f"| `{spec}` | " + " | ".join(cells) + " |")
    return (
        "\n".join(lines)
        + f"\n\nEach cell: min / median / max microseconds of one `controller.update(...)`"
        f" over {repeats} decisions (after one untimed call). Ranks cycle through the HL8,"
        f" HL4, HL2 and HL1 speeds, start from a uniform plan of {_PER_RANK} samples with a"
        f" maximum of {_MAX_PER_RANK}, and time with 2% noise. Target (DESIGN section 6):"
        " under 1,000 us at K=1024 and 5,000 us at K=4096. `lbbsp:predictor=narx` runs"
        f" untrained here, at most {_NARX_UNTRAINED} decisions (see `--narx-sizes`).\n"
    )


def narx_cost_table(sizes: Sequence[int] = (4, 16), repeats: int = 3) -> str:
    """One LB-BSP decision with *trained* NARX predictors (one network trained per rank).

    The predictors keep their default options; the untimed calls fill the warm-up (20
    complete samples, each needing 3 boundaries of readings behind it), so every timed
    decision trains one network per rank, as every boundary of a real run does then.
    """
    spec = "lbbsp:predictor=narx"
    factory = _factory(spec)
    lines = ["| controller | " + " | ".join(f"K={k}" for k in sizes) + " |"]
    lines.append("|---|" + "---|" * len(sizes))
    cells = [spread(decision_times(factory, k, repeats, warmup=23), ".0f", 1e6) for k in sizes]
    lines.append(f"| `{spec}` (trained) | " + " | ".join(cells) + " |")
    return (
        "\n".join(lines)
        + "\n\nTrained NARX: every decision trains one small network per rank (torch, CPU,"
        " float64), so its cost is K times the training of one network, milliseconds each,"
        " whatever the planning code does.\n"
    )


def main(argv: list[str] | None = None) -> None:
    """Print the planning-cost table (``python -m lightning_hetero.bench.planning_cost``)."""
    parser = argparse.ArgumentParser(
        prog="python -m lightning_hetero.bench.planning_cost",
        description="Wall time of one controller decision per cluster size.",
    )
    parser.add_argument("--sizes", type=int, nargs="+", default=list(DEFAULT_SIZES))
    parser.add_argument("--repeats", type=int, default=15, help="timed decisions per cell")
    parser.add_argument(
        "--controllers",
        nargs="+",
        default=DEFAULT_CONTROLLERS,
        help="name[:option=value,...] specs (default: every controller)",
    )
    parser.add_argument(
        "--narx-sizes",
        type=int,
        nargs="*",
        default=[],
        help="also time trained NARX decisions at these sizes (slow: one training per rank)",
    )
    args = parser.parse_args(argv)
    if any(k < 1 for k in [*args.sizes, *args.narx_sizes]):
        parser.error("cluster sizes must be >= 1")
    if args.repeats < 1:
        parser.error("--repeats must be >= 1")
    for spec in args.controllers:
        try:
            _factory(spec)
        except (TypeError, ValueError) as error:
            parser.error(f"{spec}: {error}")
    print(planning_cost_table(args.sizes, args.repeats, args.controllers))
    if args.narx_sizes:
        print(narx_cost_table(args.narx_sizes, min(args.repeats, 3)))


if __name__ == "__main__":
    main()
