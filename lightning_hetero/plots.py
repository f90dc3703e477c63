"""Pictures of a HeteroStrategy run and of the benchmark (matplotlib, the ``plot`` extra).

[`plot_history`][lightning_hetero.plots.plot_history] draws a run's re-planning history: each rank's
batch size over the
boundaries, each rank's compute and wait time per step at the first and the last boundary,
and the balance efficiency against its 0.95 target (optionally against a DDP run).
[`plot_speedup`][lightning_hetero.plots.plot_speedup] draws the benchmark's epoch-time speedups
against the ideal. From a
shell, a CSVLogger log of a run becomes a PNG:

    python -m lightning_hetero.plots lightning_logs/version_0/metrics.csv -o run.png

matplotlib is imported when a function draws, not with this module; without it they raise
``ModuleNotFoundError`` saying ``pip install 'lightning_hetero[plot]'``. Figures are
``matplotlib.figure.Figure`` objects on the Agg canvas: no display, no ``pyplot``
state.
"""

import argparse
import csv
import math
import re
import sys
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from matplotlib.axes import Axes
    from matplotlib.figure import Figure

__all__ = ["INSTALL", "TARGET_BALANCE", "main", "plot_history", "plot_speedup", "read_metrics"]

INSTALL = "pip install 'lightning_hetero[plot]'"
#: The balance efficiency the benchmark counts adjustments to (``adjustments_to_095``).
TARGET_BALANCE = 0.95
_STEP_TIME_COLOR = "C2"
_REVERTED = "change reverted (steps got slower)"
_COLUMN = re.compile(r"^hetero/(batch_size|compute_time|wait_time)/rank(\d+)$")
_FIELDS = {"batch_size": "batch_sizes", "compute_time": "compute_times", "wait_time": "wait_times"}


def _figure(figsize: tuple[float, float]) -> "Figure":
    """A new figure on the Agg canvas; the error names the extra when matplotlib is absent."""
    try:
        from matplotlib.backends.backend_agg import FigureCanvasAgg
        from matplotlib.figure import Figure
    except ImportError as err:
        raise ModuleNotFoundError(
            f"lightning_hetero.plots draws with matplotlib, which is not installed here: {INSTALL}",
            name="matplotlib",
        ) from err
    fig = Figure(figsize=figsize, layout="constrained")
    FigureCanvasAgg(fig)
    return fig


def _float(value: Any) -> float:
    """``value`` as a float; ``None``, empty cells and the unparsable become NaN."""
    if value is None or value == "":
        return math.nan
    try:
        return float(value)
    except (TypeError, ValueError):
        return math.nan


def _finite(values: Sequence[float]) -> list[float]:
    return [v for v in values if math.isfinite(v)]


# ---------------------------------------------------------------- the inputs
def read_metrics(path: str | Path) -> list[dict[str, Any]]:
    """The boundary records a run's logger wrote, as history entries: a Lightning
    ``CSVLogger`` ``metrics.csv``, or a ``TensorBoardLogger``'s event file or the folder that
    holds it (Lightning's default logger; reading it needs the ``tensorboard`` package).

    Each row with a ``hetero/batch_size/rank{k}`` value (logged by
    [`HeteroCallback`][lightning_hetero.HeteroCallback] at a boundary) becomes one entry with
    ``step`` (the logger's: Lightning's logging step, one below the history's
    ``trainer.global_step`` after a training batch), ``batch_sizes``, ``compute_times``,
    ``wait_times``, ``balance``,
    ``step_time`` (``hetero/step_time``: the measured mean wall time of a step, in seconds)
    and ``reverted`` (whether the running count ``hetero/reverts`` grew since the previous
    boundary row: the guard undid a plan change there); the ranks come from the column
    names, and empty cells become NaN. Logs without the step-time columns (a run without
    the guard, or an older version) read with ``step_time`` NaN and ``reverted`` False.

    Raises:
        ValueError: the log has no ``hetero/`` columns, or no row with a boundary.
    """
    path = Path(path)
    if path.is_dir() and (path / "metrics.csv").is_file():
        path = path / "metrics.csv"
    if path.suffix == ".csv":
        with path.open(newline="", encoding="utf-8") as file:
            reader = csv.DictReader(file)
            return _entries(path, list(reader.fieldnames or []), reader)
    names, rows = _tensorboard_rows(path)
    return _entries(path, names, rows)


