"""lightning_hetero.plots: the history and speedup charts, their inputs, the command, and the
message without matplotlib; the benchmark's chart."""

import importlib.util
import math
import subprocess
import sys

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from torch.utils.data import DataLoader, TensorDataset

import lightning_hetero.bench.__main__ as bench_main
from lightning_hetero import HeteroStrategy
from lightning_hetero.bench.run import StepTimes
from lightning_hetero.plots import main, plot_history, plot_speedup, read_metrics

pytest.importorskip("matplotlib")

PNG = b"\x89PNG\r\n\x1a\n"
SPEEDS = [9, 9, 6, 24]


def _entry(plan, next_plan, epoch):
    compute = [b * 0.072 / s for b, s in zip(plan, SPEEDS)]
    slowest = max(compute)
    best = sum(plan) / sum(b / t for b, t in zip(plan, compute))
    return {
        "epoch": epoch,
        "step": 10 * (epoch + 1),
        "batch_sizes": plan,
        "compute_times": compute,
        "wait_times": [slowest - t for t in compute],
        "memory_used": [0.1] * len(plan),
        "balance": best / slowest,
        "changed": next_plan != plan,
        "next_batch_sizes": next_plan,
        "boundary_s": 0.001,
    }


def _history():
    plans = [[32] * 4, [24, 24, 16, 64], [24, 24, 16, 64], [24, 24, 16, 64]]
    return [_entry(plans[i], plans[i + 1], i) for i in range(len(plans) - 1)]


def _timed_history():
    """Six boundaries on 4 ranks with measured step times; the guard undoes boundary 4's."""
    plans = [[32] * 4, [24, 24, 16, 64], [22, 22, 14, 70], [21, 21, 13, 73], [22, 22, 14, 70],
             [22, 22, 14, 70], [22, 22, 14, 70]]  # fmt: skip
    history = [_entry(plans[i], plans[i + 1], i) for i in range(6)]
    for entry, step_time in zip(history, [0.262, 0.205, 0.176, 0.188, 0.174, 0.173]):
        entry.update(step_time=step_time, reverted=False)
    history[3]["reverted"] = True
    return history


def _axes(fig):
    """The figure's panels by their letter: '(a) ...' -> 'a'."""
    return {ax.get_title(loc="left")[1]: ax for ax in fig.axes if ax.get_title(loc="left")}


def _twins(fig, ax):
    """The other axes sharing ``ax``'s x axis: a right-hand axis drawn with ``twinx``."""
    shared = ax.get_shared_x_axes()
    return [other for other in fig.axes if other is not ax and shared.joined(ax, other)]


def _legend_of(fig, ax):
    """The legend texts drawn for panel ``ax``, on it or on its twin."""
    legends = [a.get_legend() for a in [ax, *_twins(fig, ax)] if a.get_legend() is not None]
    return [t.get_text() for legend in legends for t in legend.get_texts()]


def _is_png(path, at_least=10_000):
    data = path.read_bytes()
    return data.startswith(PNG) and len(data) >= at_least


# ---------------------------------------------------------------- plot_history
def test_a_history_draws_batch_sizes_times_and_balance(tmp_path):
    path = tmp_path / "history.png"
    fig = plot_history(_history(), path)
    assert _is_png(path)
    panels = _axes(fig)
    assert sorted(panels) == ["a", "b", "c"]
    lines = panels["a"].get_lines()
    assert len(lines) == 4  # one per rank
    # the plan before the first boundary, then the one each boundary left in force
    assert list(lines[3].get_ydata()) == [32, 64, 64, 64]
    assert [line.get_label() for line in lines] == [f"rank {k}" for k in range(4)]
    # compute + wait bars for each rank at the first and the last boundary
    assert len(panels["b"].patches) == 2 * 4 * 2
    assert [t.get_text() for t in panels["b"].get_xticklabels()] == [
        "Hetero, boundary 1\n(first)",
        "Hetero, boundary 3\n(last)",
    ]
    balance, target = panels["c"].get_lines()
    assert list(balance.get_ydata()) == pytest.approx([e["balance"] for e in _history()])
    assert list(target.get_ydata()) == [0.95, 0.95]
    assert "balance efficiency 0.50 \u2192 1.00 over 3 boundaries" in fig._suptitle.get_text()
    # a history without step times or reverts (an older one): E alone, as before
    assert len(fig.axes) == 3 and not _twins(fig, panels["c"])
    assert "right axis" not in panels["c"].get_title(loc="left")
    assert _legend_of(fig, panels["c"]) == ["balance efficiency E", "target 0.95"]


