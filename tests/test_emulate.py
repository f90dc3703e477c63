from types import SimpleNamespace

import pytest
import torch

from lightning_hetero import HeteroStrategy
from lightning_hetero.emulate import Throttle


def test_schedule_uses_the_latest_entry_at_or_before_the_epoch():
    throttle = Throttle({2: [0.1, 0.2], 5: [0.3, 0.4]})
    assert throttle.cost(rank=1, epoch=0) == 0.0
    assert throttle.cost(rank=1, epoch=2) == 0.2
    assert throttle.cost(rank=0, epoch=4) == 0.1
    assert throttle.cost(rank=0, epoch=9) == 0.3


def test_constant_costs_apply_from_the_first_epoch():
    assert Throttle([0.5, 0.25]).cost(rank=1, epoch=0) == 0.25


@pytest.mark.parametrize(
    "bad", [[], {}, [-0.1, 0.2], {-1: [0.1]}, {0: [0.1, 0.2], 3: [0.1]}], ids=str
)
def test_bad_costs_are_refused(bad):
    with pytest.raises(ValueError):
        Throttle(bad)


def test_rank_without_a_cost_is_refused():
    with pytest.raises(ValueError, match="rank 2"):
        Throttle([0.1, 0.2]).cost(rank=2, epoch=0)


def test_bad_unit_is_refused():
    with pytest.raises(ValueError, match="'epoch' or 'step'"):
        Throttle([0.1], unit="batch")


@pytest.mark.parametrize(("unit", "expected"), [("epoch", [0, 0, 0]), ("step", [0, 0.5, 0.5])])
def test_schedule_keys_count_epochs_or_global_steps(monkeypatch, unit, expected):
    throttle = Throttle({0: [0.0], 7: [0.05]}, unit=unit)
    delays = []
    for step in (6, 7, 8):  # all in epoch 0, ten samples per batch
        slept = []
        monkeypatch.setattr("lightning_hetero.emulate.time.sleep", slept.append)
        trainer = SimpleNamespace(global_rank=0, current_epoch=0, global_step=step, strategy=None)
        throttle.on_train_batch_start(trainer, None, torch.zeros(10, 3), 0)
        throttle.on_before_backward(trainer, None, None)
        delays.append(sum(slept))
    assert delays == pytest.approx(expected)


def _trainer(rank=0, epoch=0, step=0, world_size=2):
    return SimpleNamespace(
        global_rank=rank,
        current_epoch=epoch,
        global_step=step,
        world_size=world_size,
        strategy=None,
    )


def _record_sleeps(monkeypatch):
    """Patch the module's ``time.sleep``; returns the list of seconds it was asked for."""
    slept = []
    monkeypatch.setattr("lightning_hetero.emulate.time.sleep", slept.append)
    return slept


def _step_sleeps(throttle, trainer, batch_size, slept):
    """Run a step's hooks; returns ``{hook: seconds slept in it}``."""
    per_hook = {}
    for hook, call in (
        (
            "on_train_batch_start",
            lambda: throttle.on_train_batch_start(trainer, None, torch.zeros(batch_size, 3), 0),
        ),
        ("on_before_backward", lambda: throttle.on_before_backward(trainer, None, None)),
    ):
        before = len(slept)
        call()
        per_hook[hook] = slept[before:]
    return per_hook


@pytest.mark.parametrize(
    ("options", "rank", "batch_size", "expected"),
    [
        ({}, 1, 10, (0.0, 2.0)),
        ({"load_cost": 0.01}, 1, 10, (0.1, 2.0)),
        ({"load_cost": [0.01, 0.03]}, 1, 10, (0.3, 2.0)),
        ({"step_cost": [0.5, 0.25]}, 0, 10, (0.0, 1.5)),
        ({"floor": 3.0}, 1, 10, (0.0, 3.0)),  # 0.2 * 10 is below the floor
        ({"floor": 3.0}, 1, 20, (0.0, 4.0)),  # above it
        ({"floor": [0.0, 3.0], "step_cost": 0.5}, 1, 10, (0.0, 3.5)),  # floor, then step cost
        ({"floor": [0.0, 3.0], "step_cost": 0.5, "load_cost": 0.01}, 0, 10, (0.1, 1.5)),
    ],
)
def test_delay_is_load_then_the_larger_of_floor_and_samples_plus_the_step_cost(
    options, rank, batch_size, expected
):
    throttle = Throttle([0.1, 0.2], **options)
    assert throttle.delay_s(rank, 0, batch_size) == pytest.approx(expected)


def test_floor_step_and_load_costs_apply_before_the_first_schedule_entry():
    throttle = Throttle({3: [0.1]}, load_cost=0.01, step_cost=0.5, floor=1.0)
    assert throttle.delay_s(0, 0, 10) == pytest.approx((0.1, 1.5))
    assert throttle.delay_s(0, 3, 20) == pytest.approx((0.2, 2.5))


