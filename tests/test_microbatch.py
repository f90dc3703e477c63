"""Micro-batch sizes, batch cutting and the option's checks (no process group)."""

import re
from unittest import mock

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import GradientAccumulationScheduler, TQDMProgressBar
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.strategies import Strategy

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy
from lightning_hetero.microbatch import (
    FirstSamples,
    MicroBatches,
    converted_accumulation,
    ddp_loader_batches,
    limited_batches,
    local_metric_syncs,
    micro_bounds,
    micro_sizes,
    note_collective_in_micro_batch,
    own_collectives,
    refused_collectives,
    split_batch,
    step_loss,
    validates_after,
)
from lightning_hetero.sampler import EpochPermutation, GlobalBatchSampler


@pytest.fixture(autouse=True)
def _take_over_in_one_process(monkeypatch):
    """The accumulation take-over's machinery, tested in one process (by default one rank
    runs Lightning's accumulation as it is: see ``test_one_rank_runs_lightnings_accumulation``)."""
    monkeypatch.setattr(MicroBatches, "takes_over_one_rank", True)


@pytest.mark.parametrize(
    ("samples", "bound", "expected"),
    [(10, 4, [4, 3, 3]), (8, 1, [1] * 8), (3, 4, [3]), (8, 4, [4, 4]), (9, 2, [2, 2, 2, 2, 1])],
)
def test_micro_sizes_are_ceil_b_over_m_parts_of_at_most_m_that_sum_to_b(samples, bound, expected):
    sizes = micro_sizes(samples, bound)
    assert sizes == expected
    assert len(sizes) == -(-samples // bound) and max(sizes) <= bound and sum(sizes) == samples


def test_a_batch_is_cut_along_its_samples_and_other_values_go_to_every_part():
    x, y = torch.arange(20.0).reshape(10, 2), torch.arange(10)
    batch = {"x": x, "y": y, "names": [f"s{i}" for i in range(10)], "scale": torch.tensor(2.0)}
    parts = split_batch(batch, 10, [4, 3, 3])
    assert [len(p["x"]) for p in parts] == [4, 3, 3]
    torch.testing.assert_close(torch.cat([p["x"] for p in parts]), x)
    torch.testing.assert_close(torch.cat([p["y"] for p in parts]), y)
    assert [n for p in parts for n in p["names"]] == batch["names"]
    assert all(p["scale"] is batch["scale"] for p in parts)
    first, second = split_batch([x, y], 10, [5, 5])  # a list batch (TensorDataset)
    torch.testing.assert_close(second[0], x[5:])


def test_a_batch_without_a_tensor_of_its_samples_is_refused_by_name():
    with pytest.raises(ValueError, match="micro_batch_size.*none of its tensors has 6 rows"):
        split_batch([torch.zeros(5, 2)], 6, [3, 3])


def test_the_loss_is_read_as_lightning_reads_it():
    loss = torch.tensor(1.0)
    assert step_loss(loss) is loss and step_loss({"loss": loss, "x": 1}) is loss
    with pytest.raises(ValueError, match="must return the loss"):
        step_loss(None)


@pytest.mark.parametrize("value", [0, -1, 2.5, True, "big", [], [2, 0], [2, "a"], (1.5,), {"a": 1}])
def test_bad_micro_batch_sizes_are_refused_at_construction_naming_the_option(value):
    with pytest.raises(ValueError, match="`micro_batch_size` must be"):
        HeteroStrategy(micro_batch_size=value)


@pytest.mark.parametrize("value", [None, 4, [2, 8], "auto"])
def test_good_micro_batch_sizes_are_kept_as_given(value):
    assert HeteroStrategy(micro_batch_size=value).micro_batch_size == value


def test_a_list_with_the_wrong_number_of_ranks_is_refused_with_the_count():
    assert micro_bounds(3, 2) == [3, 3] and micro_bounds([1, 4], 2) == [1, 4]
    with pytest.raises(ValueError, match="`micro_batch_size` has 3 entries but there are 2"):
        micro_bounds([1, 2, 3], 2)


@pytest.mark.parametrize("mode", ["async", "local"])
def test_modes_without_micro_batches_refuse_the_option(mode):
    with pytest.raises(ValueError, match=f"`micro_batch_size` runs under.*mode='{mode}'"):
        HeteroStrategy(mode=mode, micro_batch_size=4)


@pytest.mark.parametrize(("given", "expected"), [("[2, 8]", [2, 8]), ("4", 4), ("auto", "auto")])
def test_the_option_from_lightning_cli(given, expected):
    from tests.test_strategy import _cli

    cli = _cli(
        [
            "--trainer.strategy=lightning_hetero.HeteroStrategy",
            f"--trainer.strategy.micro_batch_size={given}",
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
        ]
    )
    assert cli.trainer.strategy.micro_batch_size == expected


def test_the_option_from_yaml(tmp_path):
    from tests.test_strategy import _cli

    config = tmp_path / "config.yaml"
    config.write_text(
        "trainer:\n"
        "  accelerator: cpu\n"
        "  devices: 2\n"
        "  strategy:\n"
        "    class_path: lightning_hetero.HeteroStrategy\n"
        "    init_args:\n"
        "      global_batch_size: 32\n"
        "      micro_batch_size: [4, 2]\n"
    )
    strategy = _cli([f"--config={config}"]).trainer.strategy
    assert strategy.micro_batch_size == [4, 2]


class _Manual(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.automatic_optimization = False


@pytest.mark.parametrize(
    ("strategy_class", "model", "trainer_options", "message"),
    [
        (HeteroStrategy, _Manual, {}, "_Manual uses manual optimization"),
        (
            HeteroStrategy,
            BoringModel,
            {"accumulate_grad_batches": 4},
            r"micro_batch_size=2.*`accumulate_grad_batches=4` would accumulate.*"
            r"global_batch_size=<samples per optimizer step>.*micro_batch_size=",
        ),
        # failure 3: accumulation that changes by epoch, beside micro-batches
        (
            HeteroStrategy,
            BoringModel,
            {"callbacks": [GradientAccumulationScheduler({0: 2})]},
            r"micro_batch_size=2\).*`GradientAccumulationScheduler` would accumulate.*by epoch",
        ),
        (
            HeteroFSDPStrategy,
            BoringModel,
            {"callbacks": [GradientAccumulationScheduler({0: 2})]},
            r"HeteroFSDPStrategy\(micro_batch_size=2\).*`GradientAccumulationScheduler`",
        ),
        # FSDP2 does not take Lightning's accumulation over: both together are refused
        (
            HeteroFSDPStrategy,
            BoringModel,
            {"accumulate_grad_batches": 4},
            r"HeteroFSDPStrategy\(micro_batch_size=2\).*`accumulate_grad_batches=4` would"
            r" accumulate.*global_batch_size=<samples per optimizer step>",
        ),
    ],
)
def test_what_micro_batches_cannot_run_exactly_is_refused_at_set_up(
    tmp_path, strategy_class, model, trainer_options, message
):
    trainer = pl.Trainer(
        strategy=strategy_class(micro_batch_size=2),
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
        **trainer_options,
    )
    with pytest.raises(ValueError, match=message):
        trainer.fit(model())


class _Sizes(BoringModel):
    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(len(batch))
        return super().training_step(batch, batch_idx)


def test_auto_takes_each_ranks_micro_batch_bound_from_the_memory_probe(tmp_path, monkeypatch):
    from lightning_hetero import _probes

    found = {"max_batch_sizes": [3], "fixed_bytes": [0.0], "per_sample_bytes": [1.0]}
    monkeypatch.setattr(_probes.StepProbe, "memory", lambda self, total, sizes, safety, **_: found)
    strategy = HeteroStrategy(micro_batch_size="auto", controller="static")
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_steps=2,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        default_root_dir=tmp_path,
    )
    model = _Sizes()
    model.train_dataloader = lambda: torch.utils.data.DataLoader(torch.randn(64, 32), batch_size=8)
    trainer.fit(model)
    assert strategy.micro_bounds == [3]
    # memory bounds the micro-batch, never the share: the batch stays 8, run as 3 + 3 + 2
    assert strategy.batch_sizes == [8] and strategy.plan_state.measured_max is None
    assert model.seen == [3, 3, 2] * 2


@pytest.mark.parametrize(
    ("options", "named"),
    [
        ({"micro_batch_size": 2}, "micro_batch_size=2"),
        ({"global_batch_size": 32}, "global_batch_size=32"),
        ({"batch_sizes": [3, 5]}, "batch_sizes=[3, 5]"),
    ],
)
def test_accumulation_is_taken_over_only_where_no_option_plans_the_step_already(options, named):
    given = {"micro_batch_size": None, "global_batch_size": None, "batch_sizes": "uniform"}
    assert converted_accumulation(4, **given) == 4
    assert converted_accumulation(1, **{**given, **options}) == 1
    message = rf"{re.escape(named)}.*global_batch_size=.*micro_batch_size="
    with pytest.raises(ValueError, match=message):
        converted_accumulation(4, **{**given, **options})


@pytest.mark.parametrize(
    ("samples", "bound", "lower", "expected"),
    [
        (5, 2, 2, [3, 2]),
        (5, 2, 1, [2, 2, 1]),
        (9, 2, 2, [3, 2, 2, 2]),
        (3, 2, 2, [3]),
        (2, 1, 2, [2]),
    ],
)
def test_no_micro_batch_is_below_the_models_minimum(samples, bound, lower, expected):
    """Failure 4: a BatchNorm model (minimum 2) never gets a micro-batch of one; where the
    bound and the minimum cannot both hold, a micro-batch takes at most lower - 1 more."""
    sizes = micro_sizes(samples, bound, lower)
    assert sizes == expected and sum(sizes) == samples and min(sizes) >= min(lower, samples)
    assert max(sizes) <= bound + lower - 1


def test_ddps_validation_steps_under_accumulation():
    """DDP validates after loader batch c at its optimizer step c // N (the epoch's last
    batch: the epoch's last step, a partial window included); issue 40's example: 10 loader
    batches, N = 2, val_check_interval=0.5 validates at steps 2 and 5 of each epoch."""
    assert [s for s in range(1, 6) if validates_after(s, 10, 2, 5)] == [2, 5]
    assert [s for s in range(1, 4) if validates_after(s, 5, 2, 3)] == [1]
    assert [s for s in range(1, 7) if validates_after(s, 24, 4, 6)] == [1, 3, 4, 6]
    assert not validates_after(1, 10, 4, 2, offset=0) or validates_after(1, 10, 4, 2)
    # counted across epochs (check_val_every_n_epoch=None): the second epoch's batches 4, 8
    assert [s for s in range(1, 6) if validates_after(s, 10, 2, 7, offset=10)] == [2]
    assert ddp_loader_batches(41, 2, 2, drop_last=False) == 11
    assert ddp_loader_batches(41, 2, 2, drop_last=True) == 10
    assert (limited_batches(24, 10), limited_batches(24, 0.5), limited_batches(24, 1.0)) == (
        10,
        12,
        24,
    )
    cut = FirstSamples(EpochPermutation(10, shuffle=True, seed=1), 4)
    cut.set_epoch(3)
    whole = EpochPermutation(10, shuffle=True, seed=1)
    whole.set_epoch(3)
    assert len(cut) == 4 and cut.permutation() == whole.permutation()[:4]


class _Recorded(BoringModel):
    """Records each training step's samples and the steps the loop counted."""

    def __init__(self) -> None:
        super().__init__()
        self.seen: list[int] = []
        self.sums: list[torch.Tensor] = []
        self.stepped: list[int] = []
        self.validated: list[int] = []

    def training_step(self, batch, batch_idx):
        self.seen.append(len(batch))
        self.sums.append(batch.detach().sum())
        return super().training_step(batch, batch_idx)

    def on_train_batch_end(self, outputs, batch, batch_idx):
        self.stepped.append(self.trainer.global_step)

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self.validated.append(self.trainer.global_step)

    def configure_optimizers(self):
        optimizer = torch.optim.SGD(self.layer.parameters(), lr=0.1)
        scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.5)
        return [optimizer], [{"scheduler": scheduler, "interval": "step"}]

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(3)
        data = torch.randn(96, 32, generator=generator)
        return torch.utils.data.DataLoader(data, batch_size=4, shuffle=False)