def _tensorboard_rows(path: Path) -> tuple[list[str], list[dict[str, Any]]]:
    """The ``hetero/`` scalars of a TensorBoard log as CSV-like rows, one per step."""
    try:
        from tensorboard.backend.event_processing import event_accumulator
    except ModuleNotFoundError as err:
        raise ModuleNotFoundError(
            f"Reading the TensorBoard log {path} needs the tensorboard package: pip install"
            " tensorboard (or log with a CSVLogger and pass its metrics.csv)."
        ) from err
    if not path.exists():
        raise ValueError(f"{path} does not exist.")
    accumulator = event_accumulator.EventAccumulator(
        str(path),
        size_guidance={event_accumulator.SCALARS: 0},  # every event, not a sample
    ).Reload()
    rows: dict[int, dict[str, Any]] = {}
    for tag in accumulator.Tags()["scalars"]:
        if tag.startswith("hetero/"):
            for event in accumulator.Scalars(tag):
                rows.setdefault(event.step, {"step": event.step})[tag] = event.value
    names = sorted({name for row in rows.values() for name in row})
    return names, [rows[step] for step in sorted(rows)]


def _entries(
    path: Path, names: list[str], rows: Iterable[Mapping[str, Any]]
) -> list[dict[str, Any]]:
    """History entries from rows of logged values (``names``: every column)."""
    columns: dict[str, tuple[str, int]] = {}
    for name in names:
        match = _COLUMN.match(name)
        if match:
            columns[name] = (_FIELDS[match[1]], int(match[2]))
    ranks = 1 + max(
        (rank for field, rank in columns.values() if field == "batch_sizes"), default=-1
    )
    if not ranks:
        raise ValueError(
            f"{path} has no hetero/batch_size/rank{{k}} values: HeteroCallback logs them at"
            " each boundary of a HeteroStrategy run with a CSV or TensorBoard logger attached."
        )
    entries = []
    reverts = math.nan  # the running count at the previous boundary row with one
    for row in rows:
        values = {field: [math.nan] * ranks for field in _FIELDS.values()}
        for name, (field, rank) in columns.items():
            if rank < ranks:
                values[field][rank] = _float(row.get(name))
        if not any(math.isfinite(b) for b in values["batch_sizes"]):
            continue  # a row of other metrics
        step = _float(row.get("step"))
        count = _float(row.get("hetero/reverts"))
        entries.append(
            {
                "step": int(step) if math.isfinite(step) else None,
                **values,
                "balance": _float(row.get("hetero/balance")),
                "step_time": _float(row.get("hetero/step_time")),
                "reverted": math.isfinite(count) and math.isfinite(reverts) and count > reverts,
            }
        )
        if math.isfinite(count):
            reverts = count
    if not entries:
        raise ValueError(f"{path} has hetero/ values but no row with a boundary's batch sizes.")
    return entries


def _history_of(history: Any) -> tuple[list[dict[str, Any]], str]:
    """The history entries and where they came from, from any input of
    [`plot_history`][lightning_hetero.plots.plot_history]."""
    if isinstance(history, (str, Path)):
        return read_metrics(history), Path(history).name
    if hasattr(history, "history") and not isinstance(history, Sequence):
        return list(history.history), f"{type(history).__name__}.history"
    if isinstance(history, Sequence) and all(isinstance(e, Mapping) for e in history):
        return [dict(e) for e in history], "history"
    raise TypeError(
        "plot_history takes strategy.history (a list of dicts), a HeteroStrategy, or the path"
        f" of a CSVLogger metrics.csv; got {type(history).__name__}."
    )


