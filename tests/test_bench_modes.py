import json
import math

import pytest

from lightning_hetero.bench import modes
from lightning_hetero.bench.__main__ import main
from lightning_hetero.bench.modes import CONFIGS, figures, modes_report, run_order


def run(curve: list[tuple[float, float]], train_s: float | None = None) -> dict:
    """A fake run summary: (training seconds, val accuracy) per epoch; loss = 1 - accuracy."""
    points = [(t, acc, 1 - acc) for t, acc in curve]
    return {"accuracy_curve": points, "train_s": train_s or curve[-1][0] + 0.5}


def table_rows(text: str) -> dict[tuple[str, str], list[str]]:
    rows = {}
    for line in text.splitlines():
        if line.startswith("| HL"):
            cells = [c.strip() for c in line.strip("|").split("|")]
            rows[(cells[0], cells[1].strip("`"))] = cells[2:]
    return rows


def test_time_to_target_is_the_first_epoch_at_or_above_it_and_speedup_is_within_the_repeat():
    runs = {
        "ddp": run([(4.0, 0.5), (8.0, 0.9), (12.0, 0.95)]),
        "bsp": run([(2.0, 0.6), (4.0, 0.85), (6.0, 0.91)]),
        "async": run([(2.0, 0.3), (4.0, 0.5), (6.0, 0.6)]),
        "local": {"error": "RuntimeError: boom"},
    }
    out = figures(runs, target=0.9)
    assert set(out) == {"ddp", "bsp", "async"}  # the failed run has no figures
    assert out["ddp"]["tta_s"] == 8.0 and out["ddp"]["epochs_to_target"] == 2
    assert out["ddp"]["speedup"] == 1.0
    assert out["bsp"]["tta_s"] == 6.0 and out["bsp"]["speedup"] == pytest.approx(8 / 6)
    assert out["bsp"]["final_acc"] == 0.91 and out["bsp"]["final_loss"] == pytest.approx(0.09)
    assert out["bsp"]["train_s"] == 6.5
    assert math.isinf(out["async"]["tta_s"]) and out["async"]["reached"] == 0.0
    assert out["async"]["speedup"] == 0.0  # never reached: infinitely slower


def test_speedup_when_ddp_does_not_reach_the_target():
    out = figures(
        {"ddp": run([(4.0, 0.5)]), "bsp": run([(2.0, 0.95)]), "async": run([(2, 0)])}, 0.9
    )
    assert math.isinf(out["bsp"]["speedup"])
    assert math.isnan(out["async"]["speedup"]) and math.isnan(out["ddp"]["speedup"])
    assert math.isnan(figures({"bsp": run([(2.0, 0.95)])}, 0.9)["bsp"]["speedup"])  # no ddp


def test_report_gives_min_median_max_over_repeats_and_counts_the_repeats_that_reached():
    raw = {
        "HL4": [
            {"ddp": run([(10.0, 0.95)]), "bsp": run([(5.0, 0.92)])},
            {"bsp": run([(8.0, 0.80)]), "ddp": run([(12.0, 0.91)])},
            {"ddp": run([(11.0, 0.93)]), "bsp": run([(4.0, 0.99)])},
        ],
        "HL8": [{"ddp": run([(20.0, 0.5)]), "bsp": {"error": "RuntimeError: gone\nstack"}}],
    }
    text = modes_report(raw, target=0.9)
    rows = table_rows(text)
    columns = list(modes.COLUMNS)
    ddp, bsp = rows[("HL4", "ddp")], rows[("HL4", "bsp")]
    assert ddp[columns.index("final_acc")] == "0.910 / 0.930 / 0.950"
    assert ddp[columns.index("tta_s")] == "10.0 / 11.0 / 12.0"
    assert ddp[columns.index("speedup")] == "1.00"  # one value when all repeats agree
    assert ddp[columns.index("reached")] == "3/3"
    assert bsp[columns.index("tta_s")] == "4.0 / 5.0 / -"  # repeat 2 did not reach 0.9
    assert bsp[columns.index("reached")] == "2/3"
    # speedups within each repeat: 10/5, 0 (not reached), 11/4
    assert bsp[columns.index("speedup")] == "0.00 / 2.00 / 2.75"
    assert bsp[columns.index("train_s")] == "4.5 / 5.5 / 8.5"
    hl8_ddp, hl8_bsp = rows[("HL8", "ddp")], rows[("HL8", "bsp")]
    assert hl8_ddp[columns.index("tta_s")] == "-" and hl8_ddp[columns.index("reached")] == "0/1"
    assert hl8_bsp[columns.index("final_acc")] == "failed"
    assert hl8_bsp[columns.index("reached")] == "0/1"
    assert "- HL8 bsp: RuntimeError: gone" in text
    assert "Target accuracy 0.9." in text


