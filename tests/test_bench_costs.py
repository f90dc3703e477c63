"""The cost benchmarks run and report what they say (no timing is asserted)."""

import pytest

from lightning_hetero.bench.boundary_cost import boundary_table, gather_s, replan_s
from lightning_hetero.bench.overhead import measure_overhead, overhead_table


def test_a_timed_boundary_changes_the_plan_it_is_given():
    times = replan_s("proportional", 8, repeats=2)
    assert len(times) == 2 and all(t > 0 for t in times)


def test_the_boundary_table_has_a_row_per_size_and_a_column_per_controller():
    table = boundary_table(controllers=("static", "stepwise"), sizes=(2, 16), gather_sizes=())
    lines = table.splitlines()
    assert len(lines) == 4 and "stepwise" in lines[0] and lines[2].startswith("| 2 | - |")


def test_a_real_gather_is_timed_on_two_gloo_processes():
    times = gather_s(2, calls=20)
    assert len(times) == 18 and all(t > 0 for t in times)


def test_the_overhead_benchmark_pairs_ddp_and_hetero_runs():
    pairs = measure_overhead(repeats=1, steps=5, width=8)
    (pair,) = pairs
    assert pair["ratio"] == pytest.approx(pair["hetero"] / pair["ddp"])
    assert 0 < pair["boundary_share"] < 1  # the hetero run's boundaries per step / its step
    table = overhead_table(pairs)
    assert table.splitlines()[0].startswith("| DDPStrategy step (ms)")
    assert table.splitlines()[0].endswith("| boundaries / steps | without the all-gather |")
    assert 0 < pair["boundary_share_local"] <= pair["boundary_share"]


def test_the_overhead_table_names_the_pair_it_compares():
    pairs = [{"ddp": 0.010, "hetero": 0.0101, "ratio": 1.01}]
    table = overhead_table(pairs, ('adjust_every="epoch"', "adjust_every=2"))
    assert table.splitlines()[0].startswith('| adjust_every="epoch" step (ms) | adjust_every=2')
    assert "| 10.100 / 10.100 / 10.100 | 1.010 / 1.010 / 1.010 |" in table


def test_the_overhead_benchmark_refuses_a_bad_adjust_every():
    from lightning_hetero.bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["--overhead", "--adjust-every", "often"])
