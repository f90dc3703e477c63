import csv

import pytest

from lightning_hetero.planning import HETEROGENEITY_LEVELS, proportional_split
from tests.e2e.launch import run_training
from tests.e2e.plans import assert_converged

HL4 = HETEROGENEITY_LEVELS["HL4"]
# 72 ms per sample on a 1-core worker (rank 3's 32 samples sleep 96 ms): the real compute that
# every rank pays alike, about 35 ms a step on a loaded 2-core machine, is small beside it. It
# pulls each move toward uniform (the first lands at the split of 1 / (cost + real / b)).
HL4_COST = [0.072 / cores for cores in HL4]
GLOBAL_BATCH = 4 * 32


def _converged(summary: dict) -> None:
    """The run's plans converged on HL4's split (``plans.assert_converged``), and its final
    plan is the last boundary's."""
    plans = [entry["next_batch_sizes"] for entry in summary["history"]]
    assert sum(summary["batch_sizes"]) == GLOBAL_BATCH and summary["batch_sizes"] == plans[-1]
    assert_converged(plans, proportional_split(HL4, GLOBAL_BATCH))


@pytest.fixture(scope="module")
def hl4_run(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("hl4")
    summary = run_training(
        tmp,
        strategy="hetero",
        workers=4,
        sample_cost=HL4_COST,
        epochs=3,
        log_dir=str(tmp / "logs"),
        checkpoint_dir=str(tmp / "ckpt"),
        validate=False,
    )
    return tmp, summary


def test_plan_moves_within_20_percent_of_the_speed_proportional_split_in_3_epochs(hl4_run):
    _, summary = hl4_run
    _converged(summary)
    history = summary["history"]
    assert [entry["epoch"] for entry in history] == [0, 1, 2]
    assert history[0]["batch_sizes"] == [32, 32, 32, 32] and history[0]["changed"]
    assert history[0]["balance"] < 0.8 < history[-1]["balance"]


def test_slow_ranks_wait_less_after_rebalancing(hl4_run):
    _, summary = hl4_run
    first, last = summary["history"][0], summary["history"][-1]
    # under the uniform plan the fast rank 3 waits for rank 2; afterwards far less
    assert first["wait_times"][3] > 2 * last["wait_times"][3]


def test_controller_metrics_reach_csv_and_tensorboard(hl4_run):
    tmp, _ = hl4_run
    with open(tmp / "logs" / "hetero" / "csv" / "metrics.csv") as f:
        rows = list(csv.DictReader(f))
    columns = set(rows[0])
    for rank in range(4):
        for name in ("batch_size", "compute_time", "wait_time", "throughput"):
            assert f"hetero/{name}/rank{rank}" in columns
    assert {"hetero/balance", "hetero/adjustments"} <= columns
    logged = [r for r in rows if r["hetero/batch_size/rank3"]]
    assert [float(r["hetero/batch_size/rank3"]) for r in logged][0] == 32.0
    assert len(logged) == 3
    tensorboard_files = list(
        (tmp / "logs" / "hetero" / "tensorboard").glob("events.out.tfevents.*")
    )
    assert tensorboard_files
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tensorboard_files[0].parent)).Reload()
    assert "hetero/batch_size/rank2" in events.Tags()["scalars"]
    assert "custom_scalars__config__" in events.Tags()["tensors"]  # the multi-line charts


def test_resume_from_checkpoint_keeps_the_learned_plan(hl4_run, tmp_path):
    tmp, first = hl4_run
    resumed = run_training(
        tmp_path,
        strategy="hetero",
        workers=4,
        sample_cost=HL4_COST,
        epochs=4,
        resume_from=str(tmp / "ckpt" / "last.ckpt"),
        controller="static",
        validate=False,
    )
    history = resumed["history"]
    assert len(history) == 4
    assert history[:3] == first["history"]
    assert history[3]["batch_sizes"] == first["batch_sizes"]


def test_boring_model_trains_unchanged_with_hetero_strategy(tmp_path):
    summary = run_training(
        tmp_path, strategy="hetero", workers=2, model="boring", epochs=2, validate=False
    )
    # 32 steps an epoch: the first epoch's boundary 8 batches in, then one per epoch
    assert [(entry["epoch"], entry["step"]) for entry in summary["history"]] == [
        (0, 8),
        (0, 32),
        (1, 64),
    ]
    assert sum(summary["batch_sizes"]) == 2  # BoringDataModule loads batches of 1 per rank


def test_per_step_adjustment_with_prefetching_workers_converges_mid_epoch(tmp_path):
    summary = run_training(
        tmp_path,
        strategy="hetero",
        workers=4,
        sample_cost=HL4_COST,
        epochs=2,
        adjust_every=4,
        num_workers=1,
        validate=False,
        # every 4 batches whatever a boundary costs: on short steps the default
        # `replan_budget` may spread them (a CI run went 4, 8, 12, 16, 24), which its own
        # tests cover
        extra={"replan_budget": None},
    )
    history = summary["history"]
    steps_per_epoch = 12
    assert [entry["step"] for entry in history] == [4 * (i + 1) for i in range(len(history))]
    changed_mid_epoch = [e for e in history if e["changed"] and e["step"] % steps_per_epoch]
    assert changed_mid_epoch, history
    _converged(summary)


def test_the_first_epoch_re_plans_eight_batches_in_with_the_defaults(tmp_path):
    # `first_boundary="auto"`: 2 ranks, the second 3x slower, B = 64 (about 23 steps an
    # epoch): the plan moves toward the fast rank 8 batches into the first epoch, and the
    # epoch's end is the second boundary
    summary = run_training(
        tmp_path, strategy="hetero", workers=2, sample_cost=[0.004, 0.012], epochs=1,
        validate=False,
    )  # fmt: skip
    history = summary["history"]
    assert [entry["epoch"] for entry in history] == [0, 0]
    assert history[0]["step"] == 8 and history[1]["step"] > 16
    first = history[0]
    assert first["batch_sizes"] == [32, 32] and first["changed"], history
    assert first["next_batch_sizes"][0] > 36, history  # toward the speeds' split, [48, 16]


def test_async_also_re_plans_eight_batches_into_the_first_epoch(tmp_path):
    # mode="async": every rank runs the same steps, so the early boundary is one wait for
    # the slow rank (which the epoch's end would have cost), and the rest of the epoch's
    # pushes come from the measured plan
    summary = run_training(
        tmp_path, strategy="hetero", workers=2, sample_cost=[0.004, 0.012], epochs=1,
        validate=False, extra={"mode": "async"},
    )  # fmt: skip
    history = summary["history"]
    assert [(entry["epoch"], entry["step"]) for entry in history][0] == (0, 8), history
    first = history[0]
    assert first["batch_sizes"] == [32, 32] and first["changed"], history
    assert first["next_batch_sizes"][0] > 36, history  # toward the speeds' split, [48, 16]
    assert history[-1]["batch_sizes"] == first["next_batch_sizes"]  # the rest of the epoch


def test_launch_reports_each_finished_epoch_as_the_run_goes(tmp_path):
    from lightning_hetero.bench.run import launch

    seen: list[int] = []
    config = {"workers": 2, "epochs": 2, "validate": False}
    summary = launch(config, tmp_path, timeout=300, on_epoch=seen.append)
    assert seen and seen == sorted(seen) and seen[-1] == 2  # the demo's bar moves by epoch
    assert len(summary["epoch_s"]) == 2
