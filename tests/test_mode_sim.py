"""The one-process simulation of the modes' update rules (``lightning_hetero.bench.mode_sim``)."""

import pytest

from lightning_hetero.bench.mode_sim import simulate, simulate_digits

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
    # one rank: no push in between, so nothing to look ahead by, and a share of 1
    ddp = simulate_digits("ddp", [1.0], 0, epochs=1)
    assert simulate_digits("async", [1.0], 0, epochs=1) == ddp
    assert simulate_digits("async-plain", [1.0], 0, epochs=1) == ddp


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
