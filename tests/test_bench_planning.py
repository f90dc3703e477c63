"""Smoke tests of ``python -m lightning_hetero.bench.planning_cost`` (no timing asserts)."""

import pytest

from lightning_hetero.bench.planning_cost import (
    DEFAULT_CONTROLLERS,
    cluster_inputs,
    decision_times,
    main,
    planning_cost_table,
)
from lightning_hetero.planning.proportional import ProportionalController
from lightning_hetero.planning.registry import CONTROLLERS


def _rows(text: str) -> list[list[str]]:
    return [
        [cell.strip() for cell in line.strip("|").split("|")]
        for line in text.splitlines()
        if line.startswith("| `")
    ]


def test_every_registered_controller_is_timed_by_default():
    names = {spec.partition(":")[0] for spec in DEFAULT_CONTROLLERS}
    assert names == set(CONTROLLERS)
    assert "proportional:renormalization=omnilearn" in DEFAULT_CONTROLLERS
    assert {"lbbsp:predictor=last", "lbbsp:predictor=ema"} <= set(DEFAULT_CONTROLLERS)


def test_table_has_a_row_per_controller_and_a_cell_per_size():
    text = planning_cost_table(sizes=(2, 8), repeats=2)
    header = text.splitlines()[0]
    assert header == "| controller | K=2 | K=8 |"
    rows = _rows(text)
    assert [row[0] for row in rows] == [f"`{spec}`" for spec in DEFAULT_CONTROLLERS]
    for row in rows:
        assert len(row) == 3
        for cell in row[1:]:
            low, mid, high = (float(v) for v in cell.split(" / "))
            assert 0 <= low <= mid <= high


def test_inputs_are_heterogeneous_and_need_a_new_plan():
    plan, times, limits, stats = cluster_inputs(32)
    assert plan == [64] * 32 and limits.global_batch_size == 64 * 32
    assert max(times) / min(times) > 5  # HL8: 32 cores against 4
    assert len(stats) == 32
    assert ProportionalController().update(plan, times, limits, stats) != plan


def test_decision_times_counts_only_the_timed_calls():
    seconds = decision_times(ProportionalController, size=4, repeats=3, warmup=2)
    assert len(seconds) == 3 and all(s >= 0 for s in seconds)


def test_main_prints_the_table(capsys):
    main(["--sizes", "4", "--repeats", "1", "--controllers", "static", "proportional"])
    out = capsys.readouterr().out
    assert [row[0] for row in _rows(out)] == ["`static`", "`proportional`"]


@pytest.mark.parametrize(
    "argv",
    [
        ["--sizes", "0"],
        ["--repeats", "0"],
        ["--controllers", "nope"],
        ["--controllers", "static:x"],
    ],
)
def test_main_refuses_bad_arguments(argv):
    with pytest.raises(SystemExit):
        main(argv)
