"""The learning-rate scaling rule of async, dual and local mode (``lr_scaling``), the
warning for adaptive optimizers in async mode, rank 0's step times beside the server, and
``patched`` restoring an LR scheduler's wrapper."""

import copy
import math
import time
import warnings
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.core.optimizer import LightningOptimizer
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy
from lightning_hetero._comm import HostStepTimer
from lightning_hetero._optim import (
    NoiseScale,
    check_lr_scaling,
    is_adaptive,
    lr_factor,
    lr_rule,
    patched,
    second_moment_decay,
)
from lightning_hetero.modes import ModeOptions, ParameterServerMode
from lightning_hetero.modes.dual import DualBatchMode
from lightning_hetero.paramserver import ParameterServer, ServerClient
from lightning_hetero.planning import make_controller
from lightning_hetero.planning.dual import DualBatchController, TimeModel, plan_dual_batch
from lightning_hetero.sampler import EpochPermutation, PartitionBatchSampler


def _params() -> list[torch.nn.Parameter]:
    return [torch.nn.Parameter(torch.zeros(3))]


ADAPTIVE = ["Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta"]
ADAPTIVE += ["SparseAdam", "Adafactor", "Rprop"]
SGD_FAMILY = ["SGD", "ASGD"]


class _Lion(torch.optim.Optimizer):
    """A third-party adaptive optimizer torch does not know: recognized by its ``betas``."""

    def __init__(self, params, lr=1e-4, betas=(0.9, 0.99)) -> None:
        super().__init__(params, {"lr": lr, "betas": betas})


class _Lars(torch.optim.Optimizer):
    """A third-party SGD-family optimizer (momentum, a trust coefficient, an eps)."""

    def __init__(self, params, lr=0.1, momentum=0.9) -> None:
        super().__init__(params, {"lr": lr, "momentum": momentum, "eta": 1e-3, "eps": 1e-8})


def _make(name: str) -> torch.optim.Optimizer:
    cls = getattr(torch.optim, name)
    return cls(_params(), lr=0.1)


@pytest.mark.parametrize("name", [n for n in ADAPTIVE if hasattr(torch.optim, n)])
def test_adaptive_optimizers_take_the_noise_rule_where_measured_else_the_square_root(name):
    optimizer = _make(name)
    assert is_adaptive(optimizer)
    assert lr_rule("auto", optimizer) == "sqrt"
    assert lr_rule("auto", optimizer, measured=True) == "noise"


@pytest.mark.parametrize("name", SGD_FAMILY)
def test_sgd_family_optimizers_take_the_linear_rule(name):
    optimizer = _make(name)
    assert not is_adaptive(optimizer)
    assert lr_rule("auto", optimizer) == "linear"
    assert lr_rule("auto", optimizer, measured=True) == "linear"


def test_unknown_optimizers_are_recognized_by_their_parameter_group_keys():
    assert lr_rule("auto", _Lion(_params())) == "sqrt"
    assert lr_rule("auto", _Lion(_params()), measured=True) == "noise"
    assert lr_rule("auto", _Lars(_params())) == "linear"


def test_a_lightning_optimizer_is_recognized_by_the_optimizer_it_wraps():
    assert is_adaptive(LightningOptimizer(torch.optim.Adam(_params())))
    assert not is_adaptive(LightningOptimizer(torch.optim.SGD(_params(), lr=0.1)))


@pytest.mark.parametrize(
    ("option", "rule"), [("linear", "linear"), (True, "linear"), ("sqrt", "sqrt"), ("none", "none"),
                         (False, "none")],
)  # fmt: skip
def test_an_explicit_rule_overrides_the_optimizer_family(option, rule):
    assert lr_rule(option, torch.optim.Adam(_params())) == rule
    assert lr_rule(option, torch.optim.SGD(_params(), lr=0.1)) == rule
    assert lr_rule(option, torch.optim.Adam(_params()), measured=True) == rule


def test_the_noise_rule_is_refused_where_nothing_measures_the_noise():
    adam = torch.optim.Adam(_params())
    assert lr_rule("noise", adam, measured=True) == "noise"
    with pytest.raises(ValueError, match="lr_scaling='noise'.*mode='async'"):
        lr_rule("noise", adam)
    with pytest.raises(ValueError, match="NoiseScale"):
        lr_factor("noise", 0.5)
    with pytest.raises(ValueError, match="lr_scaling='noise'.*mode='local'"):
        HeteroStrategy(mode="local", lr_scaling="noise")
    assert HeteroStrategy(mode="async", lr_scaling="noise").lr_scaling == "noise"
    # the dual plan's pushes are measured by the same server
    assert HeteroStrategy(mode="async", controller="dual", lr_scaling="noise").lr_scaling == "noise"


