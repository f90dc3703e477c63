"""ProgressiveSchedule: resolution, dropout, learning rate and batch size by epoch."""

import collections
import warnings
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import Logger
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy, ProgressiveSchedule, Stage, SubStage

# Table VII's shape: 3 stages with falling learning rates, each 24x24 then 32x32 pixels.
TABLE_VII = [
    Stage(0.2, [SubStage(2, 24, 0.1), SubStage(2, 32, 0.2)]),
    Stage(0.02, [SubStage(1, 24, 0.1), SubStage(1, 32, 0.2)]),
    Stage(0.002, [SubStage(1, 24, 0.1), SubStage(1, 32, 0.2)]),
]
EPOCHS = [  # (stage, sub-stage, resolution, dropout, lr) of epochs 0..7
    (0, 0, 24, 0.1, 0.2),
    (0, 0, 24, 0.1, 0.2),
    (0, 1, 32, 0.2, 0.2),
    (0, 1, 32, 0.2, 0.2),
    (1, 0, 24, 0.1, 0.02),
    (1, 1, 32, 0.2, 0.02),
    (2, 0, 24, 0.1, 0.002),
    (2, 1, 32, 0.2, 0.002),
]


def test_lookup_of_every_epoch_and_after_the_end():
    schedule = ProgressiveSchedule(TABLE_VII)
    assert schedule.epochs == 8 and schedule.reference_resolution == (32, 32)
    for epoch, (stage, sub, res, p, lr) in enumerate(EPOCHS + [EPOCHS[-1]] * 3):
        assert schedule.at(epoch) == (stage, sub)
        assert schedule.resolution(epoch) == (res, res)
        assert schedule.dropout(epoch) == p and schedule.lr(epoch) == lr
        assert schedule.scale(epoch) == pytest.approx((res / 32) ** 2)
        assert schedule.batch_size(epoch) is None


def test_dicts_rectangles_and_reference_resolution():
    schedule = ProgressiveSchedule(
        [{"lr": None, "substages": [{"epochs": 1, "resolution": [8, 16], "batch_size": 4}]}],
        reference_resolution=16,
    )
    assert schedule.resolution(0) == (8, 16) and schedule.scale(0) == 0.5
    assert schedule.batch_size(0) == 4 and schedule.lr(0) is None


@pytest.mark.parametrize(
    ("build", "message"),
    [
        (lambda: ProgressiveSchedule([]), "at least one stage"),
        (lambda: Stage(0.1, []), "at least one sub-stage"),
        (lambda: Stage(0.0, [SubStage(1, 8)]), "`lr` must be > 0"),
        (lambda: SubStage(0, 8), "`epochs` >= 1"),
        (lambda: SubStage(1, 0), "resolution"),
        (lambda: SubStage(1, (8, 8, 8)), "resolution"),
        (lambda: SubStage(1, 8, dropout=1.0), "dropout"),
        (lambda: SubStage(1, 8, batch_size=0), "batch_size"),
    ],
)
def test_bad_schedules_are_refused(build, message):
    with pytest.raises(ValueError, match=message):
        build()


class _Recorder(pl.LightningModule):
    """A tiny CNN with dropout that records what each epoch trains with."""

    def __init__(self, batch_size=None):
        super().__init__()
        self.net = nn.Sequential(
            nn.Conv2d(1, 4, 3, padding=1),
            nn.AdaptiveAvgPool2d(1),
            nn.Flatten(),
            nn.Dropout(0.5),
            nn.Linear(4, 2),
        )
        self.seen = {}
        self.val_shapes = set()
        if batch_size is not None:
            self.batch_size = batch_size

    def training_step(self, batch, batch_idx):
        images, labels = batch
        p = self.net[3].p
        lr = self.trainer.optimizers[0].param_groups[0]["lr"]
        self.seen.setdefault(self.current_epoch, set()).add((tuple(images.shape), p, lr))
        return nn.functional.cross_entropy(self.net(images), labels)

    def validation_step(self, batch, batch_idx):
        self.val_shapes.add(tuple(batch[0].shape[-2:]))

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=1.0)


def _data(n=32, size=32):
    return TensorDataset(torch.rand(n, 1, size, size), torch.randint(0, 2, (n,)))


def _trainer(schedule, epochs, strategy="auto", **kwargs):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_epochs=epochs,
        callbacks=[schedule],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        **kwargs,
    )


def test_a_run_trains_each_epoch_as_the_schedule_says():
    model = _Recorder()
    data = _data()
    _trainer(ProgressiveSchedule(TABLE_VII), 8).fit(
        model, DataLoader(data, batch_size=8), DataLoader(data, batch_size=8)
    )
    for epoch, (_, _, res, p, lr) in enumerate(EPOCHS):
        assert model.seen[epoch] == {((8, 1, res, res), p, lr)}
    assert model.val_shapes == {(32, 32)}  # validation sees the data as it is
    assert not any("on_after_batch_transfer" in vars(o) for o in (model,))  # unwrapped


class _Data(pl.LightningDataModule):
    def __init__(self, batch_size=8):
        super().__init__()
        self.batch_size = batch_size

    def train_dataloader(self):
        return DataLoader(_data(48), batch_size=self.batch_size)


