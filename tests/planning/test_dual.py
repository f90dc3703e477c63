"""The dual batch size planner (paper 003), checked against the paper's worked numbers."""

import math
import random
from dataclasses import replace

import pytest

from lightning_hetero.planning import (
    CONTROLLERS,
    BatchLimits,
    DualBatchController,
    DualBatchError,
    PlanError,
    TimeModel,
    make_controller,
    plan_dual_batch,
)
from lightning_hetero.planning.dual import plan_dual_batch_by_speed, push_floor
from lightning_hetero.planning.memory import least_squares_line

# Paper 003 does not print its fitted a and b, only Table III's B_S. Every b/a in
# [24.615, 24.698] samples reproduces all eight B_S values (rounded to the nearest
# integer); a scan over b/a found that interval. 24.66 is inside it.
B_OVER_A = 24.66
PAPER = TimeModel(a=1.0, b=B_OVER_A)

# Table III: (k, n_S) -> (B_S, floor(d_S), d_S / d_L); d = 50000, n = 4, B_L = 500.
TABLE_III = {
    (1.05, 1): (83, 10625, 0.810),
    (1.05, 2): (154, 11875, 0.905),
    (1.05, 3): (205, 12291, 0.936),
    (1.05, 4): (242, 12500, None),
    (1.1, 1): (38, 8750, 0.636),
    (1.1, 2): (87, 11250, 0.818),
    (1.1, 3): (127, 12083, 0.879),
    (1.1, 4): (160, 12500, None),
}
# Table II (k = 1.1): the square-root factors.
TABLE_II_SQRT = {1: 0.797, 2: 0.904, 3: 0.938}


@pytest.mark.parametrize(("k", "n_small"), list(TABLE_III))
def test_table_iii_is_reproduced(k, n_small):
    small_batch, d_small, factor = TABLE_III[(k, n_small)]
    plan = plan_dual_batch(PAPER, 50000, 4, n_small, 500, k)
    assert plan.large_samples == {1.05: 13125, 1.1: 13750}[k]  # d_L = k d / n
    assert math.floor(plan.small_samples) == d_small
    assert plan.small_batch_size == small_batch
    if factor is not None:
        assert round(plan.update_factor, 3) == factor
    else:  # (4, 0): no large-batch worker to match, so no worker's updates are scaled
        assert plan.update_factors == [1.0] * 4
    assert plan.batch_sizes == [500] * (4 - n_small) + [small_batch] * n_small
    assert sum(plan.samples) == 50000


@pytest.mark.parametrize("n_small", [1, 2, 3])
def test_table_ii_square_root_factors(n_small):
    plan = plan_dual_batch(PAPER, 50000, 4, n_small, 500, 1.1, update_factor="sqrt")
    # the paper took the root of the 3-decimal ratio; ours is of the exact one
    assert plan.update_factor == pytest.approx(TABLE_II_SQRT[n_small], abs=1e-3)
    assert plan.update_factors == [1.0] * (4 - n_small) + [plan.update_factor] * n_small


def test_equation_8_gives_equal_epoch_times():
    plan = plan_dual_batch(PAPER, 50000, 4, 2, 500, 1.1)
    model = plan.time_model
    large = model.epoch_time(500, plan.large_samples)
    # B_S is Eq. 8 rounded: the small workers' epoch then matches the large ones' to within
    # one sample of batch either way
    small = plan.small_batch_size
    slower, faster = (model.epoch_time(b, plan.small_samples) for b in (small - 1, small + 1))
    assert slower > large > faster
    # and k times the all-B_L epoch
    assert large == pytest.approx(1.1 * model.epoch_time(500, 50000 / 4))
    # rounding B_S to an integer moves the small workers' time by well under 1%
    times = plan.predicted_epoch_times
    assert max(times) / min(times) < 1.01


def test_no_small_workers_is_the_uniform_large_baseline():
    plan = plan_dual_batch(PAPER, 50000, 4, 0, 500, 1.05)
    assert plan.batch_sizes == [500] * 4 and plan.samples == [12500] * 4
    assert plan.update_factors == [1.0] * 4 and plan.small_batch_size is None