def test_the_median_of_two_repeats_where_one_did_not_reach_is_not_reached():
    raw = {"HL4": [{"ddp": run([(10.0, 0.95)])}, {"ddp": run([(10.0, 0.5)])}]}
    ddp = table_rows(modes_report(raw, target=0.9))[("HL4", "ddp")]
    assert ddp[list(modes.COLUMNS).index("tta_s")] == "10.0 / - / -"


def test_run_order_changes_from_repeat_to_repeat_and_keeps_every_configuration():
    names = list(CONFIGS)
    orders = [run_order(names, r) for r in range(3)]
    assert orders[0] == names
    assert all(sorted(order) == sorted(names) for order in orders)
    assert len({order[0] for order in orders}) == 3  # a different first run each repeat
    before = [order.index("ddp") < order.index("bsp") for order in orders]
    assert True in before and False in before
    assert run_order(["a", "b", "c"], 1) == ["b", "a", "c"]


def test_configurations_set_the_strategy_options_of_issue_4():
    assert CONFIGS["ddp"] == {"strategy": "ddp"}
    assert CONFIGS["bsp-unweighted"]["weighted"] is False
    assert CONFIGS["async-unscaled"]["extra"] == {"mode": "async", "lr_scaling": False}
    assert CONFIGS["local"]["extra"]["gamma"] == 0.9
    assert CONFIGS["local-gamma0"]["extra"]["gamma"] == 0.0


def test_measure_runs_each_configuration_per_repeat_and_logs_progress(monkeypatch, tmp_path):
    launched = []

    def fake_launch(config, workdir, timeout=None):
        launched.append(config)
        if config.get("extra", {}).get("mode") == "async":
            raise RuntimeError("rank 2 died")
        return run([(1.0, 0.95)])

    monkeypatch.setattr(modes, "launch", fake_launch)
    lines: list[str] = []
    raw = modes.measure_modes(
        ["HL8"], 2, 3, 0.048, tmp_path, configs=["ddp", "bsp", "async"], log=lines.append
    )
    assert len(launched) == 6 and len(lines) == 6
    assert [c["seed"] for c in launched] == [0, 0, 0, 1, 1, 1]
    assert all(c["val_every_epoch"] and c["epochs"] == 3 for c in launched)
    assert launched[0]["sample_cost"] == pytest.approx([0.008, 0.008, 0.012, 0.0015])
    assert raw["HL8"][1]["async"]["error"] == "RuntimeError: rank 2 died"
    assert lines[0].startswith("[1/6] HL8 repeat 1 ddp:") and "val acc 0.950" in lines[0]
    assert "FAILED (RuntimeError)" in lines[-3] + lines[-2] + lines[-1]


def test_each_level_runs_with_its_own_costs_and_the_common_fields(monkeypatch, tmp_path):
    launched = []
    monkeypatch.setattr(
        modes, "launch", lambda config, workdir, timeout=None: launched.append(config) or {}
    )
    modes.measure_modes(
        ["HL4", "HL8"], 1, 1, 0.048, tmp_path, configs=["bsp"], log=len, common={"lr": 0.1}
    )
    hl4, hl8 = launched
    assert hl4["sample_cost"] == pytest.approx([0.048 / c for c in (9, 9, 6, 24)])
    assert hl8["sample_cost"] == pytest.approx([0.048 / c for c in (6, 6, 4, 32)])
    assert hl4["lr"] == hl8["lr"] == 0.1


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--target", "1.5"], "--target must be an accuracy in (0, 1]"),
        (["--target", "0.9", "0"], "--target must be an accuracy in (0, 1]"),
        (["--epochs", "0"], "need --repeats >= 1 and --epochs >= 1"),
        (["--repeats", "0"], "need --repeats >= 1 and --epochs >= 1"),
        (["--configs", "nope"], "unknown --configs ['nope']"),
        (["--levels", "HL3"], "invalid choice: 'HL3'"),
        (["--target", "high"], "invalid float value"),
        (["--simulate"], "pick one"),
    ],
)
def test_bad_arguments_are_usage_errors(args, message, capsys, monkeypatch):
    monkeypatch.setattr(modes, "launch", pytest.fail)  # nothing may run
    with pytest.raises(SystemExit) as exit_info:
        main(["--modes", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--configs", "bsp"], "unknown --configs ['bsp']"),
        (["--small-workers", "4"], "need 0 < --small-workers < 4"),
        (["--extra-time-ratio", "1.0"], "--extra-time-ratio > 1"),
        (["--epochs", "2"], "too few for 3 stages"),
        (["--modes"], "separate benchmarks; pick one"),
    ],
)
def test_bad_dual_arguments_are_usage_errors(args, message, capsys, monkeypatch):
    monkeypatch.setattr(modes, "launch", pytest.fail)  # nothing may run
    with pytest.raises(SystemExit) as exit_info:
        main(["--dual", *args])
    assert exit_info.value.code == 2
    assert message in capsys.readouterr().err