def test_measured_step_times_and_reverts_join_the_balance_panel(tmp_path):
    path = tmp_path / "timed.png"
    history = _timed_history()
    fig = plot_history(history, path)
    assert _is_png(path)
    panels = _axes(fig)
    balance, target = panels["c"].get_lines()  # E keeps its own axis
    assert list(balance.get_ydata()) == pytest.approx([e["balance"] for e in history])
    (twin,) = _twins(fig, panels["c"])
    assert twin.get_ylabel() == "measured step time (s)"
    step_time, undone = twin.get_lines()
    assert list(step_time.get_xdata()) == [1, 2, 3, 4, 5, 6]
    assert list(step_time.get_ydata()) == pytest.approx([e["step_time"] for e in history])
    assert step_time.get_color() != balance.get_color()
    # one marker, at the boundary whose change was undone, on the step-time line
    assert list(undone.get_xdata()) == [4] and list(undone.get_ydata()) == [0.188]
    assert undone.get_marker() == "x" and undone.get_linestyle() == "None"
    lo, hi = twin.get_ylim()
    assert lo <= 0.173 and hi >= 0.262  # every step time inside the right axis
    assert "right axis: measured step time" in panels["c"].get_title(loc="left")
    assert _legend_of(fig, panels["c"]) == [
        "balance efficiency E",
        "target 0.95",
        "measured step time (s)",
        "change reverted (steps got slower)",
    ]
    # beside panel (d) too; and without a revert: the line, no marker
    ddp = {"compute_times": history[0]["compute_times"], "epoch_s": 4.0}
    fig = plot_history(history, baseline=ddp, epoch_s=2.6)
    assert sorted(_axes(fig)) == ["a", "b", "c", "d"]
    assert [len(t.get_lines()) for t in _twins(fig, _axes(fig)["c"])] == [2]
    for entry in history:
        entry["reverted"] = False
    fig = plot_history(history)
    (twin,) = _twins(fig, _axes(fig)["c"])
    assert len(twin.get_lines()) == 1
    assert "change reverted (steps got slower)" not in _legend_of(fig, _axes(fig)["c"])


def test_step_times_that_are_unknown_draw_no_right_axis_but_a_revert_still_shows():
    history = _timed_history()
    for entry in history:
        entry["step_time"] = math.nan
    fig = plot_history(history)
    panels = _axes(fig)
    assert not _twins(fig, panels["c"])
    balance, target, undone = panels["c"].get_lines()  # a line across the panel instead
    assert list(undone.get_xdata()) == [4, 4]
    assert "change reverted (steps got slower)" in _legend_of(fig, panels["c"])
    # NaN step times and no revert at all: as before
    history[3]["reverted"] = math.nan
    fig = plot_history(history)
    assert not _twins(fig, _axes(fig)["c"]) and len(_axes(fig)["c"].get_lines()) == 2