@pytest.mark.parametrize("value", ["Linear", "square", 1, 0.5, None])
def test_other_lr_scaling_values_are_refused_naming_the_option(value):
    with pytest.raises(ValueError, match="`lr_scaling` must be one of"):
        check_lr_scaling(value)
    with pytest.raises(ValueError, match="`lr_scaling`"):
        ModeOptions(lr_scaling=value)


def test_the_factor_of_each_rule():
    assert lr_factor("linear", 0.25) == 0.25
    assert lr_factor("sqrt", 0.25) == 0.5
    assert lr_factor("none", 0.25) == 1.0
    with pytest.raises(ValueError, match="positive"):
        lr_factor("sqrt", 0.0)


def test_the_default_is_auto():
    assert ModeOptions().lr_scaling == "auto"
    assert HeteroStrategy(mode="async").lr_scaling == "auto"


# ---------------------------------------------------------------- the noise rule


def _push_grads(signal: torch.Tensor, sigma: float, batch: int) -> list[torch.Tensor]:
    """A push's mean gradient over ``batch`` samples: ``signal`` plus per-sample noise of
    standard deviation ``sigma`` per coordinate."""
    return [signal + sigma / math.sqrt(batch) * torch.randn_like(signal)]


def test_the_noise_rule_estimates_signal_and_noise_from_uneven_pushes():
    torch.manual_seed(0)
    signal, sigma = torch.full((4000,), 0.05), 0.4  # |G|^2 = 10, tr(Sigma) = 640
    rule = NoiseScale()
    for _ in range(60):
        for batch in (8, 24, 8, 24):  # two windows of B = 32, uneven pushes
            rule.observe(_push_grads(signal, sigma, batch), batch, 32)
    assert rule.signal == pytest.approx(10.0, rel=0.1)
    assert rule.noise == pytest.approx(640.0, rel=0.1)
    noise_scale = 64.0
    # Adam's denominator mixes both sizes: h = mean(1/8, 1/24) = 1/12, for either push
    expected = 0.25 * math.sqrt((1 + noise_scale / 12) / (1 + noise_scale / 32))
    assert 0.25 < rule.factor(0.25) < 0.5
    assert rule.factor(0.25) == pytest.approx(expected, rel=0.05)
    large = 0.75 * math.sqrt((1 + noise_scale / 12) / (1 + noise_scale / 32))
    assert rule.factor(0.75) == pytest.approx(min(large, math.sqrt(0.75)), rel=0.05)


def _noise_rule_after(batches: list[int], moment_decay: float = 0.999) -> NoiseScale:
    torch.manual_seed(0)
    rule = NoiseScale(moment_decay=moment_decay)
    for _ in range(40):
        for batch in batches:
            rule.observe(_push_grads(torch.full((4000,), 0.05), 0.4, batch), batch, 64)
    return rule


def test_the_noise_rule_steps_large_pushes_further_beside_many_small_ones():
    # dual batch: Adam's running mean of squared gradients is one over every push, so the
    # small pushes' noise shrinks the large pushes' steps too; the factor makes up for it
    alone = _noise_rule_after([32, 32])
    mixed = _noise_rule_after([32, 4, 4, 4, 4, 4, 4, 4, 4])  # 32 + 8 x 4 = 64 samples
    assert alone.factor(0.5) < mixed.factor(0.5) <= math.sqrt(0.5)
    noise_scale = mixed.noise / mixed.signal
    h = (1 / 32 + 8 / 4) / 9  # the pushes' mean 1/b
    expected = 0.5 * math.sqrt((1 + noise_scale * h) / (1 + noise_scale / 64))
    assert mixed.factor(0.5) == pytest.approx(min(expected, math.sqrt(0.5)), rel=0.02)
    # equal pushes: h = 1/b, the factor of a push's own batch
    noise_scale = alone.noise / alone.signal
    own = 0.5 * math.sqrt((1 + noise_scale / 32) / (1 + noise_scale / 64))
    assert alone.factor(0.5) == pytest.approx(own, rel=1e-6)