def test_update_factor_none_and_the_table():
    plan = plan_dual_batch(PAPER, 50000, 4, 1, 500, 1.1, update_factor="none")
    assert plan.update_factors == [1.0] * 4
    text = str(plan)
    assert text == plan.table()
    for needle in ("3 (small)", "38", "8750", "13750", "28", "231", "fit error"):
        assert needle in text
    assert plan.steps == [28, 28, 28, 231]  # ceil(13750 / 500), ceil(8750 / 38)


def test_rescaled_keeps_the_data_split_and_replans_the_small_batch():
    plan = plan_dual_batch(PAPER, 50000, 4, 2, 500, 1.05)
    low = plan.rescaled(560, PAPER.scaled(0.5625))  # 24x24 of 32x32 pixels
    assert low.samples == plan.samples and low.update_factor == plan.update_factor
    assert low.large_batch_size == 560
    assert low.small_batch_size != plan.small_batch_size
    times = low.predicted_epoch_times
    assert max(times) / min(times) < 1.01


@pytest.mark.parametrize("seed", range(20))
def test_samples_always_sum_to_the_dataset_and_steps_cover_them(seed):
    rng = random.Random(seed)
    n = rng.randint(2, 9)
    d = rng.randint(n * 50, 100000)
    n_small = rng.randint(1, n)
    model = TimeModel(a=rng.uniform(1e-4, 1e-2), b=rng.uniform(1e-3, 0.5))
    try:
        plan = plan_dual_batch(model, d, n, n_small, rng.randint(8, 512), rng.uniform(1.01, 1.2))
    except DualBatchError:
        return  # infeasible draws are covered below
    assert sum(plan.samples) == d and all(s >= 1 for s in plan.samples)
    assert all(b >= 1 for b in plan.batch_sizes)
    assert all(s <= n * b for s, n, b in zip(plan.samples, plan.steps, plan.batch_sizes))
    assert plan_dual_batch(model, d, n, n_small, plan.large_batch_size, plan.extra_time_ratio) == (
        plan
    )


def test_too_large_k_leaves_nothing_for_the_small_workers_and_says_the_largest_k():
    with pytest.raises(DualBatchError, match=r"d_S = .*largest k .* is 1\.333306") as info:
        plan_dual_batch(PAPER, 50000, 4, 1, 500, 1.34)
    k_max = float(str(info.value).split("is ")[-1].rstrip("."))
    # at the suggested k the d_S bound holds (a B_S that rounds to 0 is the next bound)
    with pytest.raises(DualBatchError, match="No positive small batch"):
        plan_dual_batch(PAPER, 50000, 4, 1, 500, k_max)
    with pytest.raises(DualBatchError, match=r"d_S = 0\.9"):
        plan_dual_batch(PAPER, 50000, 4, 1, 500, k_max + 2e-6)


def test_no_positive_small_batch_says_the_largest_k_and_smallest_large_batch():
    model = TimeModel(a=1.0, b=0.3)  # almost no per-step cost: B_S rounds to 0
    with pytest.raises(DualBatchError, match="No positive small batch") as info:
        plan_dual_batch(model, 50000, 4, 2, 500, 1.3)
    message = str(info.value)
    k_max = float(message.split("largest k that gives B_S >= 1 is ")[1].split(" ")[0].rstrip("."))
    assert plan_dual_batch(model, 50000, 4, 2, 500, k_max).small_batch_size >= 1
    with pytest.raises(DualBatchError):
        plan_dual_batch(model, 50000, 4, 2, 500, k_max * 1.01)
    model = TimeModel(a=1.0, b=0.5)  # B_S = 0.38 at B_L = 2, but 0.58 as B_L grows
    with pytest.raises(DualBatchError, match="smallest B_L") as info:
        plan_dual_batch(model, 50000, 4, 2, 2, 1.3)
    b_min = int(str(info.value).split("at k = 1.3 is ")[1].rstrip("."))
    assert plan_dual_batch(model, 50000, 4, 2, b_min, 1.3).small_batch_size >= 1
    with pytest.raises(DualBatchError):
        plan_dual_batch(model, 50000, 4, 2, b_min - 1, 1.3)