def test_new_options_keep_the_positional_arguments():
    throttle = Throttle({0: [0.0], 7: [0.05]}, "step", load_cost=0.01)
    assert throttle.unit == "step"
    assert throttle.delay_s(0, 7, 10) == pytest.approx((0.1, 0.5))
    assert Throttle([0.1]).delay_s(0, 0, 10) == pytest.approx((0.0, 1.0))  # no extra cost


@pytest.mark.parametrize(
    ("options", "match"),
    [
        ({"load_cost": -0.1}, r"`load_cost` must be a number >= 0 .* got -0.1"),
        ({"load_cost": "0.1"}, r"`load_cost` must be .* got '0.1'"),
        ({"load_cost": []}, r"`load_cost` must be .* got \[\]"),
        ({"step_cost": [0.1, -0.1]}, r"`step_cost` must be .*one per rank.* got \[0.1, -0.1\]"),
        ({"step_cost": float("nan")}, "`step_cost` must be"),
        ({"floor": True}, "`floor` must be .* got True"),
        ({"floor": [0.1, None]}, "`floor` must be"),
        ({"noise": -0.5}, r"`noise` must be a number >= 0 \(a relative standard .* got -0.5"),
        ({"noise": [0.1, 0.1]}, r"`noise` must be .* got \[0.1, 0.1\]"),
        ({"seed": 1.5}, "`seed` must be an int, got 1.5"),
        ({"load_cost": [0.1, 0.1, 0.1]}, "`load_cost` has 3 entries but `sample_cost` has 2"),
        ({"floor": [0.1]}, "`floor` has 1 entries but `sample_cost` has 2"),
    ],
    ids=str,
)
def test_bad_options_are_refused_saying_what_was_expected(options, match):
    with pytest.raises(ValueError, match=match):
        Throttle([0.1, 0.2], **options)


@pytest.mark.parametrize(
    "options", [{}, {"load_cost": [0.1, 0.2]}, {"step_cost": [0.0, 0.1], "floor": [1.0, 1.0]}]
)
def test_setup_refuses_a_run_of_another_width(options):
    throttle = Throttle([0.1, 0.2], **options)
    throttle.setup(_trainer(world_size=2), None, "fit")
    with pytest.raises(ValueError, match="for 2 ranks but the run has 3"):
        throttle.setup(_trainer(world_size=3), None, "fit")


def test_numbers_fit_any_width():
    Throttle([0.1, 0.2, 0.3], load_cost=0.1, step_cost=0.1, floor=0.1).setup(
        _trainer(world_size=3), None, "fit"
    )


def test_loading_sleeps_before_the_forward_and_compute_before_backward(monkeypatch):
    slept = _record_sleeps(monkeypatch)
    throttle = Throttle([0.1, 0.2], load_cost=[0.01, 0.03], step_cost=0.5, floor=[0.0, 3.0])
    per_hook = _step_sleeps(throttle, _trainer(rank=1), 10, slept)
    assert per_hook["on_train_batch_start"] == [pytest.approx(0.3)]
    assert per_hook["on_before_backward"] == [pytest.approx(3.5)]


def test_no_cost_means_no_sleep(monkeypatch):
    slept = _record_sleeps(monkeypatch)
    per_hook = _step_sleeps(Throttle([0.0, 0.0]), _trainer(), 10, slept)
    assert per_hook == {"on_train_batch_start": [], "on_before_backward": []}


def test_emulate_step_sleeps_the_whole_step(monkeypatch):
    slept = _record_sleeps(monkeypatch)
    throttle = Throttle([0.1, 0.2], load_cost=0.01, step_cost=[0.5, 0.25], floor=[3.0, 0.0])
    throttle.emulate_step(_trainer(rank=0), torch.zeros(10, 3))
    assert sum(slept) == pytest.approx(0.1 + 3.0 + 0.5)
    slept.clear()
    throttle.emulate_step(_trainer(rank=1), torch.zeros(10, 3))
    assert sum(slept) == pytest.approx(0.1 + 2.0 + 0.25)


def test_noise_is_seeded_by_seed_and_rank():
    def factors(seed, rank, n=5):
        throttle = Throttle([0.1, 0.2], noise=0.2, seed=seed)
        return [throttle.noise_factor(rank) for _ in range(n)]

    assert factors(0, 0) == factors(0, 0)
    assert factors(0, 0) != factors(0, 1)
    assert factors(0, 0) != factors(1, 0)
    assert len(set(factors(0, 0))) == 5


def test_noise_has_mean_one_and_the_relative_spread_asked_for():
    throttle = Throttle([0.1], noise=0.1, seed=3)
    draws = [throttle.noise_factor(0) for _ in range(4000)]
    mean = sum(draws) / len(draws)
    sd = (sum((d - mean) ** 2 for d in draws) / len(draws)) ** 0.5
    assert mean == pytest.approx(1.0, abs=0.01)
    assert sd == pytest.approx(0.1, rel=0.1)


