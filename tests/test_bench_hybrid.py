from dataclasses import fields

import pytest

from lightning_hetero.bench import hybrid
from lightning_hetero.bench.dual import stages
from lightning_hetero.bench.hybrid import hybrid_configs, hybrid_misses, pixel_costs
from lightning_hetero.bench.run import RunConfig


def test_pixel_costs_scale_each_sub_stage_by_its_pixels_from_its_first_epoch():
    schedule = stages(9, (16, 24, 32), (0.0, 0.0, 0.0))  # epochs per stage [3, 3, 3]
    costs = pixel_costs([0.002, 0.006], schedule, 32)
    assert sorted(costs) == list(range(9))  # one sub-stage per epoch
    assert costs[0] == pytest.approx([0.0005, 0.0015])  # 16x16: a quarter of the pixels
    assert costs[1] == pytest.approx([0.002 * 0.5625, 0.006 * 0.5625])  # 24x24
    assert costs[2] == [0.002, 0.006] and costs[5] == [0.002, 0.006]
    assert costs[3] == costs[0]  # the next stage cycles from low resolution again
    rect = [{"lr": 0.1, "substages": [{"epochs": 2, "resolution": [16, 32]}]}]
    assert pixel_costs([1.0], rect, 32) == {0: [0.5]}
    with pytest.raises(ValueError, match="`reference` must be a resolution >= 1"):
        pixel_costs([1.0], rect, 0)


def test_hybrid_configs_share_the_stage_learning_rates_and_only_the_hybrid_resizes():
    catalog = hybrid_configs([0.002, 0.006], 12)
    names = {f.name for f in fields(RunConfig)}
    assert all(set(config) <= names for config in catalog.values())
    RunConfig(**catalog["hybrid"])  # the mapping's keys are JSON's strings: run() takes them
    ddp, hyb, dual = catalog["ddp"], catalog["hybrid"], catalog["dual"]
    assert ddp["strategy"] == "ddp" and ddp["sample_cost"] == [0.002, 0.006]
    assert dual["progressive"] == ddp["progressive"] and dual["sample_cost"] == ddp["sample_cost"]
    lrs = [[stage["lr"]] * len(stage["substages"]) for stage in hyb["progressive"]]
    assert [stage["lr"] for stage in ddp["progressive"]] == [lr[0] for lr in lrs]
    epochs = [sum(s["epochs"] for s in stage["substages"]) for stage in hyb["progressive"]]
    assert epochs == [sum(s["epochs"] for s in stage["substages"]) for stage in ddp["progressive"]]
    assert {s["resolution"] for st in ddp["progressive"] for s in st["substages"]} == {32}
    first = [st["substages"][0]["resolution"] for st in hyb["progressive"]]
    assert first == [24, 24, 24]  # every stage starts low
    assert hyb["sample_cost"]["0"] == pytest.approx([0.002 * 0.5625, 0.006 * 0.5625])
    assert hyb["controller"] == dual["controller"] == "dual"
    assert hyb["extra"] == {"mode": "async"}
    assert hyb["controller_options"] == {"small_workers": 1, "extra_time_ratio": 1.01}


@pytest.mark.parametrize(
    "options, message",
    [
        ({"resolutions": (32, 16)}, "go up from low to the task's 32"),
        ({"resolutions": (16, 24)}, "go up from low to the task's 32"),
        ({"resolutions": (16, 24, 32), "dropouts": (0.1,)}, "one dropout per resolution"),
        ({"dropouts": (0.1,)}, "one dropout per resolution"),
        ({"names": ("ddp", "bsp")}, "unknown configurations"),
    ],
)
def test_hybrid_configs_refuse_what_they_cannot_build(options, message):
    with pytest.raises(ValueError, match=message):
        hybrid_configs([0.002, 0.006], 12, **options)