def test_dual_benchmark_runs_its_three_configurations_on_digits_at_32(monkeypatch, capsys):
    launched = []

    def fake_launch(config, workdir, timeout=None):
        launched.append(config)
        return run([(1.0, 0.95)])

    monkeypatch.setattr(modes, "launch", fake_launch)
    main(["--dual", "--repeats", "1", "--epochs", "6"])
    assert sorted(c["progressive"][0]["substages"][0]["resolution"] for c in launched) == [
        24,
        32,
        32,
    ]
    assert all(c["resolution"] == 32 and c["sample_cost"] == [0.0] * 4 for c in launched)
    assert {c["controller_options"]["small_workers"] for c in launched} == {0, 2}
    assert "`uniform-large` / this configuration's" in capsys.readouterr().out


def test_without_the_hybrid_the_dual_benchmark_takes_fewer_epochs(monkeypatch):
    launched = []
    monkeypatch.setattr(
        modes, "launch", lambda config, workdir, timeout=None: launched.append(config) or {}
    )
    main(["--dual", "--repeats", "1", "--epochs", "4", "--configs", "dual", "uniform-large"])
    assert len(launched) == 2  # the hybrid's cyclic schedule would need 6
    assert all(c["progressive"][0]["substages"][0]["resolution"] == 32 for c in launched)


def test_command_line_writes_json_and_prints_the_table(monkeypatch, tmp_path, capsys):
    seen = []

    def fake_measure(levels, repeats, epochs, base_cost, workdir, configs):
        seen.append((levels, repeats, epochs, configs))
        return {"HL4": [{"ddp": run([(3.0, 0.95)]), "local": run([(2.0, 0.95)])}]}

    monkeypatch.setattr("lightning_hetero.bench.__main__.measure_modes", fake_measure)
    out = tmp_path / "modes.json"
    main(["--modes", "--repeats", "1", "--configs", "ddp", "local", "--json", str(out)])
    assert seen == [(["HL4", "HL8"], 1, 8, ["ddp", "local"])]  # the --modes defaults
    assert json.loads(out.read_text())["HL4"][0]["ddp"]["train_s"] == 3.5
    text = capsys.readouterr().out
    assert text.count("| level | config |") == 1 and "Target accuracy 0.9." in text
    rows = table_rows(text)
    assert rows[("HL4", "local")][list(modes.COLUMNS).index("speedup")] == "1.50"


def test_one_table_per_target(monkeypatch, capsys):
    def fake_measure(*args):
        return {"HL4": [{"ddp": run([(3.0, 0.92), (6.0, 0.96)])}]}

    monkeypatch.setattr("lightning_hetero.bench.__main__.measure_modes", fake_measure)
    main(["--modes", "--target", "0.9", "0.95", "0.99"])
    text = capsys.readouterr().out
    tables = text.split("| level | config |")[1:]
    assert len(tables) == 3
    tta = [table_rows("|" + t)[("HL4", "ddp")][list(modes.COLUMNS).index("tta_s")] for t in tables]
    assert tta == ["3.0", "6.0", "-"]


def test_one_real_epoch_of_two_configurations(tmp_path):  # about 20 s
    raw = modes.measure_modes(
        ["HL4"], 1, 1, 0.002, tmp_path, configs=["ddp", "async"], log=lambda line: None
    )
    for name in ("ddp", "async"):
        summary = raw["HL4"][0][name]
        assert "error" not in summary, summary.get("error")
        ((train_s, acc, loss),) = summary["accuracy_curve"]
        assert 0 < train_s <= summary["train_s"] < summary["fit_s"]
        assert 0 <= acc <= 1 and loss > 0
    assert "| HL4 | `async` |" in modes_report(raw, 0.5)