def test_noise_factors_never_fall_below_five_percent():
    throttle = Throttle([0.1], noise=5.0)
    draws = [throttle.noise_factor(0) for _ in range(500)]
    assert min(draws) == 0.05
    assert Throttle([0.1]).noise_factor(0) == 1.0  # no noise: exactly the delay


def test_every_delay_gets_its_own_noise_factor(monkeypatch):
    slept = _record_sleeps(monkeypatch)
    throttle = Throttle([0.1, 0.2], load_cost=0.01, noise=0.2, seed=7)
    per_hook = _step_sleeps(throttle, _trainer(rank=1), 10, slept)
    twin = Throttle([0.1, 0.2], noise=0.2, seed=7)
    first, second = twin.noise_factor(1), twin.noise_factor(1)
    assert per_hook["on_train_batch_start"] == [pytest.approx(0.1 * first)]
    assert per_hook["on_before_backward"] == [pytest.approx(2.0 * second)]


def _graph_batches(samples):
    """Graph-like batches (a PyG ``Batch`` keeps ``edge_index``, 2 x edges, before its node
    features): Lightning's ``extract_batch_size`` reads 2 from each."""
    from torch.utils.data import DataLoader

    def collate(rows):
        x = torch.stack(rows)
        return {"edge_index": torch.zeros(2, 3 * len(rows), dtype=torch.long), "x": x}

    return DataLoader(list(torch.randn(samples, 32)), batch_size=8, collate_fn=collate)


def test_the_delay_counts_the_samples_the_plan_gives_the_rank(monkeypatch, tmp_path):
    import lightning.pytorch as pl
    from lightning.pytorch.demos.boring_classes import BoringModel
    from lightning.pytorch.utilities.data import extract_batch_size

    from lightning_hetero import HeteroStrategy

    class Graphs(BoringModel):
        def training_step(self, batch, batch_idx):
            return super().training_step(batch["x"], batch_idx)

        def train_dataloader(self):
            return _graph_batches(20)  # steps of 8, 8 and the last 4

    sizes = []
    delays = []
    real_delay = Throttle.delay_s

    def delay_s(self, rank, when, batch_size):
        sizes.append(batch_size)
        return real_delay(self, rank, when, batch_size)

    monkeypatch.setattr(Throttle, "delay_s", delay_s)
    monkeypatch.setattr(Throttle, "_sleep", staticmethod(delays.append))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=HeteroStrategy(),
        callbacks=[Throttle([0.001])],
        max_epochs=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    batch = next(iter(_graph_batches(8)))
    assert extract_batch_size(batch) == 2  # what the throttle used to count
    trainer.fit(Graphs())
    assert sizes == [8, 8, 8, 8, 4, 4]  # (load, compute) per step
    assert sum(delays) == pytest.approx(0.001 * 20)


def test_emulate_step_counts_the_samples_it_is_given(monkeypatch):
    slept = _record_sleeps(monkeypatch)
    batch = next(iter(_graph_batches(8)))
    Throttle([0.1]).emulate_step(_trainer(world_size=1), batch, samples=8)
    assert sum(slept) == pytest.approx(0.8)
    slept.clear()
    Throttle([0.1]).emulate_step(_trainer(world_size=1), torch.zeros(5, 3))  # from the batch
    assert sum(slept) == pytest.approx(0.5)


def test_each_micro_batch_backward_costs_its_own_samples_and_the_fixed_cost(monkeypatch):
    # the hetero strategy runs a step of 10 samples as micro-batches of 4, 3 and 3: each
    # backward is charged its micro-batch's samples plus step_cost, loading once per step
    throttle = Throttle([0.01], load_cost=0.001, step_cost=0.002)
    slept = _record_sleeps(monkeypatch)
    # read from the strategy's typed attribute (HeteroStrategy), not by name from any object
    trainer = SimpleNamespace(global_rank=0, current_epoch=0, global_step=0, strategy=None)
    trainer.strategy = HeteroStrategy()
    throttle.on_train_batch_start(trainer, None, torch.zeros(10, 3), 0)
    for samples in (4, 3, 3):
        trainer.strategy.micro_batch_samples = samples
        throttle.on_before_backward(trainer, None, None)
    assert slept == pytest.approx([0.01, 0.042, 0.032, 0.032])
    trainer.strategy.micro_batch_samples = None  # a step run whole: its batch
    throttle.on_before_backward(trainer, None, None)
    assert slept[-1] == pytest.approx(0.102)
    trainer.strategy = SimpleNamespace(micro_batch_samples=4)  # another strategy's: not read
    throttle.on_before_backward(trainer, None, None)
    assert slept[-1] == pytest.approx(0.102)