def _series(entries: list[dict[str, Any]], key: str, ranks: int) -> list[list[float]]:
    """``entries[i][key]`` per boundary, padded with NaN to ``ranks`` values."""
    rows = []
    for entry in entries:
        values = [_float(v) for v in (entry.get(key) or [])][:ranks]
        rows.append(values + [math.nan] * (ranks - len(values)))
    return rows


# ---------------------------------------------------------------- plot_history
def plot_history(
    history: Any,
    path: str | Path | None = None,
    *,
    baseline: Mapping[str, Any] | None = None,
    title: str | None = None,
    epoch_s: float | None = None,
    boundaries: Sequence[int] | None = None,
) -> "Figure":
    """Draw a HeteroStrategy run's re-planning history; save it as a PNG when ``path`` is set.

    Panels: (a) each rank's batch size after each boundary; (b) each rank's compute time
    per step (solid) and wait time per step (hatched, waiting for the slower ranks) at the
    first and the last boundary with timings, where the waits should vanish; (c) the
    balance efficiency ``E`` at each boundary against the 0.95 target (the proxy the
    re-planner balances) and, on a right-hand axis, the measured step time in seconds (the
    objective: the entries' ``step_time``, the mean wall time of a synchronous step since
    the last plan change) with a red ``x`` where the guard reverted the previous plan
    change because steps got slower (``reverted``; a dotted red line where that boundary's
    step time is unknown); histories without finite step times or reverts (older ones)
    draw ``E`` alone; with ``baseline`` and ``epoch_s``, (d) the epoch time of both runs
    against the ideal.

    Args:
        history: ``strategy.history`` (a list of boundary dicts), a
            [`HeteroStrategy`][lightning_hetero.HeteroStrategy] (its ``history``), or the path of a
            Lightning ``CSVLogger`` ``metrics.csv`` of such a run (see
            [`read_metrics`][lightning_hetero.plots.read_metrics]).
        path: where to write the PNG (its folder must exist).
        baseline: a uniform run to compare with, e.g. ``{"label": "DDP", "compute_times":
            [...], "wait_times": [...], "epoch_s": 1.9}``: per-rank seconds per step join
            panel (b); ``epoch_s`` (with this function's ``epoch_s``) draws panel (d).
            ``"ideal_speedup"`` sets the ideal of panel (d); by default it comes from the
            baseline's compute times (equal batches: speeds in proportion to ``1 / t_k``).
        title: the figure's title; by default one that states the balance reached (and the
            speedup, with a baseline).
        epoch_s: the HeteroStrategy run's epoch time in seconds, for panel (d).
        boundaries: indices into the history (negative ones count from the end) of the
            boundaries panel (b) shows; by default the first and the last with timings.

    Returns:
        The figure (a ``matplotlib.figure.Figure``).

    Raises:
        ValueError: the history has no boundary, no batch sizes, or ``baseline`` has an
            ``epoch_s`` but ``epoch_s`` is missing.
        ModuleNotFoundError: matplotlib is not installed.
    """
    entries, source = _history_of(history)
    if not entries:
        raise ValueError(
            f"{source} has no boundary: nothing to draw (the run ended before its first"
            " boundary, an epoch end or `adjust_every` steps)."
        )
    ranks = max(len(e.get("batch_sizes") or []) for e in entries)
    if not ranks:
        raise ValueError(f"the boundaries of {source} have no `batch_sizes`.")
    if baseline is not None and baseline.get("epoch_s") is not None and epoch_s is None:
        raise ValueError(
            "baseline['epoch_s'] needs epoch_s=, the HeteroStrategy run's epoch time, to"
            " compare the two runs."
        )
    compare = baseline is not None and baseline.get("epoch_s") is not None
    fig = _figure((13.0, 9.0))
    layout = [["a", "b"], ["c", "d"]] if compare else [["a", "b"], ["c", "c"]]
    axes = fig.subplot_mosaic(layout)
    colors = [f"C{k % 10}" for k in range(ranks)]
    _batch_panel(axes["a"], entries, ranks, colors)
    _time_panel(axes["b"], entries, ranks, colors, baseline, boundaries)
    balance = [_float(e.get("balance")) for e in entries]
    step_time = [_float(e.get("step_time")) for e in entries]
    reverted = [_flag(e.get("reverted")) for e in entries]
    _balance_panel(axes["c"], balance, step_time, reverted, wide=not compare)
    speedup = None
    if compare:
        assert baseline is not None and epoch_s is not None
        speedup = _epoch_panel(axes["d"], baseline, float(epoch_s))
    if title is None:
        title = _default_title(ranks, balance, baseline, speedup)
    fig.suptitle(title, fontsize=13, fontweight="bold")
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