def test_the_convergence_benchmark_runs_every_config_per_seed_with_the_tasks_fields(
    monkeypatch, tmp_path
):
    from dataclasses import fields

    from lightning_hetero.bench.run import RunConfig

    launched = []

    def fake_launch(config, workdir, timeout=None):
        launched.append(config)
        if config.get("extra", {}).get("mode") == "local":
            raise RuntimeError("rank 1 died")
        acc = 0.7 if config["strategy"] == "ddp" else 0.75
        return run([(3.0, acc - 0.1), (6.0, acc)])

    monkeypatch.setattr(modes, "launch", fake_launch)
    lines: list[str] = []
    result = modes.measure_convergence(
        "reverse", 2, ["equal", "slow"], [0, 1], ["ddp", "async", "local"], tmp_path,
        log=lines.append,
    )  # fmt: skip
    assert len(launched) == 12 and len(lines) == 12
    names = {f.name for f in fields(RunConfig)}
    assert all(set(c) <= names for c in launched)  # every field is a RunConfig field
    assert {c["batch_size"] for c in launched} == {64}  # the global batch of 128
    assert {c["lr"] for c in launched} == {5e-4} and {c["model"] for c in launched} == {"reverse"}
    assert {c["accelerator"] for c in launched} == {"cpu"}
    slow = [c["sample_cost"] for c in launched if c["sample_cost"][1] != c["sample_cost"][0]]
    assert len(slow) == 6 and all(cost[1] == 3 * cost[0] for cost in slow)
    assert [c["seed"] for c in launched[:6]] == [0, 0, 0, 1, 1, 1]
    text = modes.convergence_report(result)
    assert "| equal | 1 | `async` | 0.650 / 0.750 | 6.5 (1.00) | 1.00x | +5.0 | none |" in text
    assert "| slow | 0 | `local` | failed | | | | |" in text
    assert "| equal | 0 | `ddp` | 0.600 / 0.700 | 6.5 (1.00) | 1.00x | +0.0 | - |" in text


def test_the_convergence_report_times_from_the_start_of_fit_to_ddps_best_less_one_point():
    def timed(curve, setup_s):
        return {**run(curve), "setup_s": setup_s}

    ddp = timed([(4.0, 0.90), (8.0, 0.96), (12.0, 0.95)], 1.0)  # target 0.95: 9 s from fit
    runs = {
        "ddp": ddp,
        "bsp": timed([(2.0, 0.90), (4.0, 0.96), (6.0, 0.95)], 1.0),  # 5 s: 9/5
        "async-plain": timed([(1.0, 0.94), (2.0, 0.93), (3.0, 0.92)], 3.0),  # never, -3 points
        "dual": timed([(2.0, 0.95), (4.0, 0.96), (6.0, 0.96)], 5.0),  # 7 s: 9/7
    }
    result = {"task": "digits", "workers": 2, "common": {}, "runs": {"slow": [runs]}}
    rows = {
        line.split("|")[3].strip(" `"): [c.strip() for c in line.strip("|").split("|")]
        for line in modes.convergence_report(result).splitlines()
        if line.startswith("| slow")
    }
    assert rows["ddp"][4:] == ["13.5 (1.00)", "1.00x", "+0.0", "-"]
    assert rows["bsp"][4:] == ["7.5 (0.56)", "1.80x", "+0.0", "none"]
    # judged as async: never reached, 3 points under DDP with SGD
    assert rows["async-plain"][4:] == ["6.5 (0.48)", "never", "-3.0", "time < 1.2x, acc < DDP - 2"]
    assert rows["dual"][4:6] == ["11.5 (0.85)", "1.29x"]
    misses = modes.convergence_report(
        result, misses=lambda name, speed, f: [f"{f['time_ratio']:.2f}"]
    )
    assert "| slow | 0 | `dual` |" in misses and "| +1.0 | 0.85 |" in misses


def test_the_global_batch_overrides_the_tasks_and_must_split_evenly(monkeypatch, tmp_path):
    launched = []
    monkeypatch.setattr(modes, "launch", lambda config, *a, **k: launched.append(config) or {})
    modes.measure_convergence(
        "digits", 2, ["equal"], [0], ["ddp"], tmp_path, global_batch=64, log=lambda line: None
    )
    assert [c["batch_size"] for c in launched] == [32]
    with pytest.raises(ValueError, match="global batch 64 does not split evenly over 3 ranks"):
        modes.measure_convergence("digits", 3, ["equal"], [0], ["ddp"], tmp_path, global_batch=64)


