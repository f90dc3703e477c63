"""Every controller on 4 emulated gloo ranks, and a speed change in the middle of an epoch."""

import pytest

from lightning_hetero.planning import HETEROGENEITY_LEVELS, proportional_split
from tests.e2e.launch import run_training
from tests.e2e.plans import distance, toward, within

GLOBAL_BATCH = 4 * 32
STEPS_PER_EPOCH = 12  # digits training split / 128


def _cost(level: str) -> list[float]:
    # 72 ms per sample on a 1-core worker, so that the real compute is small beside it: on a
    # loaded 2-core machine every rank pays tens of ms a step (which pulls each move toward
    # uniform) and about 0.5 ms a sample, which shifts the split of the real speeds. At 36 ms
    # that split gives HL4's rank 2 about 18 samples where the tolerance ends at 19.2 (seen:
    # the controllers settled at 17-19); at 72 ms it stays near 17.
    return [0.072 / cores for cores in HETEROGENEITY_LEVELS[level]]


def _split(level: str) -> list[int]:
    return proportional_split(HETEROGENEITY_LEVELS[level], GLOBAL_BATCH)


@pytest.mark.parametrize(
    ("controller", "options", "adjust_every", "tolerance"),
    [
        ("lbbsp", {"predictor": "ema"}, 2, 0.2),
        # three of the five under `make test-slow` only (about 50 s each): CI's time limit;
        # every controller's planning is tested in milliseconds with the simulator
        pytest.param("lbbsp", {"predictor": "narx"}, 2, 0.2, marks=pytest.mark.slow),
        ("updates", {}, 2, 0.2),
        pytest.param("model", {}, 2, 0.2, marks=pytest.mark.slow),
        # 5 samples per window of 5 boundaries: it only gets part of the way in 36 steps
        pytest.param("stepwise", {}, 1, None, marks=pytest.mark.slow),
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
    assert distance(plan, _split("HL4")) <= distance([32] * 4, _split("HL4")) / 2, plan
    if tolerance is not None:
        assert within(plan, _split("HL4"), tolerance), plan


# without the step-time check under `make test-slow` only (CI's time limit)
@pytest.mark.parametrize("revert_slower", [pytest.param(False, marks=pytest.mark.slow), True])
def test_speed_change_mid_epoch_is_absorbed_within_a_few_boundaries(tmp_path, revert_slower):
    change_step = 18  # the middle of the second epoch
    # Boundaries every 2 steps read medians of 2 steps, and at HL8 rank 3's 85 samples carry
    # the most real compute, which a busy machine stretches. At 36 ms per 1-core sample, under
    # load, two such boundaries read rank 3 slower at 74 and 81 samples than at 66 (0.255 and
    # 0.204 s a step against 0.141), and the plan kept it at 66 to the end
    summary = run_training(
        tmp_path,
        strategy="hetero",
        workers=4,
        sample_cost={"0": _cost("HL4"), str(change_step): _cost("HL8")},
        throttle_unit="step",
        epochs=4,
        adjust_every=2,
        validate=False,
        # a boundary every 2 batches whatever it costs (the default `replan_budget` may
        # spread them on a busy machine; its own tests cover that)
        extra={"revert_slower": revert_slower, "replan_budget": None},
    )
    history = summary["history"]
    assert [e["step"] for e in history] == list(range(2, 4 * STEPS_PER_EPOCH + 1, 2))
    before = [e for e in history if e["step"] <= change_step]
    after = [e for e in history if e["step"] > change_step]
    trace = [(e["step"], e["next_batch_sizes"], e["reverted"]) for e in history]
    assert any(within(e["next_batch_sizes"], _split("HL4"), 0.2) for e in before), trace
    absorbed = next(
        (i for i, e in enumerate(after) if within(e["next_batch_sizes"], _split("HL8"), 0.2)), None
    )
    # How soon the change shows depends on how long the plan held before it: a rank's timing
    # is the median of the steps since the plan last changed, tested for a speed change every
    # 16 steps (and at boundaries with 8 new steps), so the change moves it within 8
    # boundaries (seen: 5, when the plan last changed at step 8). Then a move or two, each
    # held 2 boundaries by the step-time check (3 steps to judge a plan); with the check, a
    # change tried as the speeds change can be measured slower and undone first.
    assert absorbed is not None and absorbed < (12 if revert_slower else 10), trace
    # the final plan: HL8's order at half the uniform plan's distance from its split (the
    # check may undo the last move when the machine's load rose in its steps)
    assert toward(summary["batch_sizes"], _split("HL8")), trace


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
    # and within them the plan still moves toward the split. Two boundaries only: the first
    # move lands short of 20% when the real compute every rank pays alike is large (seen
    # under load: [28, 27, 20, 53]), so the plan is held to the speeds' order at half the
    # uniform plan's distance
    assert toward(summary["batch_sizes"], _split("HL4")), summary["history"]