def _accumulating_fit(tmp_path, strategy, ckpt_path=None, model=None, **options):
    torch.manual_seed(0)
    model = (model or _Recorded)()
    settings = {
        "logger": False,
        "enable_checkpointing": False,
        "enable_model_summary": False,
        "enable_progress_bar": False,
        "num_sanity_val_steps": 0,
        **options,
    }
    settings.setdefault("accumulate_grad_batches", 4)
    trainer = pl.Trainer(
        strategy=strategy, accelerator="cpu", devices=1, default_root_dir=tmp_path, **settings
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    return trainer, model


def test_accumulation_runs_as_one_global_batch_and_steps_as_lightnings_accumulation(tmp_path):
    options = {"max_steps": 5, "val_check_interval": 8, "limit_val_batches": 1}
    plain, expected = _accumulating_fit(tmp_path / "plain", "auto", **options)
    strategy = HeteroStrategy(controller="static", shuffle=False)  # the loader's order
    trainer, got = _accumulating_fit(tmp_path / "hetero", strategy, **options)
    # one global batch of loader batch x 4 x 1 rank per optimizer step, in micro-batches of 4
    assert strategy.batch_sizes == [16] and strategy.micro_bounds == [4]
    assert got.seen == expected.seen == [4] * 20
    assert trainer.global_step == plain.global_step == 5
    assert got.stepped == [1, 2, 3, 4, 5]  # one loop batch per optimizer step
    # Lightning's 1/4 per accumulated batch and the strategy's samples / B are the same step,
    # and the scheduler stepped once per optimizer step in both
    for mine, theirs in zip(got.parameters(), expected.parameters()):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)
    assert trainer.lr_scheduler_configs[0].scheduler.get_last_lr() == pytest.approx([0.1 / 32])
    # validation every 8 loader batches = every 2 optimizer steps, as the user asked
    assert got.validated == expected.validated == [2, 4]
    # the user's Trainer settings are back once the fit ended
    assert (trainer.accumulate_grad_batches, trainer.val_check_interval) == (4, 8)