def test_the_noise_rule_weighs_pushes_as_the_optimizer_weighs_squared_gradients():
    last_only = _noise_rule_after([4, 4, 32], moment_decay=0.0)  # h = 1/32, the last push
    every = _noise_rule_after([4, 4, 32], moment_decay=1.0)  # h = mean over every push
    noise_scale = last_only.noise / last_only.signal
    assert last_only.factor(0.5) == pytest.approx(
        0.5 * math.sqrt((1 + noise_scale / 32) / (1 + noise_scale / 64)), rel=1e-6
    )
    assert every.factor(0.5) > last_only.factor(0.5)
    with pytest.raises(ValueError, match="moment_decay"):
        NoiseScale(moment_decay=1.5)


@pytest.mark.parametrize(
    ("optimizer", "decay"),
    [
        (lambda p: torch.optim.Adam(p, betas=(0.9, 0.98)), 0.98),
        (lambda p: torch.optim.RMSprop(p, alpha=0.9), 0.9),
        (lambda p: torch.optim.Adadelta(p, rho=0.8), 0.8),
        (lambda p: torch.optim.Adagrad(p), 1.0),
        (lambda p: torch.optim.SGD(p, lr=0.1), 0.999),
    ],
)
def test_second_moment_decay_reads_the_optimizer(optimizer, decay):
    params = [torch.nn.Parameter(torch.zeros(2))]
    assert second_moment_decay(optimizer(params)) == decay


def test_the_server_measures_noise_with_the_optimizers_own_decay():
    param = torch.nn.Parameter(torch.zeros(2))
    server = ParameterServer([torch.optim.Adam([param], betas=(0.9, 0.95))], world_size=2)
    assert server._slots[0].noise.moment_decay == 0.95


def test_the_noise_rule_is_linear_for_agreeing_pushes_and_square_root_for_pure_noise():
    torch.manual_seed(0)
    agreeing, noisy = NoiseScale(), NoiseScale()
    assert agreeing.factor(0.25) == 0.25  # before the first window of B samples: linear
    for _ in range(40):
        agreeing.observe([torch.ones(100), None], 8, 32)
        noisy.observe(_push_grads(torch.zeros(2000), 1.0, 8), 8, 32)
    assert agreeing.factor(0.25) == pytest.approx(0.25)
    assert noisy.factor(0.25) == pytest.approx(0.5, rel=0.05)
    for share in (0.1, 0.25, 0.5, 1.0):
        assert share <= noisy.factor(share) <= math.sqrt(share)


def test_the_noise_rule_starts_a_new_window_when_the_global_batch_changes():
    rule = NoiseScale()
    rule.observe([torch.ones(3)], 8, 32)
    rule.observe([torch.ones(3)], 8, 64)  # B changed: the first push of B = 32 is dropped
    rule.observe([torch.ones(3)], 8, 64)
    rule.observe([torch.ones(3)], 8, 64)
    assert rule.signal is None  # 24 of 64 samples: no window full yet
    with pytest.raises(ValueError, match="decay"):
        NoiseScale(decay=1.0)


def test_the_noise_rule_keys_gradients_by_parameter_when_they_come_and_go():
    # issue 40, failure 5: a push whose None set differs from the window's first push raised
    # a shape mismatch (or summed one parameter's gradient into another's)
    a, b = torch.nn.Parameter(torch.zeros(3)), torch.nn.Parameter(torch.zeros(5))
    server = ParameterServer([torch.optim.Adam([a, b], lr=1e-3)], world_size=2)
    server.push(0, 0, [torch.ones(3), torch.ones(5)], 8, 32, [1e-3], 0)
    server.push(1, 0, [None, torch.ones(5)], 8, 32, [1e-3], 0)
    # same shapes, alternating: each parameter's estimate sees only its own gradients
    keyed, alone = NoiseScale(), NoiseScale()
    for _ in range(8):
        keyed.observe([torch.ones(4), None], 8, 32)
        keyed.observe([None, torch.full((4,), 3.0)], 8, 32)
        alone.observe([torch.ones(4)], 8, 32)
        alone.observe([torch.full((4,), 3.0)], 8, 32)
    assert keyed.noise == pytest.approx(0.0, abs=1e-9)  # each parameter's pushes agree
    assert keyed.signal == pytest.approx(4.0 + 36.0)
    assert alone.noise is not None and alone.noise > 0  # mixed into one: looks like noise


