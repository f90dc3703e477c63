"""The end-of-fit summary of a HeteroStrategy run: what the re-planner did, read from its
``history`` (numbers only; [`HeteroCallback`][lightning_hetero.HeteroCallback] says and logs
it)."""

import math
from collections import Counter
from collections.abc import Sequence
from typing import Any

from lightning_hetero.planning.stragglers import pace_setter

__all__ = [
    "HELD_BELOW",
    "fit_summary",
    "hold_reason",
    "quiet",
    "summary_line",
    "summary_metrics",
    "summary_table",
]

#: A boundary that keeps a plan less balanced than this counts as a hold (the re-planner says
#: why it keeps such a plan, ``replan._SAY_HELD_BELOW``).
HELD_BELOW = 0.9


def _uniform(plan: Sequence[int]) -> bool:
    return bool(plan) and max(plan) - min(plan) <= 1


def _finite(value: Any) -> bool:
    return isinstance(value, (int, float)) and math.isfinite(value)


def hold_reason(entry: dict[str, Any]) -> str | None:
    """Why a boundary kept its plan, where that is worth saying (``None``: it changed or
    reverted the plan, or kept a balanced one)."""
    if entry.get("changed") or entry.get("reverted"):
        return None
    if not _finite(entry.get("balance")):
        return "no timings at the plan yet"
    if entry["balance"] >= HELD_BELOW:
        return None
    if entry.get("held_at_minimum"):
        return f"rank(s) {entry['held_at_minimum']} held at min_batch_size"
    if "deadband" in entry:
        return f"gain within the dead-band ({entry['deadband']:.0%})"
    return "the controller keeps it"


def fit_summary(
    history: Sequence[dict[str, Any]],
    final_plan: Sequence[int],
    metrics_file: str | None = None,
    adapts: bool = True,
) -> dict[str, Any]:
    """What a run's re-planner did, from its ``history`` and the plan it ended with.

    ``metrics_file``: the run's CSV log (named in ``pictures``); ``adapts``: the controller
    changes plans (a ``"static"`` one keeps its plan by design: no boundary is a hold).

    Keys: ``boundaries``; ``replans`` (plan changes kept), ``reverts`` (changes undone by
    the step-time guard), ``holds`` (boundaries that kept a plan balanced below
    ``HELD_BELOW``, or without timings) and ``hold_reasons`` (reason: count);
    ``first_plan``, ``final_plan``, ``final_balance`` (the last measured);
    ``step_time_uniform`` (seconds per step at the first boundary under a uniform plan),
    ``step_time_final`` (at the last boundary under the final plan; NaN if never measured)
    and ``speedup`` (their ratio); ``pace_setter`` (the rank slowest beyond 10% at the
    first timed boundary, or ``None``); ``pictures`` (how to draw the run).

    Example:
        >>> history = [
        ...     {"batch_sizes": [8, 8], "compute_times": [0.1, 0.3], "balance": 0.67,
        ...      "step_time": 0.3, "changed": True, "reverted": False},
        ...     {"batch_sizes": [12, 4], "compute_times": [0.15, 0.15], "balance": 1.0,
        ...      "step_time": 0.15, "changed": False, "reverted": False},
        ... ]
        >>> s = fit_summary(history, [12, 4])
        >>> s["replans"], s["holds"], s["speedup"], s["pace_setter"]
        (1, 0, 2.0, 1)
    """
    reasons = Counter(r for r in map(hold_reason, history) if r is not None and adapts)
    measured = [e for e in history if _finite(e.get("balance"))]
    uniform = [
        e for e in history if _uniform(e.get("batch_sizes", [])) and _finite(e.get("step_time"))
    ]
    final = [
        e
        for e in history
        if list(e.get("batch_sizes", [])) == list(final_plan) and _finite(e.get("step_time"))
    ]
    uniform_s = uniform[0]["step_time"] if uniform else math.nan
    final_s = final[-1]["step_time"] if final else math.nan
    timed = [e for e in history if all(map(_finite, e.get("compute_times", [math.nan])))]
    if metrics_file is not None:
        pictures = f"python -m lightning_hetero.plots {metrics_file} -o run.png"
    else:
        pictures = "lightning_hetero.plots.plot_history(trainer.strategy.history)"
    return {
        "boundaries": len(history),
        "replans": sum(bool(e.get("changed")) and not e.get("reverted") for e in history),
        "reverts": sum(bool(e.get("reverted")) for e in history),
        "holds": sum(reasons.values()),
        "hold_reasons": dict(reasons),
        "first_plan": list(history[0]["batch_sizes"]) if history else list(final_plan),
        "final_plan": list(final_plan),
        "final_balance": measured[-1]["balance"] if measured else math.nan,
        "step_time_uniform": uniform_s,
        "step_time_final": final_s,
        "speedup": uniform_s / final_s if final_s > 0 else math.nan,
        "pace_setter": pace_setter(timed[0]["compute_times"]) if timed else None,
        "pictures": pictures,
    }