def test_every_convergence_configuration_builds_a_strategy():
    from lightning_hetero import HeteroStrategy
    from lightning_hetero.bench.run import RunConfig, controller_of

    for fields_ in modes.CONVERGENCE_CONFIGS.values():
        config = RunConfig(**fields_)
        if config.strategy == "hetero":
            HeteroStrategy(controller=controller_of(config), **config.extra)


def test_the_convergence_command_passes_the_sample_cost_through(monkeypatch, tmp_path, capsys):
    seen = []

    def fake_measure(task, workers, speeds, seeds, configs, workdir, **options):
        seen.append(options)
        return {"task": task, "workers": workers, "common": {}, "runs": {}}

    monkeypatch.setattr(modes, "measure_convergence", fake_measure)
    modes.main(["--task", "digits", "--workers", "4", "--sample-cost", "2e-3"])
    modes.main(
        ["--task", "digits", "--workers", "4", "--global-batch", "64", "--accelerator", "gpu"]
    )
    assert [options["sample_cost"] for options in seen] == [2e-3, 2e-4]
    assert [options["global_batch"] for options in seen] == [None, 64]
    assert [options["accelerator"] for options in seen] == ["cpu", "gpu"]


def test_the_accuracy_curve_counts_the_set_up_from_the_start_of_fit(monkeypatch):
    from types import SimpleNamespace

    from lightning_hetero.bench import run as run_module

    clock = iter([10.0, 12.5])  # setup, then on_train_start
    monkeypatch.setattr(run_module.time, "perf_counter", lambda: next(clock))
    curve = run_module.AccuracyCurve()
    curve.setup(SimpleNamespace(), SimpleNamespace(), "validate")  # not fit: no start
    assert curve._fit_start is None
    curve.setup(SimpleNamespace(), SimpleNamespace(), "fit")
    curve.on_train_start(SimpleNamespace(), SimpleNamespace())
    assert curve.setup_s == 2.5


def test_mps_shares_replace_the_throttle_and_run_under_the_daemon(monkeypatch, tmp_path):
    import contextlib

    from lightning_hetero.bench import mps

    seen, daemons, launched = [], [], []

    def fake_measure(task, workers, speeds, seeds, configs, workdir, **options):
        seen.append((speeds, options))
        return {"task": task, "workers": workers, "common": {}, "runs": {}}

    monkeypatch.setattr(mps, "mps_daemon", lambda: daemons.append(1) or contextlib.nullcontext())
    monkeypatch.setattr(modes, "measure_convergence", fake_measure)
    argv = ["--task", "digits", "--workers", "2", "--accelerator", "gpu", "--mps-shares", "100"]
    modes.main([*argv, "33", "--resolution", "64", "--width", "16"])
    ((speeds, options),) = seen
    assert speeds == ["mps 100/33"] and daemons == [1]
    assert options["fields"] == {"resolution": 64, "width": 16, "mps_shares": [100, 33]}
    with pytest.raises(SystemExit):  # one share per rank, on a GPU
        modes.main([*argv, "33", "50"])
    # the shares set the speeds: no Throttle cost in any run
    monkeypatch.undo()
    monkeypatch.setattr(modes, "launch", lambda config, *a, **k: launched.append(config) or {})
    modes.measure_convergence(
        "digits", 2, ["mps 100/33"], [0], ["ddp"], tmp_path, log=lambda line: None,
        accelerator="gpu", fields={"mps_shares": [100, 33]},
    )  # fmt: skip
    assert launched[0]["sample_cost"] is None and launched[0]["mps_shares"] == [100, 33]


def test_the_throttles_loading_step_and_noise_costs_reach_every_run(monkeypatch, tmp_path):
    seen = []

    def fake_measure(task, workers, speeds, seeds, configs, workdir, **options):
        seen.append(options["fields"])
        return {"task": task, "workers": workers, "common": {}, "runs": {}}

    monkeypatch.setattr(modes, "measure_convergence", fake_measure)
    modes.main(["--workers", "2", "--load-cost", "5e-4", "--step-cost", "0.01", "--noise", "0.1"])
    modes.main(["--workers", "2"])
    assert seen == [{"load_cost": 5e-4, "step_cost": 0.01, "noise": 0.1}, {}]
    monkeypatch.undo()
    launched = []
    monkeypatch.setattr(modes, "launch", lambda config, *a, **k: launched.append(config) or {})
    modes.measure_convergence(
        "digits", 2, ["slow"], [0], ["ddp"], tmp_path, log=lambda line: None,
        fields={"load_cost": 5e-4},
    )  # fmt: skip
    assert launched[0]["load_cost"] == 5e-4 and launched[0]["sample_cost"] == [2e-4, 3 * 2e-4]