def test_a_pure_per_sample_cost_has_no_small_batch_for_any_k():
    with pytest.raises(DualBatchError, match="too small for any k"):
        plan_dual_batch(TimeModel(a=1.0, b=0.0), 50000, 4, 2, 500, 1.05)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((50000, 4, 2, 500, 1.0), "k must be > 1"),
        ((50000, 4, 2, 500, float("nan")), "k must be > 1"),
        ((50000, 4, 5, 500, 1.05), r"in \[0, 4\]"),
        ((50000, 4, -1, 500, 1.05), r"in \[0, 4\]"),
        ((50000, 4, 2, 1, 1.05), "large_batch_size"),
        ((3, 4, 2, 500, 1.05), "at least 4 samples"),
        ((50000, 0, 0, 500, 1.05), "world_size"),
    ],
)
def test_bad_inputs_are_refused_with_the_bound_that_failed(args, message):
    with pytest.raises(DualBatchError, match=message):
        plan_dual_batch(PAPER, *args)
    with pytest.raises(DualBatchError, match="update_factor"):
        plan_dual_batch(PAPER, 50000, 4, 2, 500, 1.05, update_factor="half")


def test_time_model_fit_recovers_a_noisy_line_and_reports_its_error():
    rng = random.Random(0)
    a, b = 0.002, 0.03
    samples = [(x, (a * x + b) * rng.uniform(0.97, 1.03)) for x in (8, 16, 32, 64, 128) * 3]
    model = TimeModel.fit(samples)
    assert model.a == pytest.approx(a, rel=0.05) and model.b == pytest.approx(b, rel=0.2)
    assert 0 < model.relative_error < 0.06
    assert model.samples == tuple(samples)
    assert model.predict(10) == pytest.approx(model.a * 10 + model.b)
    assert model.scaled(0.5).a == pytest.approx(model.a / 2) and model.scaled(0.5).b == model.b


def test_time_model_fit_clips_negative_coefficients():
    flat = TimeModel.fit([(8, 0.5), (16, 0.49), (32, 0.48)])  # time falls with batch: noise
    assert flat.a == 0 and flat.b == pytest.approx(0.49)
    proportional = TimeModel.fit([(10, 0.09), (20, 0.2), (40, 0.42)])
    assert proportional.b == 0 and proportional.a > 0


@pytest.mark.parametrize(
    "samples", [[(8, 0.1)], [(8, 0.1), (8, 0.2)], [(0, 0.1), (8, 0.2)], [(4, 0.1), (8, -1.0)]]
)
def test_time_model_fit_refuses_unusable_samples(samples):
    with pytest.raises(PlanError):
        TimeModel.fit(samples)


def test_controller_options_name_and_fixed_plan():
    assert CONTROLLERS["dual"] is DualBatchController
    controller = make_controller("dual", deadband=0.1)  # other controllers' options are dropped
    assert isinstance(controller, DualBatchController)
    assert controller.resolve_small_workers(4) == 2 and controller.resolve_small_workers(1) == 0
    assert DualBatchController(small_workers=3).resolve_small_workers(4) == 3
    with pytest.raises(DualBatchError, match="only 2 workers"):
        DualBatchController(small_workers=3).resolve_small_workers(2)
    limits = BatchLimits(540, [500, 40], [500, 40])
    assert controller.update([500, 40], [1.0, 3.0], limits) == [500, 40]
    for bad in (
        {"extra_time_ratio": 1.0},
        {"small_workers": -1},
        {"large_batch_size": 1},
        {"update_factor": "half"},
    ):
        with pytest.raises(ValueError):
            DualBatchController(**bad)


