"""Compare controllers on the simulated clusters (no training; seconds, not minutes).

    python -m lightning_hetero.bench --simulate
    python -m lightning_hetero.bench --simulate --controllers proportional lbbsp:predictor=narx

Every controller runs through every scenario of
``SCENARIOS`` for several noise seeds; the
table gives, per scenario and controller, the figures of
[`ScenarioReport`][lightning_hetero.planning.scenarios.ScenarioReport] as min / median / max
over seeds, so a user can pick a controller for the kind of cluster they have.
"""

import statistics
import warnings
from collections.abc import Callable, Sequence
from typing import Any

from tqdm import tqdm

from lightning_hetero.planning import CONTROLLERS, Controller
from lightning_hetero.planning.scenarios import SCENARIOS, ScenarioReport, run_scenario
from lightning_hetero.planning.traces import predictor_report

__all__ = [
    "DEFAULT_CONTROLLERS",
    "parse_spec",
    "predictor_table",
    "simulate_report",
    "split_spec",
]

#: The controllers compared by default, as ``name[:option=value,...]`` specs.
DEFAULT_CONTROLLERS = [
    "static",
    "proportional",
    "proportional:renormalization=omnilearn",
    "model",
    "lbbsp:predictor=last",
    "lbbsp:predictor=ema",
    "lbbsp:predictor=narx",
    "stepwise",
    "updates",
]

#: Columns of the controller table.
COLUMNS: dict[str, tuple[str, Callable[[ScenarioReport], float]]] = {
    "steady": ("efficiency in the steady state", lambda r: r.steady_efficiency),
    "to_095": (
        "boundaries until efficiency >= 0.95 (worst phase; - = never)",
        lambda r: float("nan") if r.boundaries_to_balance is None else r.boundaries_to_balance,
    ),
    "changes": ("plan changes over the run", lambda r: r.plan_changes),
    "run": ("whole-run efficiency, convergence included", lambda r: r.run_efficiency),
}


def _value(text: str) -> Any:
    for cast in (int, float):
        try:
            return cast(text)
        except ValueError:
            pass
    return {"true": True, "false": False}.get(text.lower(), text)


def split_spec(spec: str) -> tuple[str, dict[str, Any]]:
    """``"name:key=value,key=value"`` -> (name, options), checked by building it once.

    Example:
        >>> split_spec("proportional:deadband=0.1,learn_max_batch_size=false")
        ('proportional', {'deadband': 0.1, 'learn_max_batch_size': False})
    """
    name, _, rest = spec.partition(":")
    if name not in CONTROLLERS:
        raise ValueError(f"Unknown controller {name!r}; expected one of {sorted(CONTROLLERS)}.")
    options: dict[str, Any] = {}
    for item in filter(None, rest.split(",")):
        key, sep, value = item.partition("=")
        if not sep:
            raise ValueError(f"Controller option {item!r} in {spec!r} must be `key=value`.")
        options[key.strip()] = _value(value.strip())
    CONTROLLERS[name](**options)  # fail now on bad values, not halfway through a table
    return name, options


def parse_spec(spec: str) -> tuple[str, Callable[[], Controller]]:
    """``"name:key=value,key=value"`` -> (label, factory of a fresh controller).

    Example:
        >>> label, factory = parse_spec("proportional:deadband=0.1")
        >>> label, factory().deadband
        ('proportional:deadband=0.1', 0.1)
    """
    name, options = split_spec(spec)
    cls = CONTROLLERS[name]
    return spec, lambda: cls(**options)


def _cell(values: Sequence[float], fmt: str) -> str:
    finite = sorted(v for v in values if v == v)
    if not finite:
        return "-"
    missing = "" if len(finite) == len(values) else f" ({len(values) - len(finite)} never)"
    low, mid, high = finite[0], statistics.median(finite), finite[-1]
    if low == high:
        return format(mid, fmt) + missing
    return f"{low:{fmt}} / {mid:{fmt}} / {high:{fmt}}{missing}"


