"""The end-of-fit summary's fields, line and logged metrics, from made-up histories."""

import math

import pytest

from lightning_hetero.summary import (
    fit_summary,
    hold_reason,
    quiet,
    summary_line,
    summary_metrics,
    summary_table,
)


def _entry(plan, compute, step, balance, changed=False, reverted=False, **extra):
    return {
        "batch_sizes": plan,
        "compute_times": compute,
        "step_time": step,
        "balance": balance,
        "changed": changed,
        "reverted": reverted,
        **extra,
    }


HISTORY = [
    _entry([8, 8], [0.1, 0.3], 0.3, 0.67, changed=True),
    _entry([12, 4], [0.2, 0.1], 0.2, 0.75, changed=True, reverted=True),
    _entry([12, 4], [0.15, 0.16], 0.16, 0.8, deadband=0.05),
    _entry([12, 4], [math.nan, 0.16], math.nan, math.nan),
    _entry([12, 4], [0.15, 0.15], 0.15, 1.0),
]


def test_the_summary_counts_replans_reverts_and_holds_with_their_reasons():
    summary = fit_summary(HISTORY, [12, 4])
    assert (summary["boundaries"], summary["replans"], summary["reverts"]) == (5, 1, 1)
    assert summary["holds"] == 2
    assert summary["hold_reasons"] == {
        "gain within the dead-band (5%)": 1,
        "no timings at the plan yet": 1,
    }
    assert summary["first_plan"] == [8, 8] and summary["final_plan"] == [12, 4]
    assert summary["final_balance"] == 1.0


def test_the_summary_compares_the_first_uniform_plans_step_time_with_the_final_plans():
    summary = fit_summary(HISTORY, [12, 4])
    assert summary["step_time_uniform"] == 0.3 and summary["step_time_final"] == 0.15
    assert summary["speedup"] == 2.0
    assert summary["pace_setter"] == 1  # at the first timed boundary
    # a final plan never measured (it came at the last boundary): no ratio
    unmeasured = fit_summary(HISTORY[:1], [12, 4])
    assert math.isnan(unmeasured["step_time_final"]) and math.isnan(unmeasured["speedup"])
    assert "not timed yet" in summary_line(unmeasured)


def test_the_line_names_everything_and_points_to_the_pictures():
    line = summary_line(fit_summary(HISTORY, [12, 4], "logs/metrics.csv"))
    for said in (
        "1 re-plan(s), 1 revert(s), 2 hold(s)",
        "1x gain within the dead-band (5%)",
        "plan [8, 8] -> [12, 4] at balance 1.00",
        "0.3 s under the uniform plan, 0.15 s under the final one (2.00x)",
        "rank 1 set the pace",
        "python -m lightning_hetero.plots logs/metrics.csv -o run.png",
    ):
        assert said in line, (said, line)
    assert "\n" not in line


def test_a_quiet_run_has_a_short_line_which_the_callback_does_not_say():
    history = [_entry([8, 8], [0.1, 0.1], 0.1, 0.99), _entry([8, 8], [0.1, 0.1], 0.1, 0.98)]
    summary = fit_summary(history, [8, 8])
    assert quiet(summary) and summary["pace_setter"] is None
    assert (
        summary_line(summary)
        == "hetero: the plan stayed [8, 8] at balance 0.98 through 2 boundaries."
    )


def test_a_balanced_or_changed_boundary_is_no_hold():
    assert hold_reason(_entry([8, 8], [0.1, 0.1], 0.1, 0.95)) is None
    assert hold_reason(_entry([8, 8], [0.1, 0.3], 0.3, 0.5, changed=True)) is None
    held = _entry([8, 8], [0.1, 0.3], 0.3, 0.5, held_at_minimum=[1])
    assert hold_reason(held) == "rank(s) [1] held at min_batch_size"
    assert hold_reason(_entry([8, 8], [0.1, 0.3], 0.3, 0.5)) == "the controller keeps it"


def test_the_logged_table_holds_the_fields():
    summary = fit_summary(HISTORY, [12, 4])
    metrics = summary_metrics(summary)
    assert metrics["hetero/summary/replans"] == 1.0
    assert metrics["hetero/summary/speedup"] == 2.0
    assert metrics["hetero/summary/pace_setter"] == 1.0
    assert metrics["hetero/summary/batch_size/rank1"] == 4.0
    assert summary_metrics(fit_summary(HISTORY[-1:], [12, 4]))["hetero/summary/pace_setter"] == -1
    assert "| speedup | 2.0 |" in summary_table(summary)


def test_a_static_controller_holds_nothing():
    # it keeps its plan by design: an unbalanced plan under it is no hold to report
    history = [_entry([10, 6], [0.1, 0.06], 0.1, 0.75), _entry([10, 6], [0.1, 0.06], 0.1, 0.75)]
    assert fit_summary(history, [10, 6])["holds"] == 2
    static = fit_summary(history, [10, 6], adapts=False)
    assert static["holds"] == 0 and quiet(static)


@pytest.mark.parametrize("given", [True, False])
def test_a_fit_keeps_and_logs_its_summary_at_the_last_boundarys_epoch(tmp_path, given):
    """With the user's ``HeteroCallback`` and with the one the strategy adds itself (which it
    removes when it is torn down, before Lightning's ``on_fit_end``)."""
    import csv

    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.loggers import CSVLogger

    from lightning_hetero import HeteroCallback, HeteroStrategy

    callback = HeteroCallback(tensorboard_layout=False)
    trainer = pl.Trainer(
        strategy=HeteroStrategy(),
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        limit_train_batches=3,
        limit_val_batches=0,
        callbacks=[callback] if given else [],
        logger=CSVLogger(tmp_path, name="csv"),
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(BoringModel())
    with open(trainer.loggers[0].experiment.metrics_file_path) as f:
        rows = [row for row in csv.DictReader(f) if row.get("hetero/summary/replans")]
    (row,) = rows
    assert (row["epoch"], row["step"]) == ("1", "6")  # the last epoch, after its 6 steps
    assert float(row["hetero/summary/batch_size/rank0"]) == trainer.strategy.batch_sizes[0]
    if given:
        summary = callback.summary
        assert summary is not None and summary["boundaries"] == 2
        assert summary["final_plan"] == trainer.strategy.batch_sizes
        assert str(tmp_path) in summary["pictures"]  # the CSV log to draw
