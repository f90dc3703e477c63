"""PlanState: the plan's options apart from what a run learns, numbers in and plans out."""

import pytest

from lightning_hetero.plan_state import PlanState, check_plan_options
from lightning_hetero.planning import PlanError


def test_the_first_plan_follows_the_initial_plan_within_the_limits():
    assert PlanState().resolve(loader_batch_size=8, world_size=3) == [8, 8, 8]
    state = PlanState(initial="cores", capacities=[1.0, 3.0])
    assert state.resolve(loader_batch_size=8, world_size=2) == [4, 12]
    assert state.limits.global_batch_size == 16
    explicit = PlanState(initial=[3, 5])
    assert explicit.resolve(loader_batch_size=None, world_size=2) == [3, 5]


def test_a_restored_plan_wins_and_keeps_its_proportions_for_another_total():
    state = PlanState(global_batch_size=32)
    state.restore([8, 24])
    assert state.plan is None and state.resolve(None, 2) == [8, 24]
    state.restore([4, 12])  # saved at another global batch
    assert state.resolve(None, 2) == [8, 24]
    state.restore([1, 1, 2], weights=[1.0, 3.0])  # saved by 3 ranks, weights for 2
    assert state.resolve(None, 2) == [8, 24]


def test_a_provisional_plan_is_an_even_split_and_leaves_no_plan_in_force():
    state = PlanState(initial="cores")
    assert state.provisional(loader_batch_size=5, world_size=2) == [5, 5]
    assert state.plan is None and state.capacities is None


def test_the_model_sets_the_default_minimum_and_the_error_says_why():
    state = PlanState(default_min=2)
    with pytest.raises(PlanError, match="BatchNorm layers.*at least 6"):
        state.resolve(loader_batch_size=1, world_size=3)
    assert PlanState(min_batch_size=1, default_min=2).resolve(1, 3) == [1, 1, 1]


def test_an_input_scale_rescales_a_plan_in_force_once():
    state = PlanState(plan=[8, 24], base_global=32)
    assert state.set_input_scale(0.5, None) is True and state.rescale_pending
    assert state.rescaled(world_size=2) == [16, 48]
    assert state.set_input_scale(0.5, None) is False  # the same scale again
    before_any_plan = PlanState()
    assert before_any_plan.set_input_scale(2.0, None) is False  # the first loader applies it
    with pytest.raises(ValueError, match="scale"):
        before_any_plan.set_input_scale(0.0, None)


def test_measured_maximums_bound_the_plan_and_scale_with_the_input():
    state = PlanState(max_batch_size="auto", measured_max=[10, 40], base_global=50)
    assert state.upper() == [10, 40]
    state.input_scale = 2.0
    assert state.scaled_upper() == [5, 20]
    assert state.scaled_limits(world_size=2).global_batch_size == 25


def test_a_plan_outside_the_limits_is_refused():
    state = PlanState(initial=[3, 5])
    state.plan = state.resolve(None, 2)
    assert state.checked([2, 6], world_size=2) == [2, 6]
    with pytest.raises(PlanError):
        state.checked([2, 7], world_size=2)
    with pytest.raises(PlanError, match="2 entries but there are 3 ranks"):
        state.check_world(3)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (("fastest", None, None, None), "Unknown initial plan"),
        (("uniform", 0, None, None), "global_batch_size"),
        (("uniform", None, 0, None), "min_batch_size"),
        (("uniform", None, 4, 2), "must not exceed"),
        (("uniform", None, None, "all"), "max_batch_size"),
        (([3, 5], 9, None, None), ""),
    ],
)
def test_bad_plan_options_are_refused(options, message):
    with pytest.raises((ValueError, PlanError), match=message):
        check_plan_options(*options)


@pytest.mark.parametrize(
    ("global_batch_size", "source"),
    [(None, "DataLoader's `batch_size` times 2 ranks"), (6, "`global_batch_size`")],
)
def test_a_minimum_the_global_batch_cannot_give_names_where_the_batch_came_from(
    global_batch_size, source
):
    # the user set only min_batch_size: the error must not blame a `max_batch_size`
    state = PlanState(min_batch_size=4, global_batch_size=global_batch_size)
    with pytest.raises(PlanError) as error:
        state.resolve(3, 2)
    message = str(error.value)
    assert source in message and "needs at least 8" in message
    assert "max_batch_size" not in message
