"""DualBatchMode (``mode="async", controller="dual"``) on a real run context."""

import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero._optim import lr_factor
from lightning_hetero.modes.dual import DualBatchMode
from lightning_hetero.planning.dual import DualBatchController, TimeModel
from lightning_hetero.sampler import EpochPermutation

from .conftest import bound

SAMPLES = 100
LARGE = 8


def _planned() -> DualBatchMode:
    controller = DualBatchController(small_workers=1, large_batch_size=LARGE)
    mode, _ = bound("async", [LARGE, LARGE], world_size=2, controller=controller)
    assert isinstance(mode, DualBatchMode)
    loader = DataLoader(TensorDataset(torch.zeros(SAMPLES, 1)), batch_size=LARGE)
    probed: list[int] = []

    def probe_time(largest: int) -> TimeModel:
        probed.append(largest)
        return TimeModel(a=0.01, b=0.05)

    plan = mode.first_plan(loader, probe_time)
    assert probed == [LARGE] and plan is not None
    mode.batch_sampler(EpochPermutation(SAMPLES, shuffle=False), plan, False, lower=1)
    return mode


def test_the_first_plan_is_the_dual_plan_from_the_probed_time_model_and_fixes_the_limits():
    mode = _planned()
    dual = mode.dual_plan
    assert dual is not None
    sizes = list(dual.batch_sizes)
    assert sizes == [LARGE, dual.small_batch_size]  # the large ranks first
    assert dual.small_batch_size < LARGE and sum(dual.samples) == SAMPLES
    limits = mode.ctx.plan_state.limits
    assert limits is not None
    assert limits.global_batch_size == sum(sizes)
    assert limits.min_batch_size == limits.max_batch_size == sizes  # no controller moves it


def test_a_steps_share_is_of_ddps_global_batch_and_the_server_scales_it_by_its_rule():
    mode = _planned()
    dual = mode.dual_plan
    assert dual is not None
    own = dual.batch_sizes[0]
    mode.on_train_batch_start(0)
    assert mode.share == (own, dual.world_size * dual.large_batch_size)  # b_k of n * B_L
    sgd = torch.optim.SGD([torch.nn.Parameter(torch.zeros(1))], lr=0.1)
    assert mode.update_factor(sgd) == 1.0  # no factor besides the server's rule
    # under the linear rule the server's factor of that share is the plan's update factor
    assert lr_factor("linear", own / mode.share[1]) == pytest.approx(dual.update_factors[0])


def test_a_controllers_plan_change_is_refused_as_the_dual_plan_is_fixed():
    mode = _planned()
    with pytest.raises(RuntimeError, match="dual batch size plan is fixed"):
        mode.apply_plan([4, 4], from_step=None)


def test_a_probe_per_rank_puts_the_small_batch_on_the_slow_rank_whichever_it_is():
    # the probe's fits, rank 0 three times slower: it gets B_S, rank 1 keeps B_L
    controller = DualBatchController(small_workers=1, large_batch_size=LARGE)
    mode, _ = bound("async", [LARGE, LARGE], world_size=2, controller=controller)
    assert isinstance(mode, DualBatchMode)
    loader = DataLoader(TensorDataset(torch.zeros(SAMPLES, 1)), batch_size=LARGE)
    slow, fast = TimeModel(a=0.03, b=0.15), TimeModel(a=0.01, b=0.05)
    plan = mode.first_plan(loader, lambda largest: [slow, fast])
    assert plan is not None and plan[1] == LARGE and plan[0] < LARGE
    dual = mode.dual_plan
    assert dual is not None and dual.small_ranks == (0,) and sum(dual.samples) == SAMPLES
    assert max(dual.predicted_epoch_times) <= dual.ddp_epoch_time
