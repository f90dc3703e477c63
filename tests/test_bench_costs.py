"""The cost benchmarks run and report what they say (no timing is asserted)."""

import pytest

from lightning_hetero.bench.boundary_cost import boundary_table, gather_s, replan_s
from lightning_hetero.bench.overhead import (
    boundary_share,
    interleaved_ratio,
    measure_interleaved,
    measure_overhead,
    overhead_table,
)


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
    assert table.splitlines()[0].endswith(
        "| CPU time ratio | boundaries / steps | without the all-gather |"
    )
    assert 0 < pair["boundary_share_local"] <= pair["boundary_share"]
    assert pair["cpu_ratio"] == pytest.approx(pair["hetero_cpu"] / pair["ddp_cpu"])
    assert pair["hetero_cpu"] > 0 and pair["ddp_cpu"] > 0


def test_the_overhead_table_names_the_pair_it_compares():
    pairs = [{"ddp": 0.010, "hetero": 0.0101, "ratio": 1.01}]
    table = overhead_table(pairs, ('adjust_every="epoch"', "adjust_every=2"))
    assert table.splitlines()[0].startswith('| adjust_every="epoch" step (ms) | adjust_every=2')
    assert "| 10.100 / 10.100 / 10.100 | 1.010 / 1.010 / 1.010 |" in table


def test_the_overhead_benchmark_refuses_a_bad_adjust_every():
    from lightning_hetero.bench.__main__ import main

    with pytest.raises(SystemExit):
        main(["--overhead", "--adjust-every", "often"])


def test_interleaved_ratio_pairs_each_on_block_with_the_off_block_after_it():
    # the warm-up cut the first block (2 steps of 3): it is left out, as is a lone last block
    steps = [9.0, 9.0] + [1.2, 1.2, 1.2, 1.0, 1.0, 1.0] * 2 + [3.0, 3.0, 3.0]
    off = [1, 1] + [0, 0, 0, 1, 1, 1] * 2 + [0, 0, 0]
    assert interleaved_ratio(steps, off, block=3) == pytest.approx(1.2)
    with pytest.raises(ValueError, match="no pair of whole blocks"):
        interleaved_ratio([1.0] * 4, [0, 0, 0, 0], block=3)


def test_the_interleaved_overhead_run_turns_boundaries_on_and_off():
    (run,) = measure_interleaved(
        repeats=1,
        steps=60,
        block=8,
        options={"adjust_every": 2, "replan_budget": None},
        control=True,
    )
    assert run["ratio"] > 0 and run["cpu_ratio"] > 0
    # boundaries every 2 batches in the on blocks only: about half of (60 + warm-up) / 2
    assert 20 <= run["boundaries"] <= 40 and run["interval"] == 2
    assert 0 < run["boundary_share"] < 1 and run["thread_ratio"] > 0
    assert min(run[k] for k in ("control_ratio", "control_cpu_ratio", "control_thread_ratio")) > 0


def test_the_boundary_share_counts_the_steps_of_on_blocks_only():
    assert boundary_share([1.0, 3.0, 5.0], [0, 1, 0], [0.3]) == pytest.approx(0.05)


def test_interleave_needs_boundaries_every_n_batches():
    from lightning_hetero.bench.__main__ import main

    for argv in (["--overhead", "--interleave", "64"], ["--interleave", "64"]):
        with pytest.raises(SystemExit):
            main(argv)