class _Iterable(_Recorded):
    def train_dataloader(self):
        from lightning.pytorch.demos.boring_classes import RandomIterableDataset

        return torch.utils.data.DataLoader(RandomIterableDataset(32, 24), batch_size=4)


@pytest.mark.parametrize("model", [_Recorded, _Iterable])
def test_one_rank_runs_lightnings_accumulation_as_it_is(tmp_path, monkeypatch, model):
    """At world size 1 there are no shares to balance: Lightning's own accumulation runs (its
    ``batch_idx``, loop counts and ``accumulate_grad_batches`` are DDP's), and an
    IterableDataset trains as it is."""
    monkeypatch.setattr(MicroBatches, "takes_over_one_rank", False)
    seen = {}
    for name, strategy in (("plain", "auto"), ("hetero", HeteroStrategy(shuffle=False))):
        options = {"max_epochs": 1, "limit_val_batches": 0}
        trainer, got = _accumulating_fit(tmp_path / name, strategy, model=model, **options)
        seen[name] = (got.seen, got.stepped, trainer.num_training_batches)
        assert trainer.accumulate_grad_batches == 4
    assert seen["hetero"] == seen["plain"]
    if model is _Recorded:  # 24 loader batches, an optimizer step every 4
        assert seen["hetero"][1] == [(i + 1) // 4 for i in range(24)]


def test_strategy_backward_stays_lightnings_and_runs_once_per_micro_batch(tmp_path):
    """Programs and Lightning's own tests wrap or count ``Strategy.backward`` (a mock with
    ``wraps=trainer.strategy.backward``): the strategy keeps Lightning's and does its work in
    the precision plugin's backward, so such a wrapper sees one call per micro-batch, as
    under Lightning's accumulation, and nothing recurses."""
    from lightning_hetero.engine import HeteroEngine

    assert "backward" not in vars(HeteroEngine) and HeteroStrategy.backward is Strategy.backward
    lightnings = Strategy.backward
    with mock.patch.object(Strategy, "backward", autospec=True, side_effect=lightnings) as seen:
        options = {"max_steps": 5, "limit_val_batches": 0}
        plain, expected = _accumulating_fit(tmp_path / "plain", "auto", **options)
        plain_calls = seen.call_count
        strategy = HeteroStrategy(controller="static", shuffle=False)
        trainer, got = _accumulating_fit(tmp_path / "hetero", strategy, **options)
    assert plain_calls == seen.call_count - plain_calls == 20  # 5 steps x 4 micro-batches
    for mine, theirs in zip(got.parameters(), expected.parameters()):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)
    assert "backward" not in vars(trainer.precision_plugin)  # the shadow is gone after fit