def test_the_hybrid_target_is_ddps_accuracy_in_at_most_nine_tenths_of_its_time():
    def figs(delta: float, ratio: float) -> dict[str, float]:
        return {"acc_delta": delta, "time_ratio": ratio, "speedup": 1.0}

    assert hybrid_misses("hybrid", "slow", figs(0.0, 0.9)) == []
    assert hybrid_misses("hybrid", "slow", figs(-0.1, 0.91)) == [
        "acc < DDP's",
        "time > 0.9x DDP's",
    ]


def test_measure_hybrid_runs_every_config_per_seed_and_counts_every_epoch(monkeypatch, tmp_path):
    launched, ticks, lines = [], [], []

    def fake_launch(config, workdir, timeout=None, on_epoch=None):
        launched.append(config)
        if config["strategy"] == "ddp":
            for epoch in (1, 2, 3):
                on_epoch(epoch)
            curve = [(1.0, 0.8, 0.5), (2.0, 0.9, 0.4), (3.0, 0.95, 0.3)]
            return {"accuracy_curve": curve, "train_s": 3.2, "setup_s": 0.5}
        on_epoch(1)
        raise RuntimeError("rank 1 died")  # the hybrid: counted to the end all the same

    monkeypatch.setattr(hybrid, "launch", fake_launch)
    result = hybrid.measure_hybrid(
        ["slow"], [0, 1], tmp_path, epochs=9, progress=ticks.append, log=lines.append
    )
    assert len(launched) == 4 and sum(ticks) == 4 * 9 and len(lines) == 4
    assert [c["seed"] for c in launched] == [0, 0, 1, 1]
    assert {c["batch_size"] for c in launched} == {32}  # a global batch of 64 on 2 ranks
    ddp = [c for c in launched if c["strategy"] == "ddp"]
    assert all(c["sample_cost"] == [0.002, 0.006] for c in ddp)
    runs = result["runs"]["slow"]
    assert "error" in runs[0]["hybrid"] and runs[1]["ddp"]["train_s"] == 3.2
    text = hybrid.convergence_report(result, misses=hybrid_misses)
    assert "| slow | 0 | `hybrid` | failed |" in text
    assert "| slow | 1 | `ddp` | 0.800 / 0.900 / 0.950 | 3.7 (1.00) | 1.00x | +0.0 | - |" in text


def test_the_command_passes_its_options_through(monkeypatch, capsys):
    seen = {}

    def fake_measure(speeds, seeds, workdir, sample_cost, epochs, configs, **options):
        seen.update(speeds=speeds, seeds=seeds, epochs=epochs, configs=configs, **options)
        return {"task": "images", "workers": 2, "common": {}, "runs": {}}

    monkeypatch.setattr(hybrid, "measure_hybrid", fake_measure)
    hybrid.main(["--seeds", "3", "--resolutions", "24", "32", "--configs", "ddp", "dual"])
    assert seen["seeds"] == [3] and seen["speeds"] == ["slow"] and seen["epochs"] == 12
    assert seen["hybrid_epochs"] == 14 and seen["extra_time_ratio"] == 1.01
    assert seen["resolutions"] == (24, 32) and seen["configs"] == ["ddp", "dual"]
    assert "Task `images`, 2 ranks" in capsys.readouterr().out


def test_the_hybrid_may_train_more_epochs_and_keep_its_large_batch():
    catalog = hybrid_configs([0.002, 0.006], 12, hybrid_epochs=18, fixed_batch=True)
    hyb, ddp = catalog["hybrid"], catalog["ddp"]
    assert hyb["epochs"] == 18 and "epochs" not in ddp  # DDP runs the task's epochs
    assert sum(s["epochs"] for st in hyb["progressive"] for s in st["substages"]) == 18
    assert sorted(map(int, hyb["sample_cost"]))[-1] < 18
    assert {s["batch_size"] for st in hyb["progressive"] for s in st["substages"]} == {32}
    assert all("batch_size" not in s for st in ddp["progressive"] for s in st["substages"])
    default = hybrid_configs([0.002, 0.006], 12)["hybrid"]
    assert all("batch_size" not in s for st in default["progressive"] for s in st["substages"])