def simulate_report(
    controllers: Sequence[str] = tuple(DEFAULT_CONTROLLERS),
    scenarios: Sequence[str] = tuple(SCENARIOS),
    seeds: Sequence[int] = range(5),
    progress: bool = True,
    verbose: bool = False,
) -> str:
    """Run every controller through every scenario; returns a Markdown table.

    The controllers' warnings (e.g. a learned maximum batch size that binds, in the
    ``memory`` and ``resources`` scenarios) are what those scenarios provoke on purpose: they
    are counted under the table, and printed as they come only with ``verbose``."""
    unknown = [s for s in scenarios if s not in SCENARIOS]
    if unknown:
        raise ValueError(f"Unknown scenarios {unknown}; expected some of {sorted(SCENARIOS)}.")
    specs = [parse_spec(spec) for spec in controllers]
    header = "| scenario | controller | " + " | ".join(COLUMNS) + " |"
    lines = [header, "|---|---|" + "---|" * len(COLUMNS)]
    total = len(specs) * len(scenarios) * len(seeds)
    with (
        tqdm(total=total, desc="simulating", unit="run", disable=not progress) as bar,
        warnings.catch_warnings(record=not verbose) as caught,
    ):
        if not verbose:
            warnings.simplefilter("always")  # count every one
        for scenario in scenarios:
            for label, factory in specs:
                bar.set_postfix_str(f"{scenario} {label}")
                reports = []
                for seed in seeds:
                    reports.append(run_scenario(scenario, factory(), seed=seed))
                    bar.update()
                cells = [
                    _cell(
                        [get(r) for r in reports], ".0f" if key in ("to_095", "changes") else ".3f"
                    )
                    for key, (_, get) in COLUMNS.items()
                ]
                lines.append(f"| {scenario} | `{label}` | " + " | ".join(cells) + " |")
    legend = "\n".join(f"- `{key}`: {text}" for key, (text, _) in COLUMNS.items())
    scenario_legend = "\n".join(f"- `{s}`: {SCENARIOS[s].description}" for s in scenarios)
    hidden = (
        f"\nThe controllers warned {len(caught)} times (--verbose prints each warning).\n"
        if caught
        else ""
    )
    return (
        "\n".join(lines)
        + f"\n\nEach cell: min / median / max over {len(seeds)} seeds (one value when all agree)."
        + " Efficiency: the best step time any plan within the limits reaches, over the"
        + " plan's step time (noise-free curves).\n"
        + legend
        + "\n\nScenarios:\n"
        + scenario_legend
        + "\n"
        + hidden
    )


def predictor_table(seeds: Sequence[int] = range(5), boundaries: int = 200) -> str:
    """LB-BSP's speed predictors on resource-driven traces (paper 001, Table 3), in Markdown."""
    rows = predictor_report(seeds=seeds, boundaries=boundaries)
    lines = [
        "| predictor | relative RMSE of the next speed | mean true step (s) | vs uniform |"
        " plan changes |",
        "|---|---|---|---|---|",
    ]
    for row in rows:
        rmse = f"{row['rmse_min']:.3f} / {row['rmse_median']:.3f} / {row['rmse_max']:.3f}"
        step = f"{row['step_s_min']:.3f} / {row['step_s_median']:.3f} / {row['step_s_max']:.3f}"
        lines.append(
            f"| {row['predictor']} | {rmse} | {step} | {row['vs_uniform']:.3f} |"
            f" {row['plan_changes']:.0f} |"
        )
    return (
        "\n".join(lines)
        + f"\n\nLB-BSP (dead-band 0, as paper 001) on {len(seeds)} four-worker traces of"
        f" {boundaries} boundaries whose speeds follow co-located jobs"
        " (`lightning_hetero.planning.traces`); min / median / max over traces, mean for"
        " `vs uniform` (step time over the uniform plan's) and plan changes. The oracle knows"
        " each interval's speed in advance.\n"
    )