def test_time_model_fit_weighs_relative_error_so_small_batches_set_the_per_step_time():
    # measured on this project's 2-core CI machine: the largest batch runs superlinear
    samples = [(4, 0.00915), (8, 0.01876), (16, 0.02444), (32, 0.07193)]
    model = TimeModel.fit(samples)
    assert model.b > 0  # plain least squares gives a negative intercept here
    assert least_squares_line(samples)[0] < 0 < least_squares_line(samples, relative=True)[0]
    assert plan_dual_batch(model, 1438, 4, 2, 32, 1.05).small_batch_size >= 1


# ---------------------------------------------------------------- issue 41: planned by speed
FAST = TimeModel(a=1.0, b=8.0)  # 40 s per step of 32
SLOW = TimeModel(a=3.0, b=24.0)  # 3x slower


def test_by_speed_the_small_batches_go_to_the_slowest_ranks_wherever_they_are():
    plan = plan_dual_batch_by_speed([SLOW, FAST, FAST, FAST], 1000, 1, 32, 1.05)
    assert plan.small_ranks == (0,) and plan.batch_sizes[1:] == [32, 32, 32]
    assert 1 <= plan.batch_sizes[0] < 32
    plan = plan_dual_batch_by_speed([FAST, SLOW, FAST, SLOW], 1000, 2, 32, 1.05)
    assert plan.small_ranks == (1, 3)
    assert plan.batch_sizes[0] == plan.batch_sizes[2] == 32
    # equal speeds: the last ranks, as paper 003's plan
    assert plan_dual_batch_by_speed([FAST] * 4, 1000, 2, 32, 1.05).small_ranks == (2, 3)


def test_by_speed_two_ranks_by_hand():
    # r_fast(32) = 32/40 = 0.8, r_slow(32) = 32/120; T_prop = 1000/(16/15) = 937.5 s,
    # T_DDP = 1000/64 * 120 = 1875 s; target 1.05 * 937.5: the fast rank trains 787.5 samples,
    # the slow one must train 212.5 in 984.4 s: x / (3x + 24) >= 0.2159 -> B_S = 15
    plan = plan_dual_batch_by_speed([SLOW, FAST], 1000, 1, 32, 1.05)
    assert plan.batch_sizes == [15, 32] and plan.samples == [214, 786]
    assert plan.ddp_epoch_time == pytest.approx(1875.0)
    times = plan.predicted_epoch_times
    one_sample = SLOW.epoch_time(15, 1)  # whole samples: a rank may take one more
    assert max(times) <= 1.05 * 937.5 + one_sample and max(times) - min(times) < one_sample


def test_by_speed_an_epoch_is_never_slower_than_ddps_by_the_time_models():
    rng = random.Random(41)
    for _ in range(300):
        n = rng.randint(2, 8)
        models = [TimeModel(a=rng.uniform(0.1, 3.0), b=rng.uniform(0.5, 50.0)) for _ in range(n)]
        d, large = rng.randint(n * 40, 5000), rng.randint(8, 256)
        plan = plan_dual_batch_by_speed(models, d, rng.randint(0, n), large, rng.uniform(1.01, 1.5))
        assert sum(plan.samples) == d and all(s >= 0 for s in plan.samples)
        slowest_step = max(m.predict(1) for m in models)  # rounding: one sample per rank at most
        assert max(plan.predicted_epoch_times) <= plan.ddp_epoch_time + slowest_step
        small = plan.small_batch_size
        assert small is None or 1 <= small <= large
        _assert_small_ranks_push_no_more_often(plan, models, large)


def _assert_small_ranks_push_no_more_often(plan, models, large):
    small_ranks = plan.small_ranks
    large_ranks = [r for r in range(len(models)) if r not in small_ranks]
    if not small_ranks or not large_ranks or plan.small_batch_size == large:
        return
    slowest_small = max(models[r].predict(plan.small_batch_size) for r in small_ranks)
    assert slowest_small >= max(models[r].predict(large) for r in large_ranks)


