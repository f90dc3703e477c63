"""The one-process simulation of the modes' update rules (``lightning_hetero.bench.mode_sim``)."""

import pytest
import torch

from lightning_hetero.bench.mode_sim import (
    CONTROL,
    GRID_MODES,
    REORDER,
    RERUN_NUDGE,
    _async_plans,
    _grid_rows,
    _sync_times,
    run_cell,
    simulate,
    simulate_digits,
    target_misses,
    tta_figures,
)

TINY = {"lr": 3e-3, "epochs": 1, "global_batch": 16, "train_size": 64, "val_size": 64}


@pytest.mark.parametrize(
    "rule", ["async-linear", "async-sqrt", "local", "dual", "dual-linear", "dual-paper"]
)
def test_one_rank_is_ddp(rule: str) -> None:
    # one rank pushes the whole global batch on the current parameters: no staleness and a
    # batch share of 1, so every rule's update is DDP's, to the bit
    assert simulate(rule, 1, 0, **TINY) == simulate("ddp", 1, 0, **TINY)


@pytest.mark.parametrize(
    ("one", "other"),
    [("async-linear", "async-sqrt"), ("dual", "dual-paper"), ("dual", "dual-linear")],
)
def test_the_rules_differ_on_two_ranks(one: str, other: str) -> None:
    assert simulate(one, 2, 0, **TINY) != simulate(other, 2, 0, **TINY)


def test_digits_on_one_rank_is_ddp_with_or_without_lookahead() -> None:
    # one rank: no push in between, so nothing to look ahead by, and a share of 1; the
    # epoch's average is the one thing that differs from DDP then
    ddp = simulate_digits("ddp", [1.0], 0, epochs=1)
    assert simulate_digits("async", [1.0], 0, epochs=1, epoch_average=False) == ddp
    assert simulate_digits("async-plain", [1.0], 0, epochs=1, epoch_average=False) == ddp
    assert simulate_digits("async", [1.0], 0, epochs=1) != ddp  # "auto": on with momentum


def test_digits_lookahead_changes_what_two_ranks_compute() -> None:
    with_lookahead = simulate_digits("async", [1.0, 3.0], 0, epochs=1)
    assert with_lookahead != simulate_digits("async-plain", [1.0, 3.0], 0, epochs=1)
    with pytest.raises(ValueError, match="unknown digits rule 'local-bogus'"):
        simulate_digits("local-bogus", [1.0], 0)
    with pytest.raises(ValueError, match=r"positive number, got \[1.0, 0.0\]"):
        simulate_digits("async", [1.0, 0.0], 0)


def test_digits_local_step_rules_agree_on_one_rank_and_differ_on_two_of_different_speeds() -> None:
    # one replica merged with weight 1: the rules are the same (DDP's batches in its order,
    # the epoch's short last claim at its share of the learning rate, as local mode steps it)
    one = simulate_digits("local", [1.0], 0, epochs=1)
    assert simulate_digits("local-prop", [1.0], 0, epochs=1) == one
    equal = simulate_digits("local", [1.0, 3.0], 0, epochs=2)
    assert equal != simulate_digits("local-prop", [1.0, 3.0], 0, epochs=2)
    assert simulate_digits("local-outer", [1.0, 3.0], 0, epochs=2) != equal


# ------------------------------------------------------------------ time to accuracy grid
def test_time_to_accuracy_on_toy_curves() -> None:
    # DDP's best is 0.95, so the target is 0.94: DDP gets there at its third validation (30)
    runs = {
        "ddp": ([0.5, 0.9, 0.95], [10.0, 20.0, 30.0]),
        "fast": ([0.6, 0.945, 0.95], [5.0, 10.0, 15.0]),
        "short": ([0.5, 0.93, 0.939], [5.0, 10.0, 15.0]),  # 0.1 point short of the target
    }
    figs = tta_figures(runs)
    assert figs["ddp"]["tta_s"] == 30.0 and figs["ddp"]["speedup"] == 1.0
    assert figs["fast"]["speedup"] == 3.0 and figs["fast"]["epochs_to_target"] == 2
    assert figs["fast"]["acc_delta"] == 0.0
    assert figs["short"]["speedup"] == 0.0  # never reached
    assert figs["short"]["acc_delta"] == pytest.approx(-1.1)
    rows = "\n".join(
        _grid_rows("digits", 2, "slow", [figs | {m: figs["fast"] for m in GRID_MODES[1:]}])
    )
    assert "| digits | 2 | slow | `bsp` | 3.00x | +0.0 | none |" in rows
    rows = "\n".join(
        _grid_rows("digits", 2, "slow", [figs | {m: figs["short"] for m in GRID_MODES[1:]}])
    )
    assert "| `async` | never | -1.1 | time < 1.2x |" in rows


def test_target_misses_follow_the_issue() -> None:
    def figs(speedup: float, delta: float) -> dict[str, float]:
        return {"speedup": speedup, "acc_delta": delta}

    assert target_misses("digits", "bsp", True, figs(1.49, 0.0)) == ["time < 1.5x"]
    assert target_misses("digits", "local", True, figs(1.2, -2.0)) == []
    assert target_misses("digits", "dual", False, figs(0.99, -2.1)) == [
        "time < 1x", "acc < DDP - 2",
    ]  # fmt: skip
    assert target_misses("transformer", "async", False, figs(1.0, -1.01)) == ["acc < DDP - 1"]
    assert target_misses("transformer", "ddp", True, figs(0.0, -50.0)) == []
    # the control is DDP itself: no slower than DDP, with or without the slow rank
    assert target_misses("digits", CONTROL, True, figs(0.99, 0.0)) == ["time < 1x"]
    assert target_misses("digits", CONTROL, False, figs(1.0, -2.5)) == ["acc < DDP - 2"]