def test_a_baseline_adds_its_bars_and_the_epoch_time_panel(tmp_path):
    ddp = _entry([32] * 4, [32] * 4, 0)
    baseline = {"label": "DDP", **{k: ddp[k] for k in ("compute_times", "wait_times")}}
    fig = plot_history(_history(), tmp_path / "b.png", baseline={**baseline, "epoch_s": 4.0},
                       epoch_s=2.5, title="my title")  # fmt: skip
    panels = _axes(fig)
    assert sorted(panels) == ["a", "b", "c", "d"]
    assert fig._suptitle.get_text() == "my title"
    assert len(panels["b"].patches) == 3 * 4 * 2
    assert panels["b"].get_xticklabels()[0].get_text().startswith("DDP")
    bars = [p.get_width() for p in panels["d"].patches]
    assert bars == [4.0, 2.5]
    (ideal,) = panels["d"].get_lines()  # speeds from the baseline's times: ideal 2.0x
    assert ideal.get_xdata()[0] == pytest.approx(2.0)
    # without epoch times: the bars only; an epoch time needs the other
    assert sorted(_axes(plot_history(_history(), baseline=baseline))) == ["a", "b", "c"]
    with pytest.raises(ValueError, match="epoch_s="):
        plot_history(_history(), baseline={**baseline, "epoch_s": 4.0})


def test_missing_and_nan_entries_and_one_rank_still_draw():
    history = [
        {"batch_sizes": [8], "compute_times": [math.nan], "wait_times": [None],
         "balance": math.nan},
        {"batch_sizes": [8], "compute_times": [0.01], "balance": 1.0},
    ]  # fmt: skip
    panels = _axes(plot_history(history))
    assert len(panels["a"].get_lines()) == 1
    assert len(panels["b"].patches) == 2  # only the boundary with timings
    # no timings at all: a note instead of bars
    panels = _axes(plot_history([{"batch_sizes": [8, 8]}]))
    assert len(panels["a"].get_lines()) == 2 and not panels["b"].patches
    # ranks missing from some entries are padded
    panels = _axes(plot_history([{"batch_sizes": [8]}, {"batch_sizes": [4, 4]}]))
    assert len(panels["a"].get_lines()) == 2


def test_chosen_boundaries_and_a_strategy_object():
    class Strategy:
        history = _history()

    panels = _axes(plot_history(Strategy(), boundaries=[1]))
    assert [t.get_text() for t in panels["b"].get_xticklabels()] == ["Hetero, boundary 2"]
    with pytest.raises(ValueError, match="outside"):
        plot_history(_history(), boundaries=[5])


def test_nothing_to_draw_says_what_is_missing(tmp_path):
    with pytest.raises(ValueError, match="no boundary"):
        plot_history([])
    with pytest.raises(ValueError, match="batch_sizes"):
        plot_history([{"balance": 1.0}])
    with pytest.raises(TypeError, match="metrics.csv"):
        plot_history(3)
    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,loss\n0,1,0.5\n")
    with pytest.raises(ValueError, match="no hetero/batch_size"):
        plot_history(csv)
    csv.write_text("step,hetero/batch_size/rank0,loss\n1,,0.5\n")
    with pytest.raises(ValueError, match="no row"):
        read_metrics(csv)


def test_read_metrics_reads_step_times_and_reverts_when_logged(tmp_path):
    """hetero/step_time per boundary row; a rise of the running hetero/reverts is a revert."""
    csv = tmp_path / "metrics.csv"
    head = "epoch,step,loss,hetero/batch_size/rank0,hetero/batch_size/rank1,hetero/balance"
    rows = [
        "0,4,0.9,,,,,",  # other metrics, between the boundary rows
        "0,9,,32,32,0.5,0.262,0",
        "0,19,,24,40,1.0,0.205,0",
        "1,29,,22,42,0.91,0.176,0",
        "1,30,0.7,,,,,",
        "1,39,,21,43,0.88,0.188,1",
        "2,49,,22,42,0.91,,1",  # an unknown step time
        "2,59,,22,42,0.91,0.173,2",
    ]
    csv.write_text("\n".join([head + ",hetero/step_time,hetero/reverts", *rows]) + "\n")
    entries = read_metrics(csv)
    assert [e["step"] for e in entries] == [9, 19, 29, 39, 49, 59]
    assert [e["batch_sizes"] for e in entries][3] == [21, 43]
    times = [e["step_time"] for e in entries]
    assert times[:4] == [0.262, 0.205, 0.176, 0.188] and math.isnan(times[4])
    assert times[5] == 0.173 and all(isinstance(t, float) for t in times)
    assert [e["reverted"] for e in entries] == [False, False, False, True, False, True]
    fig = plot_history(csv)
    (twin,) = _twins(fig, _axes(fig)["c"])
    step_time, undone = twin.get_lines()
    assert list(undone.get_xdata()) == [4, 6]
    # an older log without those columns: NaN step times, no reverts, and E alone
    csv.write_text("\n".join([head, *[r.rsplit(",", 2)[0] for r in rows]]) + "\n")
    entries = read_metrics(csv)
    assert len(entries) == 6 and [e["balance"] for e in entries][1] == 1.0
    assert all(math.isnan(e["step_time"]) and e["reverted"] is False for e in entries)
    fig = plot_history(csv)
    assert not _twins(fig, _axes(fig)["c"])