def test_the_noise_rule_counts_a_parameter_unfrozen_mid_window():
    rule = NoiseScale()
    rule.observe([torch.ones(2), None], 8, 32)
    rule.observe([torch.ones(2), torch.ones(6)], 8, 32)  # the second parameter joins
    rule.observe([torch.ones(2), torch.ones(6)], 8, 32)
    rule.observe([torch.ones(2), torch.ones(6)], 8, 32)
    assert rule.signal == pytest.approx(2.0 + 6.0)
    assert rule.noise == pytest.approx(0.0, abs=1e-9)


def test_the_noise_rule_skips_a_non_finite_gradient_with_one_warning():
    rule = NoiseScale()
    with pytest.warns(UserWarning, match="not finite") as record:
        for bad in (math.inf, math.nan):
            rule.observe([torch.tensor([1.0, bad])], 8, 32)
    assert len([w for w in record if "not finite" in str(w.message)]) == 1
    for _ in range(4):
        rule.observe([torch.ones(2)], 8, 32)
    assert rule.signal == pytest.approx(2.0)
    assert math.isfinite(rule.factor(0.25))
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        rule.observe([torch.tensor([math.nan, 1.0])], 8, 32)  # warned once already
    assert math.isfinite(rule.factor(0.25))


def _round_trip(lr_scaling: str, rounds: int) -> float:
    """How far the server's Adam moves the parameters in the last of ``rounds`` rounds of 4
    pushes of the same gradient (4 ranks in agreement), in units of one DDP Adam step."""
    params = [torch.nn.Parameter(torch.zeros(50))]
    server = ParameterServer([torch.optim.Adam(params, lr=0.01)], 4, lr_scaling)
    grads = [torch.linspace(-1, 1, 50)]
    before = None
    for round_ in range(rounds):
        if round_ == rounds - 1:
            before = server.pull(0).params[0]
        for rank in range(4):
            result = server.push(rank, 0, grads, 8, 32, [0.01], server.version)
    assert before is not None
    return float((result.params[0] - before).abs().max()) / 0.01


def test_where_pushes_agree_the_noise_rule_moves_one_ddp_step_per_round_and_sqrt_two():
    # the stability edge issue 32 found: Adam's step barely depends on the gradient, so four
    # agreeing pushes at sqrt(1/4) * lr move twice as far as DDP's one step of lr
    assert _round_trip("noise", 5) == pytest.approx(1.0, rel=0.02)
    assert _round_trip("sqrt", 5) == pytest.approx(2.0, rel=0.02)
    assert _round_trip("linear", 5) == pytest.approx(1.0, rel=0.02)


# ---------------------------------------------------------------- the server


def test_the_server_steps_adam_with_the_noise_rule_by_default():
    adam, sgd = torch.optim.Adam(_params()), torch.optim.SGD(_params(), lr=0.1)
    assert ParameterServer([adam, sgd], world_size=4).rules == ["noise", "linear"]


def test_the_server_steps_adam_with_the_square_root_of_the_batch_share():
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    optimizer = torch.optim.Adam(layer.parameters(), lr=0.01)
    reference = copy.deepcopy(layer)
    server = ParameterServer([optimizer], world_size=4, lr_scaling="sqrt")
    assert server.rules == ["sqrt"]
    grads = [torch.randn_like(p) for p in layer.parameters()]
    result = server.push(1, 0, grads, 16, 64, [0.01], 0)
    expected_opt = torch.optim.Adam(reference.parameters(), lr=0.01 * math.sqrt(16 / 64))
    for param, grad in zip(reference.parameters(), grads):
        param.grad = grad.clone()
    expected_opt.step()
    for new, expected in zip(result.params, reference.parameters()):
        torch.testing.assert_close(new, expected.detach())


def test_the_server_keeps_the_linear_rule_for_sgd_and_each_optimizer_its_own():
    sgd = torch.optim.SGD(_params(), lr=0.1, momentum=0.9)
    adam = torch.optim.AdamW(_params())
    assert ParameterServer([sgd, adam], world_size=2).rules == ["linear", "noise"]
    assert ParameterServer([sgd, adam], world_size=2, lr_scaling="none").rules == ["none"] * 2


# ---------------------------------------------------------------- dual batch


def test_dual_batch_scales_each_push_by_its_batch_share_of_ddps_step_by_default():
    assert DualBatchController().update_factor == "share"
    model = TimeModel(a=1.0, b=24.66)
    plan = plan_dual_batch(model, 50000, 4, 1, 500, 1.1, update_factor="share")
    assert plan.update_factors == [b / (4 * 500) for b in plan.batch_sizes]
    paper = plan_dual_batch(model, 50000, 4, 1, 500, 1.1, update_factor="ratio")
    assert paper.update_factors[:3] == [1.0] * 3  # the paper's rule: full large-batch steps
    assert "batch share" in plan.table()