class _FailsAfterBackward(_Recorded):
    def on_after_backward(self) -> None:
        raise RuntimeError("the user's hook failed")


def test_a_backward_hook_that_fails_mid_step_leaves_no_micro_batch_state(tmp_path):
    """An error in Lightning's backward hooks (which run inside the strategy's backward, not
    the precision plugin's that the strategy shadows) ends the fit with the micro-batched step
    closed."""
    strategy = HeteroStrategy(controller="static", shuffle=False)
    with pytest.raises(RuntimeError, match="the user's hook failed"):
        _accumulating_fit(tmp_path, strategy, model=_FailsAfterBackward, max_steps=2)
    assert strategy.micro_batch_samples is None and strategy.micro.local is False


@pytest.mark.parametrize("hook", ["on_before_backward", "on_after_backward"])
def test_a_collective_in_a_backward_hook_before_the_last_micro_batch_is_refused(tmp_path, hook):
    """The backward hooks run once per micro-batch, like ``training_step``: a collective of
    the user's there, before the rank's last micro-batch, is refused, naming it."""

    class Model(_Recorded):
        pass

    setattr(Model, hook, lambda self, *args: torch.distributed.all_reduce(torch.ones(1)))
    strategy = HeteroStrategy(controller="static", shuffle=False)
    with pytest.raises(RuntimeError, match="`torch.distributed.all_reduce` was called inside a"):
        # two micro-batches: the hook of the first (before the last) is the one refused
        _accumulating_fit(tmp_path, strategy, model=Model, max_steps=1, accumulate_grad_batches=2)


class _NormedRecorded(_Recorded):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Sequential(torch.nn.BatchNorm1d(32), torch.nn.Linear(32, 2))


class _NormedCounted(_NormedRecorded):
    """Records the loop counts each epoch starts with, as a callback would read them."""

    def __init__(self) -> None:
        super().__init__()
        self.counts: list[tuple[int, int]] = []

    def on_train_epoch_start(self) -> None:
        trainer = self.trainer
        self.counts.append((trainer.accumulate_grad_batches, trainer.num_training_batches))


def test_stochastic_weight_averaging_keeps_lightnings_accumulation_and_batch_norm_epoch(
    tmp_path,
):
    """SWA's last epoch only recomputes the batch-norm statistics: it sets the loop's batch
    count and accumulation itself, from the Trainer's, and puts back at train end what it saw.
    Beside it accumulation is not taken over, so the loop reads as under Lightning's own
    accumulation all along, that epoch runs no backward, and the weights are Lightning's."""
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    models, trainers = {}, {}
    for name, strategy in (("plain", "auto"), ("hetero", HeteroStrategy(shuffle=False))):
        swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)
        options = {"max_epochs": 2, "limit_val_batches": 0, "callbacks": [swa]}
        trainers[name], models[name] = _accumulating_fit(
            tmp_path / name, strategy, model=_NormedCounted, **options
        )
    hetero, plain = models["hetero"], models["plain"]
    assert hetero.seen == plain.seen == [4] * 72  # 24 loader batches x 3 epochs, the last SWA's
    # SWA's epoch: one batch more than the loader's 24, all accumulated (no optimizer step)
    assert hetero.counts == plain.counts == [(4, 24), (4, 24), (25, 25)]
    assert hetero.stepped == plain.stepped
    assert trainers["hetero"].accumulate_grad_batches == 4  # what SWA put back
    assert trainers["hetero"].num_training_batches == 24
    for mine, theirs in zip(hetero.state_dict().values(), plain.state_dict().values()):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