class _Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(50, 4, generator=g), torch.randn(50, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8)


@pytest.fixture(scope="module")
def logged_run(tmp_path_factory):
    """A real one-device run with HeteroStrategy and a CSVLogger: (strategy, metrics.csv)."""
    root = tmp_path_factory.mktemp("run")
    strategy = HeteroStrategy()
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=3,
        default_root_dir=root,
        logger=[
            CSVLogger(root, name="run", version="csv"),
            TensorBoardLogger(root, name="run", version="tb"),  # the same run, as events
        ],
        log_every_n_steps=2,  # other metrics' rows in the same file
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    trainer.fit(_Regression())
    return strategy, root / "run" / "csv" / "metrics.csv"


def test_a_csv_log_of_a_real_run_reads_as_its_history(logged_run):
    strategy, csv = logged_run
    entries = read_metrics(csv)
    assert len(entries) == len(strategy.history) >= 3
    for read, kept in zip(entries, strategy.history):
        # logged at Lightning's step for the epoch's values, the last batch's: the history
        # keeps `trainer.global_step`, already raised past that batch
        assert read["step"] == kept["step"] - 1
        assert read["batch_sizes"] == kept["batch_sizes"] == [8]
        assert read["compute_times"] == pytest.approx(kept["compute_times"])
        assert read["wait_times"] == pytest.approx(kept["wait_times"])
        # the guard is on (BSP): the step time and the reverts are logged too
        assert read["step_time"] == pytest.approx(kept["step_time"], nan_ok=True)
        assert read["reverted"] == kept["reverted"]
    assert any(math.isfinite(e["step_time"]) for e in entries)


def test_a_tensorboard_log_reads_as_the_csv_log(logged_run, tmp_path):
    _, csv = logged_run
    folder = csv.parent.parent / "tb"
    event_file = next(folder.glob("events.out.tfevents.*"))
    expected = read_metrics(csv)
    for source in (folder, event_file):
        read = read_metrics(source)
        assert [e["step"] for e in read] == [e["step"] for e in expected]
        for got, want in zip(read, expected):
            assert got["batch_sizes"] == want["batch_sizes"]
            # TensorBoard stores float32
            assert got["compute_times"] == pytest.approx(want["compute_times"], rel=1e-6)
            assert got["reverted"] == want["reverted"]
    main([str(folder)])  # python -m lightning_hetero.plots lightning_logs/version_0
    assert _is_png(folder / "hetero.png")


def test_a_csv_log_and_the_strategy_draw_the_same(logged_run, tmp_path):
    strategy, csv = logged_run
    for source in (csv, str(csv), strategy, strategy.history):
        path = tmp_path / "run.png"
        panels = _axes(plot_history(source, path))
        assert _is_png(path)
        assert len(panels["a"].get_lines()) == 1  # one rank
        assert list(panels["a"].get_lines()[0].get_ydata())[0] == 8
        assert len(panels["c"].get_lines()[0].get_ydata()) == len(strategy.history)