def _dual_mode(rank: int, update_factor: str = "share", **options) -> DualBatchMode:
    """Rank ``rank``'s dual mode on a 4-rank plan (B_L = 500, one small-batch rank of 38)."""
    plan = plan_dual_batch(TimeModel(a=1.0, b=24.66), 50000, 4, 1, 500, 1.1, update_factor)
    mode = DualBatchMode(DualBatchController(update_factor=update_factor), ModeOptions(**options))
    mode.context = SimpleNamespace(rank=rank)
    mode.dual_plan = plan
    mode.sampler = PartitionBatchSampler(
        EpochPermutation(50000), plan.samples, plan.batch_sizes, rank
    )
    return mode


@pytest.mark.parametrize("name, rule", [("Adam", "noise"), ("AdamW", "noise"), ("SGD", "linear")])
def test_dual_batch_pushes_its_share_of_ddps_batch_under_the_async_rule_by_default(name, rule):
    # the push is b_k out of DDP's global batch n * B_L = 2000, and the server applies the
    # optimizer's rule to it as in async mode: the measured-noise rule for Adam (the linear
    # rule where pushes agree, so never past DDP's step), the linear one for SGD
    optimizer = _make(name)
    for rank, samples in ((0, 500), (3, 38)):
        mode = _dual_mode(rank)
        assert mode.step_layout(0) == (samples, 2000, True)
        assert mode.update_factor(optimizer) == 1.0
        assert ParameterServer([optimizer], 4, mode._lr_scaling()).rules == [rule]
    for option, rule in (("linear", "linear"), ("sqrt", "sqrt"), ("noise", "noise")):
        mode = _dual_mode(3, lr_scaling=option)
        assert ParameterServer([optimizer], 4, mode._lr_scaling()).rules == [rule]


def test_dual_batch_under_the_papers_rule_scales_by_its_factor_alone():
    mode = _dual_mode(3, update_factor="ratio")
    assert mode.step_layout(0) == (38, 38, True)  # the server's share: 1
    assert mode._lr_scaling() == "none"
    assert mode.update_factor(torch.optim.Adam(_params())) == mode.dual_plan.update_factors[3] < 1
    assert _dual_mode(0, update_factor="ratio").update_factor(_make("SGD")) == 1.0


def test_dual_batch_shares_through_the_server_move_as_the_linear_rule_for_sgd():
    # end to end through the server: the small rank's push of 38 of 2000 at lr 0.1
    layer = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.1)
    mode = _dual_mode(3)
    server = ParameterServer([optimizer], 4, mode._lr_scaling())
    before = [p.detach().clone() for p in layer.parameters()]
    grads = [torch.ones_like(p) for p in layer.parameters()]
    local, total, _ = mode.step_layout(0)
    result = server.push(3, 0, grads, local, total, [0.1], 0, mode.update_factor(optimizer))
    for new, old in zip(result.params, before):
        torch.testing.assert_close(new, old - 0.1 * 38 / 2000)


@pytest.mark.parametrize("rule", ["linear", "sqrt", "noise"])
def test_dual_batch_with_the_papers_rule_refuses_a_batch_share_rule(rule):
    with pytest.raises(ValueError, match=f"update_factor='ratio'.*lr_scaling='{rule}'"):
        HeteroStrategy(
            mode="async", controller=DualBatchController(update_factor="ratio"), lr_scaling=rule
        )
    HeteroStrategy(mode="async", controller=DualBatchController(update_factor="ratio"))


# ---------------------------------------------------------------- rank 0's step times


class _RecordingTimer(HostStepTimer):
    """Records the waits counted from elsewhere (the server's serving), step by step."""

    def __init__(self) -> None:
        super().__init__()
        self.added: list[float] = []

    def add_wait(self, seconds: float) -> None:
        self.added.append(seconds)
        super().add_wait(seconds)


def _rank0_mode(server: ParameterServer, optimizer: torch.optim.Optimizer) -> ParameterServerMode:
    mode = ParameterServerMode(make_controller("static"), ModeOptions())
    mode.context = SimpleNamespace(timer=_RecordingTimer(), optimizers=[optimizer], rank=0)
    mode.server = server
    mode.client = ServerClient(0, timeout=5.0)  # rank 0 calls the server directly
    mode.share = (8, 16)
    return mode


