"""Every controller on 4 emulated gloo ranks, and a speed change in the middle of an epoch."""

import pytest

from lightning_hetero.planning import HETEROGENEITY_LEVELS, proportional_split
from tests.e2e.launch import run_training

GLOBAL_BATCH = 4 * 32
STEPS_PER_EPOCH = 12  # digits training split / 128


def _cost(level: str) -> list[float]:
    # 36 ms per sample on a 1-core worker: the emulated cost dwarfs the real compute.
    return [0.036 / cores for cores in HETEROGENEITY_LEVELS[level]]


def _within(plan: list[int], level: str, tolerance: float) -> bool:
    ideal = proportional_split(HETEROGENEITY_LEVELS[level], GLOBAL_BATCH)
    return all(abs(got - want) <= tolerance * want for got, want in zip(plan, ideal))


def _distance(plan: list[int], level: str) -> int:
    ideal = proportional_split(HETEROGENEITY_LEVELS[level], GLOBAL_BATCH)
    return sum(abs(got - want) for got, want in zip(plan, ideal))


@pytest.mark.parametrize(
    ("controller", "options", "adjust_every", "tolerance"),
    [
        ("lbbsp", {"predictor": "ema"}, 2, 0.2),
        ("lbbsp", {"predictor": "narx"}, 2, 0.2),
        ("updates", {}, 2, 0.2),
        ("model", {}, 2, 0.2),
        # 5 samples per window of 5 boundaries: it only gets part of the way in 36 steps
        ("stepwise", {}, 1, None),
    ],
    ids=["lbbsp-ema", "lbbsp-narx", "updates", "model", "stepwise"],
)
def test_each_controller_moves_the_plan_toward_the_speed_proportional_split(
    tmp_path, controller, options, adjust_every, tolerance
):
    summary = run_training(
        tmp_path,
        strategy="hetero",
        workers=4,
        sample_cost=_cost("HL4"),
        epochs=3,
        adjust_every=adjust_every,
        controller=controller,
        controller_options=options,
        validate=False,
        # the controller's own moves: the step-time check holds each trial for 3 steps,
        # which slows one-step boundaries (tested on its own below and in test_replan)
        extra={"revert_slower": False},
    )
    plan, history = summary["batch_sizes"], summary["history"]
    assert history[0]["batch_sizes"] == [32] * 4 and sum(plan) == GLOBAL_BATCH
    assert all(sum(e["next_batch_sizes"]) == GLOBAL_BATCH for e in history)
    assert _distance(plan, "HL4") <= _distance([32] * 4, "HL4") / 2, plan
    if tolerance is not None:
        assert _within(plan, "HL4", tolerance), plan


@pytest.mark.parametrize("revert_slower", [False, True])
def test_speed_change_mid_epoch_is_absorbed_within_a_few_boundaries(tmp_path, revert_slower):
    change_step = 18  # the middle of the second epoch
    summary = run_training(
        tmp_path,
        strategy="hetero",
        workers=4,
        sample_cost={"0": _cost("HL4"), str(change_step): _cost("HL8")},
        throttle_unit="step",
        epochs=3,
        adjust_every=2,
        validate=False,
        extra={"revert_slower": revert_slower},
    )
    history = summary["history"]
    assert [e["step"] for e in history] == list(range(2, 3 * STEPS_PER_EPOCH + 1, 2))
    before = [e for e in history if e["step"] <= change_step]
    after = [e for e in history if e["step"] > change_step]
    assert _within(before[-1]["next_batch_sizes"], "HL4", 0.2), before[-1]
    absorbed = next(i for i, e in enumerate(after) if _within(e["next_batch_sizes"], "HL8", 0.2))
    trace = [(e["step"], e["next_batch_sizes"], e["reverted"]) for e in after]
    if revert_slower:
        # a change tried as the speeds change is measured slower and undone; the plan in
        # force, measured again, shows the cluster changed, and the next change goes through:
        # a few boundaries more than without the check (2 steps each, 3 to judge a plan)
        assert absorbed < 8, trace
    else:
        # the plan is HL8's within 5 boundaries (10 steps) of the change: the dead-band that
        # follows the timing noise waits while the change shakes the smoothed timings
        assert absorbed < 5, trace
    assert _within(summary["batch_sizes"], "HL8", 0.2), [
        (e["step"], e["next_batch_sizes"], e["balance"]) for e in history
    ]


def test_auto_max_batch_size_probes_on_every_gloo_rank_and_bounds_the_plan(tmp_path):
    summary = run_training(
        tmp_path,
        strategy="hetero",
        workers=4,
        sample_cost=_cost("HL4"),
        epochs=2,
        validate=False,
        extra={"max_batch_size": "auto", "probe_batch_sizes": [8, 16, 32, 64]},
    )
    probe = summary["memory_probe"]
    assert len(probe["max_batch_sizes"]) == 4
    assert all(1 <= bound <= GLOBAL_BATCH for bound in probe["max_batch_sizes"])
    assert all(per_sample > 0 for per_sample in probe["per_sample_bytes"])
    assert [size for size, _ in probe["samples"]] == [8, 16, 32, 64]
    for entry in summary["history"]:
        assert all(b <= hi for b, hi in zip(entry["next_batch_sizes"], probe["max_batch_sizes"]))
    assert _within(summary["batch_sizes"], "HL4", 0.2)