class _NormedWhole(_NormedRecorded):
    """``_NormedRecorded``'s data in loader batches of 16 (4 of Lightning's accumulated 4)."""

    def train_dataloader(self):
        return torch.utils.data.DataLoader(super().train_dataloader().dataset, batch_size=16)


def test_stochastic_weight_averagings_batch_norm_epoch_runs_no_backward_in_any_micro_batch(
    tmp_path,
):
    """With ``micro_batch_size``, SWA's batch-norm epoch (Lightning skips the backward) runs
    every micro-batch's forward and none of their backwards, so no gradient moves the
    averaged weights: the same weights and statistics as Lightning accumulating the same
    batches of 4."""
    from lightning.pytorch.callbacks import StochasticWeightAveraging

    models = {}
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)
    options = {"max_epochs": 2, "limit_val_batches": 0, "callbacks": [swa]}
    _, models["plain"] = _accumulating_fit(
        tmp_path / "plain", "auto", model=_NormedRecorded, **options
    )
    strategy = HeteroStrategy(micro_batch_size=4, shuffle=False)
    swa = StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1)
    options = {**options, "callbacks": [swa], "accumulate_grad_batches": 1}
    _, models["hetero"] = _accumulating_fit(
        tmp_path / "hetero", strategy, model=_NormedWhole, **options
    )
    assert models["hetero"].seen == models["plain"].seen == [4] * 72
    for mine, theirs in zip(
        models["hetero"].state_dict().values(), models["plain"].state_dict().values()
    ):
        torch.testing.assert_close(mine, theirs, atol=1e-5, rtol=0)


@pytest.mark.parametrize(
    "options",
    [
        {"val_check_interval": 6},  # validates inside an accumulation window
        {"val_check_interval": 0.3},
        {"val_check_interval": 0.5},
        {"limit_train_batches": 10, "val_check_interval": 5},  # a last, partial window
        {"limit_train_batches": 0.25},
        {"check_val_every_n_epoch": None, "val_check_interval": 10, "max_epochs": 2},
    ],
)
def test_loader_batch_counts_run_as_lightnings_accumulation(tmp_path, options):
    """Failures 2 and 7: with accumulation taken over (1 rank, 24 loader batches, N = 4),
    the Trainer's counts of loader batches that N does not divide run as Lightning runs them
    (a last, partial window; validation inside a window at the steps made so far), and
    validation falls at Lightning's global steps, the epoch's last step included."""
    options = {"max_epochs": 1, "limit_val_batches": 1, **options}
    plain, expected = _accumulating_fit(tmp_path / "plain", "auto", **options)
    strategy = HeteroStrategy(controller="static", shuffle=False)
    trainer, got = _accumulating_fit(tmp_path / "hetero", strategy, **options)
    assert got.validated == expected.validated and got.validated
    assert trainer.global_step == plain.global_step
    # the same samples, in the same order
    torch.testing.assert_close(sum(got.sums), sum(expected.sums))
    assert sum(got.seen) == sum(expected.seen)
    # the same steps, a last partial window included (its losses over the full window's N)
    for mine, theirs in zip(got.parameters(), expected.parameters()):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)
    assert (trainer.val_check_interval, trainer.limit_train_batches) == (
        plain.val_check_interval,
        plain.limit_train_batches,
    )


def test_a_gradient_accumulation_scheduler_beside_accumulation_meets_lightnings_refusal(
    tmp_path,
):
    scheduler = GradientAccumulationScheduler({0: 2})
    with pytest.raises(ValueError, match="`accumulate_grad_batches` and are using the `Gradient"):
        _accumulating_fit(tmp_path, HeteroStrategy(), max_steps=1, callbacks=[scheduler])


def test_a_run_resumed_inside_an_epoch_keeps_the_conversion_and_its_steps(tmp_path):
    from lightning.pytorch.callbacks import ModelCheckpoint

    # 96 samples, 16 per optimizer step: 6 steps an epoch; stop after 3, resume to 5
    _, expected = _accumulating_fit(tmp_path / "whole", HeteroStrategy(shuffle=False), max_steps=5)
    saving = ModelCheckpoint(dirpath=tmp_path / "ckpt", every_n_train_steps=3, save_top_k=-1)
    options = {"enable_checkpointing": True, "callbacks": [saving]}
    _accumulating_fit(tmp_path / "first", HeteroStrategy(shuffle=False), max_steps=3, **options)
    path = tmp_path / "ckpt" / "epoch=0-step=3.ckpt"
    strategy = HeteroStrategy(shuffle=False)
    resumed, model = _accumulating_fit(tmp_path / "resumed", strategy, path, max_steps=5)
    assert strategy.batch_sizes == [16] and strategy.micro_bounds == [4]
    assert resumed.global_step == 5 and model.stepped == [4, 5]
    # steps 4 and 5, each its four micro-batches: the epoch's samples 48 to 79, in order
    assert model.seen == [4] * 8 and len(model.sums) == 8
    data = model.train_dataloader().dataset
    expected_sums = [data[i : i + 4].sum() for i in range(48, 80, 4)]
    torch.testing.assert_close(torch.stack(model.sums), torch.stack(expected_sums))
    for mine, theirs in zip(model.parameters(), expected.parameters()):
        torch.testing.assert_close(mine, theirs, atol=1e-6, rtol=0)