class _SlowSGD(torch.optim.SGD):
    """Stands for a large model's update: each step takes a while, so serving takes time."""

    def step(self, closure=None):
        time.sleep(0.01)
        return super().step(closure)


def _step(mode: ParameterServerMode, optimizer: torch.optim.Optimizer, other_pushes: int) -> float:
    """One step of rank 0 during which the server applies ``other_pushes`` of rank 1; returns
    the seconds the server spent on them."""
    server = mode.server
    timer = mode.ctx.timer
    timer.start(8)
    served = server.serving_s
    for _ in range(other_pushes):  # on the RPC threads, beside rank 0's forward and backward
        server.push(1, 0, [torch.ones(3)], 8, 16, [0.1], 0)
    served = server.serving_s - served
    for param in optimizer.param_groups[0]["params"]:
        param.grad = torch.ones_like(param)
    mode.post_backward()
    mode._push(0, optimizer)  # rank 0's own push: waiting, and no serving
    timer.step_done()
    return served


def test_rank0_step_times_leave_out_the_other_ranks_pushes_it_served():
    optimizer = _SlowSGD(_params(), lr=0.1)
    server = ParameterServer([optimizer], world_size=2)
    ServerClient.start_server(server)
    try:
        mode = _rank0_mode(server, optimizer)
        served = [_step(mode, optimizer, pushes) for pushes in (3, 0, 2)]
    finally:
        ServerClient.stop_server()
    assert served[0] > 0 and served[1] == 0 and served[2] > 0
    assert server.updates == [3, 5]
    timer = mode.ctx.timer
    assert timer.added == served  # each step leaves out exactly the serving beside it
    for record, seconds in zip(timer.collect(), served):
        assert record.wait_s >= seconds  # waiting: the serving, and the step's own push


# ---------------------------------------------------------------- patched, the warning


def test_patched_restores_an_lr_schedulers_step_wrapper():
    optimizer = torch.optim.SGD(_params(), lr=0.1)
    scheduler = torch.optim.lr_scheduler.LambdaLR(optimizer, lambda epoch: 0.5)
    wrapper = optimizer.step
    assert getattr(wrapper, "_wrapped_by_lr_sched", False)
    with patched(optimizer, {"step": lambda closure=None: None}):
        assert optimizer.step is not wrapper
    assert vars(optimizer)["step"] is wrapper
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # "lr_scheduler.step() before optimizer.step()"
        optimizer.step()
        scheduler.step()


def test_patched_deletes_what_was_not_there():
    optimizer = torch.optim.SGD(_params(), lr=0.1)
    with patched(optimizer, {"step": lambda closure=None: None}):
        pass
    assert "step" not in vars(optimizer)


class _Task(pl.LightningModule):
    def __init__(self, optimizer: str) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)
        self.optimizer = optimizer

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        if self.optimizer == "adam":
            optimizer = torch.optim.Adam(self.parameters(), lr=1e-3)
        else:
            optimizer = torch.optim.SGD(self.parameters(), lr=0.01)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1)
        return {"optimizer": optimizer, "lr_scheduler": {"scheduler": scheduler}}

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(32, 4, generator=g), torch.randn(32, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8)


def _fit_async(optimizer: str, tmp_path) -> list[str]:
    trainer = pl.Trainer(
        strategy=HeteroStrategy(mode="async"),
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=tmp_path,
        logger=False,
        enable_checkpointing=False,
    )
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        trainer.fit(_Task(optimizer))
    return [str(w.message) for w in caught]


def test_async_with_adam_warns_once_what_differs_from_ddp(tmp_path):
    messages = _fit_async("adam", tmp_path)
    adaptive = [m for m in messages if "adaptive optimizer" in m]
    assert len(adaptive) == 1
    assert adaptive[0].startswith("hetero:") and "['Adam']" in adaptive[0]
    assert "stale" in adaptive[0] and "mode='bsp'" in adaptive[0]
    assert not [m for m in messages if "lr_scheduler.step()" in m]


def test_async_with_sgd_neither_warns_nor_upsets_the_lr_scheduler(tmp_path):
    messages = _fit_async("sgd", tmp_path)
    assert not [m for m in messages if "adaptive optimizer" in m]
    assert not [m for m in messages if "lr_scheduler.step()" in m]