def test_stalls_are_seeded_by_seed_rank_and_step_alone():
    def pattern(seed, rank, throttle=None):
        throttle = throttle or Throttle([0.1, 0.2], stalls=(0.3, 0.2), seed=seed)
        return [throttle.stall_s(rank, step) for step in range(200)]

    assert pattern(0, 0) == pattern(0, 0)
    assert pattern(0, 0) != pattern(0, 1)
    assert pattern(0, 0) != pattern(1, 0)
    assert set(pattern(0, 0)) == {0.0, 0.2}
    # noise draws in between change nothing: the step is looked up, not the next draw
    noisy = Throttle([0.1, 0.2], noise=0.3, stalls=(0.3, 0.2))
    for _ in range(7):
        noisy.noise_factor(0)
    assert pattern(0, 0, noisy) == pattern(0, 0)


@pytest.mark.parametrize("probability", [0.05, 0.15, 0.5])
def test_the_fraction_of_stalled_steps_is_the_probability(probability):
    throttle = Throttle([0.1], stalls=(probability, 0.2), seed=4)
    stalled = [throttle.stall_s(0, step) for step in range(4000)]
    assert sum(s > 0 for s in stalled) / len(stalled) == pytest.approx(probability, abs=0.02)
    assert set(stalled) == {0.0, 0.2}


def test_stalls_per_rank():
    throttle = Throttle([0.1, 0.2], stalls=[(0.0, 0.5), (1.0, 0.25)])
    assert {throttle.stall_s(0, step) for step in range(50)} == {0.0}
    assert {throttle.stall_s(1, step) for step in range(50)} == {0.25}
    assert Throttle([0.1]).stall_s(0, 3) == 0.0  # none by default
    assert Throttle([0.1], stalls=[0.5, 0.0]).stall_s(0, 3) == 0.0  # zero seconds: no draw


def test_a_stall_is_slept_once_per_optimizer_step_in_the_compute_delay(monkeypatch):
    slept = _record_sleeps(monkeypatch)
    throttle = Throttle([0.1, 0.2], load_cost=0.01, stalls=[(0.0, 0.0), (1.0, 0.25)])
    per_hook = _step_sleeps(throttle, _trainer(rank=1, step=3), 10, slept)
    assert per_hook["on_train_batch_start"] == [pytest.approx(0.1)]  # loading: no stall
    assert per_hook["on_before_backward"] == [pytest.approx(2.0 + 0.25)]
    # a second backward of the step (a micro-batch) and a second batch of the same
    # global_step (gradient accumulation) do not stall again
    throttle.on_before_backward(_trainer(rank=1, step=3), None, None)
    assert slept[-1] == pytest.approx(2.0)
    again = _step_sleeps(throttle, _trainer(rank=1, step=3), 10, slept)
    assert again["on_before_backward"] == [pytest.approx(2.0)]
    nxt = _step_sleeps(throttle, _trainer(rank=1, step=4), 10, slept)
    assert nxt["on_before_backward"] == [pytest.approx(2.25)]


def test_the_stalled_steps_are_those_stall_s_draws(monkeypatch):
    slept = _record_sleeps(monkeypatch)
    throttle = Throttle([0.0, 0.0], stalls=(0.3, 0.2), seed=2)
    per_step = [
        sum(_step_sleeps(throttle, _trainer(rank=1, step=step), 10, slept)["on_before_backward"])
        for step in range(60)
    ]
    assert per_step == [throttle.stall_s(1, step) for step in range(60)]
    assert 0 < sum(s > 0 for s in per_step) < 60
    stalled = per_step.index(0.2)
    before = len(slept)
    throttle.emulate_step(_trainer(rank=1, step=stalled), torch.zeros(5, 3))  # probes: none
    assert slept[before:] == []


@pytest.mark.parametrize(
    ("stalls", "match"),
    [
        ((1.5, 0.2), r"`stalls` must be a pair \(probability in \[0, 1\], seconds >= 0\)"),
        ((0.1, -0.2), r"`stalls` must be .* got \(0.1, -0.2\)"),
        ((0.1,), r"`stalls` must be .* got \(0.1,\)"),
        (0.1, "`stalls` must be .* got 0.1"),
        ([], r"`stalls` must be .* got \[\]"),
        ([(0.1, 0.2), (0.1, float("nan"))], "`stalls` must be"),
        ("0.1,0.2", "`stalls` must be"),
        ([(0.1, 0.2)] * 3, "`stalls` has 3 entries but `sample_cost` has 2"),
    ],
    ids=str,
)
def test_bad_stalls_are_refused_saying_what_was_expected(stalls, match):
    with pytest.raises(ValueError, match=match):
        Throttle([0.1, 0.2], stalls=stalls)