class _Bar(TQDMProgressBar):
    """Records the bar's total at each epoch's start, and its position and metrics after each
    training batch."""

    def __init__(self) -> None:
        super().__init__()
        self.totals: list[int] = []
        self.shown: list[tuple[int, float]] = []
        self.outputs: list[float] = []  # the `loss` Lightning hands to the batch's end

    def on_train_epoch_start(self, trainer, *args):
        super().on_train_epoch_start(trainer, *args)
        self.totals.append(self.train_progress_bar.total)

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        super().on_train_batch_end(trainer, pl_module, outputs, batch, batch_idx)
        loss = self.get_metrics(trainer, pl_module)["loss"]
        self.shown.append((self.train_progress_bar.n, float(loss)))
        self.outputs.append(float(outputs["loss"]))


class _LogsLoss(_Recorded):
    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        self.log("loss", output["loss"], prog_bar=True)
        return output


def _bar_fit(tmp_path, strategy, batch_size=4, **options):
    torch.manual_seed(0)
    model, bar = _LogsLoss(), _Bar()
    model.train_dataloader = lambda: torch.utils.data.DataLoader(
        _Recorded().train_dataloader().dataset, batch_size=batch_size
    )
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        logger=False,
        callbacks=[bar],
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        default_root_dir=tmp_path,
        **options,
    )
    trainer.fit(model)
    return trainer, bar


@pytest.mark.parametrize(
    "options", [{"max_epochs": 2}, {"max_epochs": 1, "limit_train_batches": 9}]
)
def test_the_progress_bar_counts_loader_batches_under_the_accumulation_take_over(tmp_path, options):
    """Failure 2's bar: with accumulation 2 taken over, the bar's total and position are
    Lightning's loader batches (24 an epoch, or a limit of 9: a last, partial window), and its
    loss the one Lightning shows there (the window's last loader batch's)."""
    options = {"accumulate_grad_batches": 2, **options}
    _, plain = _bar_fit(tmp_path / "plain", "auto", **options)
    strategy = HeteroStrategy(controller="static", shuffle=False)
    trainer, got = _bar_fit(tmp_path / "hetero", strategy, **options)
    total = plain.totals[0]
    assert got.totals == plain.totals and total == options.get("limit_train_batches", 24)
    # shown at the end of each optimizer step: every second loader batch, and the last
    expected = [(n, loss) for n, loss in plain.shown if n % 2 == 0 or n == total]
    assert [n for n, _ in got.shown] == [n for n, _ in expected]
    torch.testing.assert_close([loss for _, loss in got.shown], [loss for _, loss in expected])
    # `outputs["loss"]`: the step's, the sum of what Lightning hands over the window's batches
    # (each batch's loss / 2)
    ends = [i for i, (n, _) in enumerate(plain.shown) if n % 2 == 0 or n == total]
    windows = [plain.outputs[start + 1 : end + 1] for start, end in zip([-1, *ends], ends)]
    windows = [sum(window) * 2 / len(window) for window in windows]  # a partial window: /1
    torch.testing.assert_close(got.outputs, windows)
    # the bar's own hooks are Lightning's again once the fit ended
    assert "on_train_batch_end" not in vars(trainer.progress_bar_callback)


def test_the_progress_bar_counts_loader_batches_under_micro_batch_size(tmp_path):
    """With ``micro_batch_size`` (no accumulation) a loader batch is a loop batch: the bar's
    total and positions are Lightning's."""
    _, plain = _bar_fit(tmp_path / "plain", "auto", batch_size=16, max_epochs=1)
    strategy = HeteroStrategy(controller="static", shuffle=False, micro_batch_size=4)
    _, got = _bar_fit(tmp_path / "hetero", strategy, batch_size=16, max_epochs=1)
    assert got.totals == plain.totals == [6]
    assert [n for n, _ in got.shown] == [n for n, _ in plain.shown] == list(range(1, 7))
    # the step's loss, `outputs["loss"]`: the whole batch's (its micro-batches' weighted by
    # their samples), not the first micro-batch's
    torch.testing.assert_close(got.outputs, plain.outputs)


class _Estimating(_Recorded):
    def configure_optimizers(self):
        self.estimated = self.trainer.estimated_stepping_batches  # loads the data early
        return super().configure_optimizers()