def quiet(summary: dict[str, Any]) -> bool:
    """Nothing to say: the plan stayed, and no unbalanced plan was held."""
    return not (summary["replans"] or summary["reverts"] or summary["holds"])


def summary_line(summary: dict[str, Any]) -> str:
    """The summary in one line (a quiet run's is short; the callback does not say it)."""
    balance = summary["final_balance"]
    at = f" at balance {balance:.2f}" if _finite(balance) else ""
    if quiet(summary):
        return (
            f"hetero: the plan stayed {summary['final_plan']}{at} through"
            f" {summary['boundaries']} boundaries."
        )
    counts = (
        f"{summary['replans']} re-plan(s), {summary['reverts']} revert(s),"
        f" {summary['holds']} hold(s)"
    )
    if summary["hold_reasons"]:
        said = "; ".join(f"{n}x {why}" for why, n in summary["hold_reasons"].items())
        counts += f" ({said})"
    plan = f"plan {summary['first_plan']} -> {summary['final_plan']}{at}"
    uniform_s, final_s = summary["step_time_uniform"], summary["step_time_final"]
    if _finite(uniform_s) and _finite(final_s):
        steps = (
            f"steps {uniform_s:.3g} s under the uniform plan, {final_s:.3g} s under the final"
            f" one ({summary['speedup']:.2f}x)"
        )
    elif _finite(final_s):
        steps = f"steps {final_s:.3g} s under the final plan"
    else:
        steps = "the final plan not timed yet (it came at the last boundary)"
    setter = summary["pace_setter"]
    pace = "no rank set the pace" if setter is None else f"rank {setter} set the pace"
    return (
        f"hetero: fit summary: {counts}; {plan}; {steps}; {pace} at the start;"
        f" pictures: {summary['pictures']}."
    )


def summary_metrics(summary: dict[str, Any]) -> dict[str, float]:
    """The summary as logged metrics, ``hetero/summary/<name>`` (``pace_setter`` -1: none)."""
    setter = summary["pace_setter"]
    names = ("replans", "reverts", "holds", "final_balance", "step_time_uniform")
    metrics = {f"hetero/summary/{name}": float(summary[name]) for name in names}
    metrics["hetero/summary/step_time_final"] = float(summary["step_time_final"])
    metrics["hetero/summary/speedup"] = float(summary["speedup"])
    metrics["hetero/summary/pace_setter"] = -1.0 if setter is None else float(setter)
    for rank, b in enumerate(summary["final_plan"]):
        metrics[f"hetero/summary/batch_size/rank{rank}"] = float(b)
    return metrics


def summary_table(summary: dict[str, Any]) -> str:
    """The summary as a Markdown table (TensorBoard's text tab)."""
    rows = [(key, summary[key]) for key in summary]
    return "| field | value |\n|---|---|\n" + "\n".join(f"| {k} | {v} |" for k, v in rows)