def test_step_times_give_a_ddp_run_the_history_s_per_rank_times(tmp_path):
    """The demo's DDP baseline: one (compute, wait) per rank and epoch, HeteroStrategy's meter."""
    times = StepTimes()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=tmp_path,
        callbacks=[times],
        logger=False,
        enable_model_summary=False,
        enable_checkpointing=False,
    )
    model = _Regression()
    trainer.fit(model)
    assert len(times.compute_times) == len(times.wait_times) == 2
    for compute, wait in zip(times.compute_times, times.wait_times):
        assert len(compute) == len(wait) == 1
        assert 0 < compute[0] < 1 and 0 < wait[0] < compute[0]  # grads-ready marks fired
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())  # taken off


# ---------------------------------------------------------------- plot_speedup
def test_speedup_bars_per_level_and_controller_with_the_ideal(tmp_path):
    rows = [
        {"level": level, "controller": name, "ideal": ideal, "speedup": [s * 0.98, s, s * 1.01]}
        for level, ideal in (("HL1", 1.0), ("HL4", 2.0), ("HL8", 3.1))
        for name, s in (("proportional", 0.93 * ideal), ("lbbsp", 0.96 * ideal))
    ]
    path = tmp_path / "speedup.png"
    fig = plot_speedup(rows, path)
    assert _is_png(path)
    (ax,) = fig.axes
    bars = [p for p in ax.patches]
    assert len(bars) == 6
    assert [round(b.get_height(), 3) for b in bars[:3]] == [0.93, 1.86, 2.883]  # medians
    assert [t.get_text().split("\n")[0] for t in ax.get_xticklabels()] == ["HL1", "HL4", "HL8"]
    labels = [t.get_text() for t in ax.texts]
    assert labels.count("93%") == 3 and labels.count("96%") == 3
    legend = [t.get_text() for t in ax.get_legend().get_texts()]
    for name in ("ideal", "95% of ideal", "proportional", "lbbsp"):
        assert name in legend


def test_speedup_rows_as_one_number_or_median_min_max():
    fig = plot_speedup(
        [{"level": "HL2", "ideal": 1.3, "speedup": 1.2},
         {"level": "HL4", "ideal": 2.0, "median": 1.8, "min": 1.7, "max": 1.9}]
    )  # fmt: skip
    assert [round(p.get_height(), 2) for p in fig.axes[0].patches] == [1.2, 1.8]
    with pytest.raises(ValueError, match="at least one row"):
        plot_speedup([])
    with pytest.raises(ValueError, match="'ideal'"):
        plot_speedup([{"level": "HL2", "speedup": 1.2}])
    with pytest.raises(ValueError, match="no 'speedup'"):
        plot_speedup([{"level": "HL2", "ideal": 1.3}])