def test_explicit_batch_sizes_apply_without_hetero_strategy():
    schedule = ProgressiveSchedule(
        [Stage(0.1, [SubStage(1, 16, batch_size=16), SubStage(2, 32, batch_size=4)])]
    )
    model = _Recorder()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        _trainer(schedule, 3, limit_val_batches=0).fit(model, datamodule=_Data())
    batches = {e: {shape[0] for shape, _, _ in seen} for e, seen in model.seen.items()}
    assert batches == {0: {16}, 1: {4}, 2: {4}}
    # the datamodule's hook was wrapped: Lightning sees no module override to warn about
    assert not [w for w in caught if "overridden" in str(w.message)]


def test_a_sub_stage_without_a_batch_size_goes_back_to_the_loaders_own():
    schedule = ProgressiveSchedule(
        [Stage(0.1, [SubStage(1, 16), SubStage(1, 24, batch_size=16), SubStage(1, 32)])]
    )
    model, data = _Recorder(), _Data(batch_size=6)
    _trainer(schedule, 3, limit_val_batches=0).fit(model, datamodule=data)
    batches = {e: {shape[0] for shape, _, _ in seen} for e, seen in model.seen.items()}
    assert batches == {0: {6}, 1: {16}, 2: {6}}
    assert data.batch_size == 6  # the datamodule is left as it was given


def test_explicit_batch_sizes_need_somewhere_to_go():
    schedule = ProgressiveSchedule([Stage(0.1, [SubStage(1, 16, batch_size=16)])])
    with pytest.raises(AttributeError, match="batch_size"):
        _trainer(schedule, 1, limit_val_batches=0).fit(
            _Recorder(), DataLoader(_data(), batch_size=8)
        )


def test_with_hetero_strategy_the_batch_follows_the_resolution():
    schedule = ProgressiveSchedule(
        [Stage(0.1, [SubStage(1, 16), SubStage(1, 32), SubStage(1, 16, batch_size=8)])]
    )
    model = _Recorder()
    _trainer(schedule, 3, strategy=HeteroStrategy(), limit_val_batches=0).fit(
        model, DataLoader(_data(64), batch_size=4)
    )
    batches = {e: {shape[0] for shape, _, _ in seen} for e, seen in model.seen.items()}
    # a quarter of the pixels: four times the batch; an explicit size wins
    assert batches == {0: {16}, 1: {4}, 2: {8}}


def test_bad_batches_are_refused_with_the_key():
    schedule = ProgressiveSchedule([Stage(0.1, [SubStage(1, 16)])], input_key=1)
    with pytest.raises(TypeError, match="input_key=1"):
        _trainer(schedule, 1, limit_val_batches=0).fit(
            _Recorder(), DataLoader(_data(), batch_size=8)
        )


@pytest.mark.parametrize(
    ("batch", "key"),
    [
        (collections.namedtuple("Pair", "x y")(torch.zeros(2, 1, 8, 8), torch.zeros(2)), 0),
        (collections.OrderedDict(x=torch.zeros(2, 1, 8, 8), y=torch.zeros(2)), "x"),
        ((torch.zeros(2, 1, 8, 8), torch.zeros(2)), 0),
        ([torch.zeros(2, 1, 8, 8), torch.zeros(2)], 0),
    ],
    ids=["namedtuple", "OrderedDict", "tuple", "list"],
)
def test_a_resized_batch_keeps_its_container_type(batch, key):
    schedule = ProgressiveSchedule([Stage(0.1, [SubStage(1, 4)])], input_key=key)
    trainer = SimpleNamespace(current_epoch=0)
    resized = schedule._resize(batch, trainer)
    assert type(resized) is type(batch)
    assert resized[key].shape == (2, 1, 4, 4)
    assert batch[key].shape == (2, 1, 8, 8)  # the loader's batch is not changed in place


def test_yaml_config_builds_the_schedule(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "trainer:\n"
        "  accelerator: cpu\n"
        "  devices: 1\n"
        "  callbacks:\n"
        "    - class_path: lightning_hetero.ProgressiveSchedule\n"
        "      init_args:\n"
        "        stages:\n"
        "          - lr: 0.1\n"
        "            substages:\n"
        "              - {epochs: 2, resolution: 24, dropout: 0.1}\n"
        "              - {epochs: 2, resolution: 32, dropout: 0.2}\n"
    )
    cli = LightningCLI(BoringModel, run=False, args=[f"--config={config}"])
    (schedule,) = [cb for cb in cli.trainer.callbacks if isinstance(cb, ProgressiveSchedule)]
    assert schedule.resolution(2) == (32, 32) and schedule.dropout(0) == 0.1


class _KeywordLogger(Logger):
    """A logger whose ``log_metrics`` takes keywords only, as Lightning calls it."""

    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict]] = []

    @property
    def name(self) -> str:
        return "keywords"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params, *args, **kwargs) -> None:
        pass

    def log_metrics(self, *, metrics, step=None) -> None:
        self.rows.append((step, dict(metrics)))


def test_metrics_reach_a_logger_by_keyword():
    # issue 40, failure 9: `log_metrics(metrics, ...)` failed on a logger whose signature
    # differs from Logger's (Lightning itself passes `metrics=` and `step=`)
    logger = _KeywordLogger()
    trainer = _trainer(
        ProgressiveSchedule([Stage(0.1, [SubStage(1, 32)])]),
        1,
        strategy=HeteroStrategy(adjust_every="epoch"),
        limit_val_batches=0,
    )
    trainer.loggers = [logger]
    trainer.fit(_Recorder(), DataLoader(_data(), batch_size=8))
    names = {name for _, metrics in logger.rows for name in metrics}
    assert "hetero/balance" in names and "progressive/lr" in names