def test_by_speed_small_ranks_never_push_more_often_than_large_ones():
    # per-step costs small next to per-sample ones: the extra time alone picks B_S = 3
    # (measured: the transformer with Adam then ended 16 points below DDP); the floor is
    # the batch whose step on the slow rank takes the fast rank's step at B_L
    fast, slow = TimeModel(a=1.0, b=0.5), TimeModel(a=3.0, b=0.5)
    assert push_floor([slow, fast], [0], [1], 64) == 22  # 3 * 22 + 0.5 >= 64.5 > 3 * 21 + 0.5
    plan = plan_dual_batch_by_speed([slow, fast], 8192, 1, 64, 1.05)
    assert plan.batch_sizes == [22, 64]
    assert sum(plan.samples) == 8192
    times = plan.predicted_epoch_times
    assert max(times) <= plan.ddp_epoch_time
    assert times[0] == pytest.approx(times[1], rel=0.01)  # both end together
    assert "B_S = 22 is the push floor" in plan.table()
    # where the extra time already asks for more, the floor changes nothing: B_S = 15 > 6
    assert push_floor([SLOW, FAST], [0], [1], 32) == 6
    above = plan_dual_batch_by_speed([SLOW, FAST], 1000, 1, 32, 1.05)
    assert above.batch_sizes == [15, 32] and "push floor" not in above.table()
    # every rank small: no large step to match
    assert push_floor([slow, slow], [0, 1], [], 64) == 1
    # rescaled plans (the hybrid's resolutions) keep the floor
    again = plan.rescaled(32, plan.time_model.scaled(0.5))
    models = again.rank_models
    assert models[0].predict(again.small_batch_size) >= models[1].predict(32)
    assert models[0].predict(again.small_batch_size - 1) < models[1].predict(32)


def test_by_speed_at_equal_speeds_there_is_no_room_for_a_smaller_batch():
    plan = plan_dual_batch_by_speed([FAST] * 4, 1000, 2, 32, 1.1)
    assert plan.batch_sizes == [32] * 4 and plan.samples == [250] * 4
    assert max(plan.predicted_epoch_times) == pytest.approx(plan.ddp_epoch_time)


def test_by_speed_rescaled_keeps_the_slow_ranks_small():
    plan = plan_dual_batch_by_speed([SLOW, FAST], 1000, 1, 32, 1.05)
    again = plan.rescaled(64, plan.time_model.scaled(0.5))
    assert again.small_ranks == (0,) and again.batch_sizes[1] == 64
    assert again.samples != plan.samples or again.batch_sizes != plan.batch_sizes
    with pytest.raises(DualBatchError, match="per-step time b is 0"):
        plan_dual_batch_by_speed([TimeModel(a=1.0, b=0.0)] * 2, 1000, 1, 32, 1.05)


def test_by_speed_rescaled_keeps_each_ranks_samples_and_ends_the_small_ranks_in_time():
    plan = plan_dual_batch_by_speed([SLOW, FAST, FAST], 1200, 1, 32, 1.05)
    for large, per_sample in ((64, 0.5), (16, 2.0)):
        again = plan.rescaled(large, plan.time_model.scaled(per_sample))
        assert again.samples == plan.samples and again.small_ranks == (0,)
        times = again.predicted_epoch_times
        assert times[0] <= max(times[1:])  # the small rank ends no later than the large ones
        smaller = replace(again, small_batch_size=again.small_batch_size - 1)
        floor = push_floor(again.rank_models, [0], [1, 2], large)
        assert again.small_batch_size >= floor
        assert again.small_batch_size == floor or (
            smaller.predicted_epoch_times[0] > max(times[1:])
        )


def test_by_speed_ranks_within_timing_noise_count_as_equally_fast():
    noisy = [TimeModel(a=1.0, b=8.0 * f) for f in (1.05, 1.0, 1.08, 1.02)]
    assert plan_dual_batch_by_speed(noisy, 1000, 2, 32, 1.05).small_ranks == (2, 3)