# ---------------------------------------------------------------- without matplotlib
def test_without_matplotlib_the_message_names_the_extra(monkeypatch):
    for name in [m for m in sys.modules if m == "matplotlib" or m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    with pytest.raises(ModuleNotFoundError, match=r"pip install 'lightning_hetero\[plot\]'"):
        plot_history(_history())
    with pytest.raises(ImportError, match=r"lightning_hetero\[plot\]"):
        plot_speedup([{"level": "HL2", "ideal": 1.3, "speedup": 1.2}])


def test_the_command_without_matplotlib_exits_2_with_the_message(monkeypatch, logged_run, capsys):
    monkeypatch.setitem(sys.modules, "matplotlib", None)
    for name in [m for m in sys.modules if m.startswith("matplotlib.")]:
        monkeypatch.setitem(sys.modules, name, None)
    with pytest.raises(SystemExit) as exit_info:
        main([str(logged_run[1])])
    assert exit_info.value.code == 2
    assert "pip install 'lightning_hetero[plot]'" in capsys.readouterr().err


# ---------------------------------------------------------------- the command
def test_the_command_draws_a_csv_log(logged_run, tmp_path, capsys):
    out = tmp_path / "out.png"
    main([str(logged_run[1]), "-o", str(out), "--title", "a run"])
    assert _is_png(out)
    assert capsys.readouterr().out.strip() == str(out)


def test_the_command_refuses_what_it_cannot_draw(tmp_path, capsys):
    with pytest.raises(SystemExit) as exit_info:
        main([str(tmp_path / "absent.csv")])
    assert exit_info.value.code == 2 and "does not exist" in capsys.readouterr().err
    empty = tmp_path / "empty_logs"  # a folder with no log in it
    empty.mkdir()
    with pytest.raises(SystemExit) as exit_info:
        main([str(empty)])
    assert exit_info.value.code == 2 and "no hetero/batch_size" in capsys.readouterr().err
    csv = tmp_path / "metrics.csv"
    csv.write_text("epoch,step,loss\n0,1,0.5\n")
    with pytest.raises(SystemExit) as exit_info:
        main([str(csv)])
    assert exit_info.value.code == 2 and "no hetero/batch_size" in capsys.readouterr().err


def test_python_dash_m_writes_the_png_next_to_the_csv(logged_run, tmp_path):
    csv = tmp_path / "metrics.csv"
    csv.write_bytes(logged_run[1].read_bytes())
    proc = subprocess.run(
        [sys.executable, "-m", "lightning_hetero.plots", str(csv)],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.strip() == str(tmp_path / "metrics.png")
    assert _is_png(tmp_path / "metrics.png")


# ---------------------------------------------------------------- the benchmark's chart
def _pair(ddp_s, hetero_s):
    history = _history()
    return {
        "ddp": {"epoch_s": [ddp_s] * 4},
        "hetero": {"epoch_s": [hetero_s] * 4, "history": history},
    }


def test_the_benchmark_draws_its_speedups(monkeypatch, tmp_path, capsys):
    seen = []

    def fake_measure(levels, repeats, *args, **kwargs):
        seen.append(levels)
        return {level: [_pair(4.0, 2.2), _pair(4.0, 2.0)] for level in levels}

    monkeypatch.setattr(bench_main, "measure", fake_measure)
    raw = fake_measure(["HL4"], 2)
    (row,) = bench_main.speedup_rows(raw, 2, "proportional")
    assert row["level"] == "HL4" and row["ideal"] == pytest.approx(2.0)
    assert row["speedup"] == pytest.approx([4.0 / 2.2, 2.0]) and row["controller"] == "proportional"
    # next to --json by default
    json_path = tmp_path / "raw.json"
    bench_main.main(["--levels", "HL2", "HL4", "--repeats", "2", "--json", str(json_path)])
    assert _is_png(tmp_path / "raw.png")
    assert f"chart: {tmp_path / 'raw.png'}" in capsys.readouterr().out
    # --plot PATH, and --no-plot
    bench_main.main(["--levels", "HL4", "--plot", str(tmp_path / "c.png")])
    assert _is_png(tmp_path / "c.png")
    capsys.readouterr()
    monkeypatch.chdir(tmp_path)
    bench_main.main(["--levels", "HL4", "--no-plot"])
    assert "chart:" not in capsys.readouterr().out
    assert not (tmp_path / "bench_logs").exists()
    bench_main.main(["--levels", "HL4"])
    assert _is_png(tmp_path / "bench_logs" / "speedup.png")


def test_the_benchmark_without_matplotlib_says_so_before_its_runs(monkeypatch, tmp_path, capsys):
    find_spec = importlib.util.find_spec
    monkeypatch.setattr(
        importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else find_spec(name, *a),
    )
    measured = []
    monkeypatch.setattr(
        bench_main, "measure", lambda *a, **k: measured.append(a) or {"HL4": [_pair(4, 2)]}
    )
    with pytest.raises(SystemExit) as exit_info:
        bench_main.main(["--levels", "HL4", "--plot", str(tmp_path / "c.png")])
    assert exit_info.value.code == 2 and not measured  # refused before running anything
    assert "pip install 'lightning_hetero[plot]'" in capsys.readouterr().err
    monkeypatch.chdir(tmp_path)
    bench_main.main(["--levels", "HL4"])  # the default chart: the table, and a note
    captured = capsys.readouterr()
    assert "| HL4 |" in captured.out and "chart:" not in captured.out
    assert "no speedup chart" in captured.err and not (tmp_path / "bench_logs").exists()