def _default_title(
    ranks: int, balance: list[float], baseline: Mapping[str, Any] | None, speedup: float | None
) -> str:
    known = _finite(balance)
    title = f"HeteroStrategy on {ranks} rank{'s' if ranks != 1 else ''}"
    if known:
        title += f": balance efficiency {known[0]:.2f} \u2192 {known[-1]:.2f}"
        if len(balance) > 1:
            title += f" over {len(balance)} boundaries"
    if speedup is not None:
        title += f"; epoch {speedup:.2f}\u00d7 faster than {baseline.get('label', 'DDP')}"
    return title


def _batch_panel(ax: "Axes", entries: list[dict], ranks: int, colors: list[str]) -> None:
    measured = _series(entries, "batch_sizes", ranks)
    after = [
        _series([e], "next_batch_sizes", ranks)[0] if e.get("next_batch_sizes") else None
        for e in entries
    ]
    # x = 0: the plan before the first boundary; x = i: the plan boundary i left in force
    plans = [measured[0]]
    for i in range(len(entries)):
        nxt = after[i] or (measured[i + 1] if i + 1 < len(entries) else measured[i])
        plans.append(nxt)
    x = list(range(len(plans)))
    finals: list[tuple[float, int]] = []
    for k in range(ranks):
        y = [plan[k] for plan in plans]
        # lower ranks drawn wider, so that ranks with equal sizes still show each colour
        lw = 2.0 + 2.5 * (ranks - 1 - k) / max(1, ranks - 1)
        ax.step(
            x, y, where="post", color=colors[k], lw=lw, marker="o", ms=3 + lw, label=f"rank {k}"
        )
        last = _finite(y)
        if last:
            finals.append((last[-1], k))
    # the final sizes at the right end, nudged apart where ranks end close together
    gap = 0.045 * max([value for value, _ in finals] or [1.0])
    placed = -math.inf
    for value, k in sorted(finals):
        placed = max(value, placed + gap)
        ax.annotate(
            f"{value:.0f}",
            (x[-1], value),
            xytext=(x[-1] + 0.12, placed),
            va="center",
            fontsize=9,
            color=colors[k],
        )
    ax.set_title("(a) Batch size per rank: re-planned at each boundary", loc="left")
    ax.set_xlabel("boundary (0 = start; each re-plans for the steps after it)")
    ax.set_ylabel("batch size (samples per step)")
    ax.set_xticks(x if len(x) <= 12 else x[:: max(1, len(x) // 10)])
    ax.set_xlim(-0.2, x[-1] + 0.6)
    ax.set_ylim(bottom=0)
    ax.grid(alpha=0.3)
    ax.legend(loc="best", fontsize=9, ncols=2 if ranks > 4 else 1)


def _chosen(entries: list[dict], ranks: int, boundaries: Sequence[int] | None) -> list[int]:
    if boundaries is not None:
        chosen = []
        for i in boundaries:
            if not -len(entries) <= i < len(entries):
                raise ValueError(f"boundary {i} is outside the history's {len(entries)} entries.")
            chosen.append(i % len(entries))
        return list(dict.fromkeys(chosen))
    timed = [i for i, row in enumerate(_series(entries, "compute_times", ranks)) if _finite(row)]
    return list(dict.fromkeys([timed[0], timed[-1]])) if timed else []


def _time_panel(
    ax: "Axes",
    entries: list[dict],
    ranks: int,
    colors: list[str],
    baseline: Mapping[str, Any] | None,
    boundaries: Sequence[int] | None,
) -> None:
    compute = _series(entries, "compute_times", ranks)
    wait = _series(entries, "wait_times", ranks)
    groups: list[tuple[str, list[float], list[float]]] = []
    if baseline is not None and baseline.get("compute_times") is not None:
        pad = [math.nan] * ranks
        base_c = ([_float(v) for v in baseline["compute_times"]] + pad)[:ranks]
        base_w = ([_float(v) for v in baseline.get("wait_times") or []] + pad)[:ranks]
        groups.append((f"{baseline.get('label', 'DDP')}\n(uniform batches)", base_c, base_w))
    chosen = _chosen(entries, ranks, boundaries)
    for n, i in enumerate(chosen):
        label = f"Hetero, boundary {i + 1}"
        if boundaries is None and len(chosen) > 1:
            label += "\n(first)" if n == 0 else "\n(last)"
        groups.append((label, compute[i], wait[i]))
    ax.set_title("(b) Time per step: compute (solid) + waiting for others (hatched)", loc="left")
    if not groups:
        ax.text(
            0.5,
            0.5,
            "no step timings recorded",
            ha="center",
            va="center",
            transform=ax.transAxes,
            fontsize=11,
            color="0.4",
        )
        ax.set_axis_off()
        return
    peak = max(
        [
            c + (w if math.isfinite(w) else 0)
            for _, cs, ws in groups
            for c, w in zip(cs, ws)
            if math.isfinite(c)
        ],
        default=0.0,
    )
    scale, unit = (1e3, "ms") if peak < 1.0 else (1.0, "s")
    width = 0.8 / ranks
    for g, (_, cs, ws) in enumerate(groups):
        for k in range(ranks):
            x = g + (k - (ranks - 1) / 2) * width
            c = cs[k] * scale if math.isfinite(cs[k]) else 0.0
            w = ws[k] * scale if math.isfinite(ws[k]) else 0.0
            ax.bar(x, c, width * 0.92, color=colors[k])
            (stacked,) = ax.bar(
                x,
                w,
                width * 0.92,
                bottom=c,
                color=colors[k],
                alpha=0.3,
                hatch="///",
                edgecolor=colors[k],
                lw=0.8,
            )
            # its bottom is no baseline: sticky there, an empty wait bar on the tallest
            # compute bar would keep the margin above from showing its top
            stacked.sticky_edges.y.clear()
    ax.set_xticks(range(len(groups)), [label for label, _, _ in groups])
    ax.set_ylabel(f"seconds per step ({unit})" if unit == "s" else f"time per step ({unit})")
    ax.grid(axis="y", alpha=0.3)
    from matplotlib.patches import Patch

    handles = [
        Patch(facecolor="0.45", label="compute"),
        Patch(facecolor="0.45", alpha=0.3, hatch="///", edgecolor="0.3", label="wait"),
    ]
    ax.legend(
        handles=handles, loc="upper right", fontsize=9, title="one bar per rank", title_fontsize=9
    )
    ax.margins(y=0.12)


def _flag(value: Any) -> bool:
    """A history's ``reverted``: true for ``True`` and non-zero numbers, not for NaN or None."""
    if isinstance(value, float) and math.isnan(value):
        return False
    return bool(value)


def _balance_panel(
    ax: "Axes",
    balance: list[float],
    step_time: list[float],
    reverted: list[bool],
    *,
    wide: bool = True,
) -> None:
    """Panel (c): ``E`` per boundary; with step times or reverts, those as well.

    ``wide``: the panel spans the figure (no panel (d)), room for a legend in one row.
    """
    x = list(range(1, len(balance) + 1))
    ax.plot(x, balance, color="C0", lw=2.2, marker="o", label="balance efficiency E")
    ax.axhline(TARGET_BALANCE, color="C3", ls="--", lw=1.5, label=f"target {TARGET_BALANCE}")
    known = _finite(balance)
    for i, value in zip(x, balance):
        if math.isfinite(value) and len(balance) <= 20:
            ax.annotate(
                f"{value:.2f}",
                (i, value),
                xytext=(0, 7),
                textcoords="offset points",
                ha="center",
                fontsize=9,
                color="C0",
            )
    if not known:
        ax.text(
            0.5,
            0.5,
            "no finite balance recorded (no timings yet)",
            ha="center",
            va="center",
            transform=ax.transAxes,
            color="0.4",
        )
    low = min([*known, TARGET_BALANCE])
    ax.set_ylim(max(0.0, low - 0.1), 1.05)  # room for the label of an E of 1.00
    ax.set_xlim(0.5, len(balance) + 0.5)
    ax.set_xticks(x if len(x) <= 20 else x[:: max(1, len(x) // 10)])
    title = "(c) Balance efficiency E = ideal step time / slowest rank's (1 = nobody waits)"
    ax.set_xlabel("boundary")
    ax.set_ylabel("E")
    ax.grid(alpha=0.3)
    timed = [(i, t) for i, t in zip(x, step_time) if math.isfinite(t)]
    if not timed and not any(reverted):
        ax.set_title(title, loc="left")
        ax.legend(loc="lower right", fontsize=9)
        return
    legend_ax = ax
    undone: list[tuple[int, float]] = []
    if timed:
        # the objective next to the proxy: the measured step time, on its own axis
        twin = ax.twinx()
        twin.plot(
            x,
            step_time,
            color=_STEP_TIME_COLOR,
            lw=2.0,
            marker="s",
            ms=5,
            label="measured step time (s)",
        )
        undone = [(i, t) for (i, t) in timed if reverted[i - 1]]
        if undone:
            twin.plot(
                [i for i, _ in undone],
                [t for _, t in undone],
                ls="none",
                marker="x",
                ms=13,
                mew=3,
                color="C3",
                zorder=5,
                label=_REVERTED,
            )
        low, high = min(t for _, t in timed), max(t for _, t in timed)
        pad = max(high - low, 0.05 * high, 1e-9)
        twin.set_ylim(max(0.0, low - 0.25 * pad), high + 0.25 * pad)
        twin.set_ylabel("measured step time (s)", color=_STEP_TIME_COLOR)
        twin.tick_params(axis="y", colors=_STEP_TIME_COLOR)
        title += "\nright axis: measured step time per synchronous step (s, lower is better)"
        legend_ax = twin
    # reverts at boundaries without a step time: a line across the panel instead
    untimed = [i for i, r in zip(x, reverted) if r and not math.isfinite(step_time[i - 1])]
    for n, i in enumerate(untimed):
        ax.axvline(i, color="C3", ls=":", lw=2.0, label=None if n or undone else _REVERTED)
    ax.set_title(title, loc="left")
    handles, labels = ax.get_legend_handles_labels()
    if legend_ax is not ax:
        more = legend_ax.get_legend_handles_labels()
        handles, labels = handles + more[0], labels + more[1]
    # outside the plot, under it: the two lines may run anywhere inside
    legend_ax.legend(
        handles,
        labels,
        loc="upper center",
        bbox_to_anchor=(0.5, -0.16),
        ncols=len(handles) if wide else 2,
        fontsize=9,
        frameon=False,
    )


def _epoch_panel(ax: "Axes", baseline: Mapping[str, Any], epoch_s: float) -> float:
    """Epoch times of the baseline and the HeteroStrategy run; returns the speedup."""
    label = str(baseline.get("label", "DDP"))
    base_s = float(baseline["epoch_s"])
    ideal = baseline.get("ideal_speedup")
    if ideal is None:
        speeds = _finite(
            [
                1.0 / c
                for c in map(_float, baseline.get("compute_times") or [])
                if math.isfinite(c) and c > 0
            ]
        )
        ideal = sum(speeds) / (len(speeds) * min(speeds)) if speeds else None
    speedup = base_s / epoch_s
    names = [f"{label}\n(uniform)", "HeteroStrategy"]
    bars = ax.barh(names, [base_s, epoch_s], color=["0.6", "C2"], height=0.55)
    ax.invert_yaxis()
    notes = [f"{base_s:.2f} s", f"{epoch_s:.2f} s  ({speedup:.2f}\u00d7 faster)"]
    for bar, note in zip(bars, notes):
        ax.text(
            bar.get_width(),
            bar.get_y() + bar.get_height() / 2,
            f"  {note}",
            va="center",
            fontsize=10,
        )
    if ideal is not None and ideal > 0:
        best = base_s / float(ideal)
        ax.axvline(
            best,
            color="k",
            ls="--",
            lw=1.5,
            label=f"ideal: {best:.2f} s ({float(ideal):.2f}\u00d7, split by speed)",
        )
        ax.legend(loc="lower right", fontsize=9)
    ax.set_xlim(0, max(base_s, epoch_s) * 1.45)
    ax.set_xlabel("epoch time (s, lower is better)")
    ax.set_title(f"(d) Epoch time: {label} vs HeteroStrategy", loc="left")
    ax.grid(axis="x", alpha=0.3)
    return speedup


# ---------------------------------------------------------------- plot_speedup
def _spread(row: Mapping[str, Any]) -> tuple[float, float, float]:
    """``(median, min, max)`` of a row's speedup."""
    if "speedup" in row:
        value = row["speedup"]
        values = (
            sorted(_finite([_float(v) for v in value]))
            if isinstance(value, Sequence)
            else [_float(value)]
        )
        if not values:
            raise ValueError(f"the row {dict(row)} has no finite speedup.")
        n = len(values)
        mid = values[n // 2] if n % 2 else (values[n // 2 - 1] + values[n // 2]) / 2
        low, high = values[0], values[-1]
    elif "median" in row:
        mid = _float(row["median"])
        low, high = mid, mid
    else:
        raise ValueError(f"the row {dict(row)} has no 'speedup' (or 'median').")
    low = _float(row.get("min", low))
    high = _float(row.get("max", high))
    return mid, low, high


def plot_speedup(rows: Sequence[Mapping[str, Any]], path: str | Path | None = None) -> "Figure":
    """Draw epoch-time speedups over DDP against the ideal; save a PNG when ``path`` is set.

    One group of bars per level (in the rows' order), one bar per controller; each bar is
    the median speedup with min-max error bars, labelled with its fraction of the ideal.
    The ideal is drawn as a black line over the bars, 95 % of it dashed.

    Args:
        rows: dicts with ``"level"`` (e.g. ``"HL4"``, any label), ``"ideal"`` (the ideal
            speedup) and the measured speedup: ``"speedup"``, one number or the list over
            repeats (median, min and max are taken), or ``"median"`` with ``"min"`` and
            ``"max"``; optionally ``"controller"``, the bar's name within its group.
        path: where to write the PNG.

    Returns:
        The figure (a ``matplotlib.figure.Figure``).

    Raises:
        ValueError: no rows, or a row without a level, an ideal or a speedup.
        ModuleNotFoundError: matplotlib is not installed.
    """
    if not rows:
        raise ValueError("plot_speedup needs at least one row.")
    for row in rows:
        for key in ("level", "ideal"):
            if key not in row:
                raise ValueError(f"the row {dict(row)} has no {key!r}.")
    levels = list(dict.fromkeys(str(row["level"]) for row in rows))
    controllers = list(dict.fromkeys(row.get("controller") for row in rows))
    fig = _figure((max(8.0, 3.5 + 1.3 * len(levels) * len(controllers) ** 0.5), 5.2))
    ax = fig.add_subplot()
    width = min(0.8, 0.4 * len(controllers)) / len(controllers)
    top = 1.0
    for c, controller in enumerate(controllers):
        xs, mids, errs, ideals = [], [], [[], []], []
        for row in rows:
            if row.get("controller") != controller:
                continue
            mid, low, high = _spread(row)
            xs.append(levels.index(str(row["level"])) + (c - (len(controllers) - 1) / 2) * width)
            mids.append(mid)
            errs[0].append(max(0.0, mid - low))
            errs[1].append(max(0.0, high - mid))
            ideals.append(_float(row["ideal"]))
            top = max(top, high, ideals[-1])
        label = str(controller) if controller is not None else "HeteroStrategy"
        ax.bar(
            xs,
            mids,
            width * 0.9,
            yerr=errs,
            capsize=4,
            color=f"C{c % 10}",
            label=label,
            error_kw={"elinewidth": 1.2, "ecolor": "0.2"},
        )
        for x, mid, ideal in zip(xs, mids, ideals):
            if math.isfinite(ideal) and ideal > 0 and math.isfinite(mid) and mid > 0:
                ax.text(
                    x,
                    mid / 2,
                    f"{mid / ideal:.0%}",
                    ha="center",
                    va="center",
                    fontsize=10,
                    color="white",
                    fontweight="bold",
                )
        left = [x - width / 2 for x in xs]
        right = [x + width / 2 for x in xs]
        first = c == 0
        ax.hlines(ideals, left, right, colors="k", lw=2.5, label="ideal" if first else None)
        ax.hlines(
            [TARGET_BALANCE * i for i in ideals],
            left,
            right,
            colors="k",
            lw=1.2,
            linestyles="--",
            label="95% of ideal" if first else None,
        )
    ax.axhline(1.0, color="0.5", lw=1, ls=":", label="DDP (1\u00d7)")
    ideal_of = {str(row["level"]): _float(row["ideal"]) for row in rows}
    ax.set_xticks(
        range(len(levels)), [f"{level}\nideal {ideal_of[level]:.2f}\u00d7" for level in levels]
    )
    ax.set_ylim(0, top * 1.12)
    ax.set_xlim(-0.6, len(levels) - 0.4)
    ax.set_xlabel("heterogeneity level")
    ax.set_ylabel("epoch-time speedup over uniform DDP (\u00d7)")
    ax.set_title(
        "bars: median over repeats, whiskers: min-max, in the bar: % of the ideal\n"
        "ideal = sum(X) / (K min X) for the ranks' speeds X",
        fontsize=10,
    )
    fig.suptitle("Epoch-time speedup over DDP vs the ideal", fontsize=13, fontweight="bold")
    ax.grid(axis="y", alpha=0.3)
    ax.legend(loc="upper left", bbox_to_anchor=(1.01, 1.0), fontsize=9)
    if path is not None:
        fig.savefig(path, dpi=110)
    return fig


# ---------------------------------------------------------------- the command
def main(argv: Sequence[str] | None = None) -> None:
    """``python -m lightning_hetero.plots metrics.csv [-o out.png]``: draw
    [`plot_history`][lightning_hetero.plots.plot_history]."""
    parser = argparse.ArgumentParser(
        prog="python -m lightning_hetero.plots",
        description="Draw a HeteroStrategy run's re-planning history from its logs as a PNG:"
        " batch size per rank, compute and wait time per step, balance efficiency.",
    )
    parser.add_argument(
        "metrics",
        type=Path,
        help="the run's CSVLogger metrics.csv, or its TensorBoard event file or log folder"
        " (e.g. lightning_logs/version_0)",
    )
    parser.add_argument(
        "-o",
        "--output",
        type=Path,
        help="the PNG to write (default: next to the CSV, .png; in a log folder, hetero.png)",
    )
    parser.add_argument("--title", help="the figure's title (default: the balance reached)")
    args = parser.parse_args(argv)
    if not args.metrics.exists():
        parser.error(f"{args.metrics} does not exist")
    if args.output is not None:
        output = args.output
    elif args.metrics.is_dir():
        output = args.metrics / "hetero.png"
    elif args.metrics.suffix == ".csv":
        output = args.metrics.with_suffix(".png")
    else:  # an event file: events.out.tfevents.<time>.<host>...
        output = args.metrics.parent / "hetero.png"
    try:
        plot_history(args.metrics, output, title=args.title)
    except ModuleNotFoundError as err:
        print(f"{parser.prog}: {err}", file=sys.stderr)
        raise SystemExit(2) from None
    except ValueError as err:
        parser.error(str(err))
    print(output)


if __name__ == "__main__":
    main()