def test_sync_times_wait_for_the_slowest_rank_and_bsp_balances_after_the_first_epoch() -> None:
    # 10 samples in steps of 4, 4, 2; ranks at 1 and 3 per sample, 2 per step, 2 per all-reduce
    ddp = _sync_times([1.0, 3.0], 2.0, 2.0, 10, 4, 2, balanced=False)
    assert ddp == [27.0, 54.0]  # uniform [2, 2]: (6 + 4) + (6 + 4) + (3 + 4) per epoch
    bsp = _sync_times([1.0, 3.0], 2.0, 2.0, 10, 4, 2, balanced=True)
    assert bsp == [27.0, 46.5]  # then [3, 1]: (3 + 4) + (3 + 4) + (1.5 + 4)


def test_bsp_balances_from_the_first_epochs_early_boundary_where_the_epoch_has_one() -> None:
    # 20 steps of 4 samples: the uniform [2, 2] for 8 steps (6 + 4), then [3, 1] (3 + 4)
    bsp = _sync_times([1.0, 3.0], 2.0, 2.0, 80, 4, 2, balanced=True)
    assert bsp == [8 * 10.0 + 12 * 7.0, 8 * 10.0 + 32 * 7.0]
    assert _sync_times([1.0, 3.0], 2.0, 2.0, 80, 4, 1, balanced=False) == [200.0]


def test_async_plans_split_the_first_epoch_at_its_early_boundary() -> None:
    plans = _async_plans([1.0, 3.0], 80, 4)  # 20 steps of 4: the boundary after 8
    assert plans(0) == [([2, 2], [16, 16], None), ([3, 1], [36, 12], None)]
    assert plans(1) == [([3, 1], [60, 20], None)]
    assert _async_plans([1.0, 3.0], 40, 4)(0) == [([2, 2], [20, 20], None)]  # 10 steps: none


def test_a_tiny_grid_cell_runs_every_mode_in_virtual_time() -> None:
    tiny = {"epochs": 1, "global_batch": 16, "train_size": 64, "val_size": 64}
    runs = run_cell("transformer", [1.0, 3.0], 0, **tiny)
    assert list(runs) == list(GRID_MODES)
    assert all(len(curve) == len(times) == 1 for curve, times in runs.values())
    assert runs["bsp"] == runs["ddp"]  # exact DDP, and its first epoch on the uniform plan
    assert runs[CONTROL][1] == runs["ddp"][1]  # the controls run at DDP's times
    assert runs[REORDER][1] == runs["ddp"][1]
    ddp_time = runs["ddp"][1][0]
    # with the slow rank, local (even batches, more steps on the fast rank) and dual (a small
    # batch on the slow rank) end the epoch before DDP's, by the cost model
    assert runs["local"][1][0] < ddp_time and runs["dual"][1][0] < ddp_time
    assert run_cell("transformer", [1.0, 3.0], 0, modes=["bsp"], ddp_curve=[0.5], **tiny)["bsp"][
        0
    ] == [0.5]
    with pytest.raises(ValueError, match=r"unknown modes \['sync'\]"):
        run_cell("transformer", [1.0], 0, modes=["sync"])
    with pytest.raises(ValueError, match="`sync_cost` must be a finite number >= 0, got -1"):
        run_cell("transformer", [1.0], 0, sync_cost=-1.0)


def test_the_control_is_ddp_from_initial_weights_nudged_at_rounding_level() -> None:
    from lightning_hetero.bench.mode_sim import _make_task, _train_ddp

    plain = _make_task("digits", 0, epochs=0)
    nudged = _make_task("digits", 0, epochs=0)
    assert _train_ddp(nudged, RERUN_NUDGE) == []  # no epoch: only the nudge
    pairs = list(zip(plain.model.parameters(), nudged.model.parameters()))
    assert any(not torch.equal(a, b) for a, b in pairs)
    for a, b in pairs:  # one part in a million, relative (a zero weight stays zero)
        assert torch.allclose(a, b, rtol=1e-5, atol=0.0)


def test_the_reorder_control_is_ddp_from_the_same_weights_on_another_data_order(monkeypatch):
    from lightning_hetero.bench import mode_sim

    orders = []
    real = torch.randperm

    def recording(size, generator=None):
        order = real(size, generator=generator)
        orders.append(order)
        return order

    monkeypatch.setattr(mode_sim.torch, "randperm", recording)
    tiny = {"epochs": 1, "global_batch": 16, "train_size": 64, "val_size": 64}
    first = mode_sim._make_task("transformer", 0, **tiny)
    start = [p.detach().clone() for p in first.model.parameters()]
    again = mode_sim._make_task("transformer", 0, **tiny)
    assert all(torch.equal(a, b) for a, b in zip(start, again.model.parameters()))  # same init
    mode_sim._train_ddp(first)
    mode_sim._train_ddp(again, order_seed=mode_sim.REORDER_SEED)
    plain, reordered = orders
    assert sorted(plain.tolist()) == sorted(reordered.tolist()) == list(range(64))
    assert not torch.equal(plain, reordered)  # the same samples in another order