def test_the_estimated_optimizer_steps_are_lightnings_under_accumulation(tmp_path):
    def estimate(strategy):
        torch.manual_seed(0)
        model = _Estimating()
        trainer = pl.Trainer(
            strategy=strategy,
            accelerator="cpu",
            devices=1,
            accumulate_grad_batches=4,
            max_epochs=1,
            logger=False,
            enable_checkpointing=False,
            enable_model_summary=False,
            default_root_dir=tmp_path,
        )
        trainer.fit(model)
        return model.estimated, trainer.global_step

    # 96 samples, 4 per loader batch, 4 accumulated: 6 optimizer steps an epoch
    assert estimate("auto") == estimate(HeteroStrategy(shuffle=False)) == (6, 6)


class _SteppingEveryOther(_Recorded):
    """Lightning's documented pattern: the closure on every batch, a step every other."""

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        optimizer_closure()
        if batch_idx % 2:
            optimizer.step()
            optimizer.zero_grad()


def test_an_optimizer_step_that_runs_the_closure_without_stepping_trains_every_micro_batch(
    tmp_path,
):
    """Failure 3: a user ``optimizer_step`` that calls ``optimizer_closure()`` itself (and
    steps every other batch) still runs every micro-batch of each batch: none is dropped."""
    torch.manual_seed(0)
    model = _SteppingEveryOther()
    trainer = pl.Trainer(
        strategy=HeteroStrategy(micro_batch_size=2, controller="static", shuffle=False),
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    assert model.seen == [2] * 48  # 24 loader batches of 4, each as two micro-batches of 2
    torch.testing.assert_close(sum(model.sums), model.train_dataloader().dataset.sum())


def test_metrics_that_sync_on_step_compute_locally_before_the_ranks_last_micro_batch():
    """Failure 1: a torchmetrics metric with ``dist_sync_on_step`` syncs in each rank's last
    micro-batch only (one sync per optimizer step whatever the rank's count)."""
    import torchmetrics

    module = torch.nn.Module()
    module.synced = torchmetrics.MeanMetric(dist_sync_on_step=True)
    module.plain = torchmetrics.MeanMetric()
    with local_metric_syncs(module, local=True):
        assert not module.synced.dist_sync_on_step and not module.plain.dist_sync_on_step
    assert module.synced.dist_sync_on_step and not module.plain.dist_sync_on_step
    with local_metric_syncs(module, local=False):
        assert module.synced.dist_sync_on_step


def test_a_collectives_error_in_a_micro_batched_step_says_what_runs_per_micro_batch():
    error = RuntimeError("Gloo: is there a distributed collective mismatch?")
    note_collective_in_micro_batch(error)
    assert "once per micro-batch" not in str(error)  # a note, beside the message
    assert any("on_train_batch_end" in note for note in error.__notes__)
    other = ValueError("a user's own error")
    note_collective_in_micro_batch(other)
    assert not getattr(other, "__notes__", [])


class _OwnAllReduce(_Recorded):
    def training_step(self, batch, batch_idx):
        torch.distributed.all_reduce(torch.ones(1))  # once per micro-batch: unequal counts
        return super().training_step(batch, batch_idx)


def test_a_users_own_collective_in_a_micro_batch_is_refused_naming_it(tmp_path):
    """Failure 1: a collective of the user's own in ``training_step`` would run once per
    micro-batch (a different count on each rank: gloo aborts, NCCL hangs); it is refused in
    the first micro-batch that is not the rank's last, with a message that names it."""
    original = torch.distributed.all_reduce
    trainer = pl.Trainer(
        strategy=HeteroStrategy(micro_batch_size=2),  # loader batches of 4: [2, 2]
        accelerator="cpu",
        devices=1,
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    message = r"`torch.distributed.all_reduce` was called inside a micro-batch.*on_train_batch_end"
    with pytest.raises(RuntimeError, match=message):
        trainer.fit(_OwnAllReduce())
    assert torch.distributed.all_reduce is original  # put back


def test_a_step_whose_ranks_run_different_micro_batch_counts_refuses_collectives_everywhere(
    monkeypatch,
):
    """A rank whose share is one micro-batch must refuse the user's collective too (else it
    waits in it while the others refuse theirs); the strategy's own syncs pass."""
    calls = []
    monkeypatch.setattr(torch.distributed, "all_reduce", lambda *a, **k: calls.append(a))
    with refused_collectives([4, 1]):
        with pytest.raises(RuntimeError, match=r"different numbers of micro-batches \(\[4, 1\]"):
            torch.distributed.all_reduce(torch.ones(1))
        with own_collectives():
            torch.distributed.all_reduce(torch.ones(1))
    assert len(calls) == 1
    torch.distributed.all_reduce(torch.ones(1))  # put back
    assert len(calls) == 2


def test_a_metric_that_syncs_on_step_syncs_as_the_strategys_own_in_a_last_micro_batch(
    monkeypatch,
):
    import torchmetrics

    module = torch.nn.Module()
    module.synced = torchmetrics.MeanMetric(dist_sync_on_step=True)
    gathered = []

    def gather(tensor, group=None):
        torch.distributed.all_gather([tensor], tensor)  # refused unless the strategy's own
        return [tensor]

    monkeypatch.setattr(torch.distributed, "all_gather", lambda *a, **k: gathered.append(a))
    module.synced.dist_sync_fn = gather
    with refused_collectives([4, 1]), local_metric_syncs(module, False, allowed=True):
        module.synced.dist_sync_fn(torch.ones(1))
    assert len(gathered) == 1 and module.synced.dist_sync_fn is gather
    with refused_collectives([4, 1]), pytest.raises(RuntimeError, match="all_gather"):
        module.synced.dist_sync_fn(torch.ones(1))  # outside the allowance: refused


@pytest.mark.parametrize(
    ("plan", "bounds", "expected"), [([8, 2], [2, 2], [4, 1]), ([4, 4], [2, 2], None)]
)
def test_every_rank_reads_all_ranks_micro_batch_counts_from_the_plan(plan, bounds, expected):
    from types import SimpleNamespace

    sampler = GlobalBatchSampler(EpochPermutation(40), plan, rank=1)
    module = SimpleNamespace(trainer=SimpleNamespace(training=True), automatic_optimization=True)
    strategy = SimpleNamespace(
        micro_bounds=bounds,
        training_mode=SimpleNamespace(sampler=sampler),
        lightning_module=module,
        plan_state=SimpleNamespace(lower=lambda: 1, accumulation=1),
    )
    micro = MicroBatches(strategy)
    micro.plan_step(0)
    assert micro.uneven == expected


class _Normed(_Recorded):
    def __init__(self) -> None:
        super().__init__()
        self.norm = torch.nn.BatchNorm1d(32)

    def forward(self, x):
        return self.layer(self.norm(x))


def test_auto_bounds_of_a_batch_norm_model_probe_no_batch_of_one(tmp_path):
    """Failure 4: ``micro_batch_size="auto"`` probes a BatchNorm model's memory at sizes of
    at least 2 (a batch of one raised BatchNorm's error in the probe)."""
    torch.manual_seed(0)
    model = _Normed()
    strategy = HeteroStrategy(micro_batch_size="auto", controller="static")
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_steps=2,
        limit_val_batches=0,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model)
    assert [size for size, _ in strategy.memory_probe["samples"]] == [2, 4]  # not 1, 2, 4
    assert min(model.seen) >= 2 and model.seen[-2:] == [4, 4]  # the probe's steps, then 2


def test_fsdp_micro_batches_refuse_every_collective_but_fsdps_own():
    """Under ``HeteroFSDPStrategy`` a user's own collective in a micro-batched step is refused
    as under DDP; FSDP2's all-gathers and reduce-scatters (older torch's names included)
    still run."""
    from lightning_hetero.fsdp import _ShardedMicroBatches
    from lightning_hetero.microbatch import COLLECTIVES

    refused = set(_ShardedMicroBatches.refused)
    assert {"all_reduce", "broadcast", "all_gather", "all_to_all"} <= refused
    assert not refused & {"all_gather_into_tensor", "reduce_scatter_tensor"}
    assert refused < set(COLLECTIVES) == set(MicroBatches.refused)


def test_a_shadowed_method_is_put_back_as_the_instance_held_it():
    """The strategy's shadows (the precision plugin's backward, the loop's) are undone to
    what the instance held: a user's own instance attribute survives the fit."""
    from lightning_hetero._comm import shadow

    class Plugin:
        def backward(self):
            return "class"

    plain, own = Plugin(), Plugin()
    own.backward = lambda: "user's"
    for plugin, expected in ((plain, "class"), (own, "user's")):
        undo = shadow(plugin, "backward", lambda: "strategy's")
        assert plugin.backward() == "strategy's"
        undo()
        assert plugin.backward() == expected
    # a value set over the shadow since is left alone
    undo = shadow(plain, "backward", lambda: "strategy's")
    plain.backward = lambda: "later"
    undo()
    assert plain.backward() == "later"


def test_lightnings_per_batch_sigterm_broadcast_is_timed_as_waiting_during_the_fit(tmp_path):
    """Lightning broadcasts rank 0's SIGTERM flag before every training batch: under its own
    accumulation a fast rank meets its slower peers there at every loader batch, not only in
    the all-reduce, so the strategy times it as waiting (else the plan never moves); the
    loop is put back after the fit."""

    loop_seen = []

    class Model(_Recorded):
        def on_train_start(self) -> None:
            loop = self.trainer.fit_loop.epoch_loop
            loop_seen.append("_broadcast_sigterm_tensor" in vars(loop))

    strategy = HeteroStrategy(controller="static", shuffle=False)
    trainer, _ = _accumulating_fit(tmp_path, strategy, model=Model, max_steps=1)
    loop = trainer.fit_loop.epoch_loop
    if not hasattr(type(loop), "_broadcast_sigterm_tensor"):
        pytest.skip("this Lightning release has no per-batch SIGTERM broadcast")
    assert loop_seen == [True]
    assert "_broadcast_sigterm_tensor" not in vars(loop)
