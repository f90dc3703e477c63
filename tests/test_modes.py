"""Every registered training mode through the same interface checks (a conformance test).

A new mode gets these checks by its entry in ``MODES`` (or ``VARIANTS``): the interface it
implements, and a real one-device ``Trainer`` run with Lightning's defaults in which every
sample is drawn once per epoch, each step's share is its batch, boundaries are recorded
and checkpointed, and teardown releases what the mode brought up.
"""

import dataclasses
import inspect
import math

import lightning.pytorch as pl
import pytest
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroCallback, HeteroFSDPStrategy, HeteroStrategy
from lightning_hetero.fsdp import FSDP_MODES
from lightning_hetero.modes import MODES, OPTION_GROUPS, VARIANTS, Mode, ModeOptions, build_mode
from lightning_hetero.planning.registry import CONTROLLERS

N_SAMPLES = 50
#: (strategy, mode name, controller class of a variant): every engine's registry
CASES = (
    [(HeteroStrategy, name, None) for name in MODES]
    + [(HeteroStrategy, name, kind) for name, kind in VARIANTS]
    + [(HeteroFSDPStrategy, name, None) for name in FSDP_MODES]
)
REGISTRIES = {HeteroStrategy: (MODES, VARIANTS), HeteroFSDPStrategy: (FSDP_MODES, {})}


def _case_id(case: tuple[type, str, type | None]) -> str:
    strategy, name, kind = case
    engine = "fsdp:" if strategy is HeteroFSDPStrategy else ""
    return engine + (name if kind is None else f"{name}+{kind.__name__}")


def _build(strategy: type, name: str, kind: type | None, **options) -> Mode:
    modes, variants = REGISTRIES[strategy]
    controller = None if kind is None else kind()
    return build_mode(name, controller, 0.05, ModeOptions(**options), modes, variants)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_mode_is_built_from_its_registry_entry(case) -> None:
    strategy, name, kind = case
    mode = _build(*case)
    modes, variants = REGISTRIES[strategy]
    expected = modes[name] if kind is None else variants[(name, kind)]
    assert type(mode) is expected and issubclass(expected, Mode)
    assert mode.name == name
    assert mode.default_controller in CONTROLLERS
    for flag in ("steps_together", "even_steps", "wraps_model", "replans_within_epoch"):
        assert isinstance(getattr(mode, flag), bool), flag
    assert mode.sampler is None  # and no part at work yet: every mode has the slots
    assert mode.merges == [] and mode.server is None and mode.merger is None


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_mode_overrides_hooks_with_the_interface_signatures(case) -> None:
    cls = type(_build(*case))
    for hook, base in vars(Mode).items():
        if not inspect.isfunction(base) or hook.startswith("__"):
            continue
        own = getattr(cls, hook)
        assert list(inspect.signature(own).parameters) == list(
            inspect.signature(base).parameters
        ), f"{cls.__name__}.{hook} changes the interface's signature"


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_options_the_mode_cannot_honour_are_refused(case) -> None:
    name = case[1]
    cls = type(_build(*case))
    if not cls.replans_within_epoch:
        with pytest.raises(ValueError, match=f"mode={name!r} re-plans at epoch boundaries"):
            _build(*case, adjust_every=2)
    else:
        _build(*case, adjust_every=2)
    with pytest.raises(ValueError, match="gamma"):
        _build(*case, gamma=1.0)


#: A valid value other than the default for each part's option (its field's ``example``).
_SET = {f.name: f.metadata["example"] for group in OPTION_GROUPS for f in dataclasses.fields(group)}


@pytest.mark.parametrize("case", CASES, ids=_case_id)
@pytest.mark.parametrize(
    ("group", "option"),
    [(group, f.name) for group in OPTION_GROUPS for f in dataclasses.fields(group)],
    ids=lambda value: getattr(value, "__name__", value),
)
def test_an_option_of_a_part_the_mode_lacks_is_refused_naming_it(case, group, option) -> None:
    # e.g. outer_lr or gamma outside mode="local" (silently ignored before)
    cls = type(_build(*case))
    if case[0] is HeteroFSDPStrategy:  # HeteroFSDPStrategy does not take them at all
        with pytest.raises(TypeError, match=f"'{option}'"):
            case[0](**{option: _SET[option]})
    if group in cls.option_groups:
        _build(*case, **{option: _SET[option]})
    else:
        with pytest.raises(ValueError, match=f"`{option}` is an option of the {group.part}"):
            _build(*case, **{option: _SET[option]})


class _Recorder(pl.Callback):
    """Records each step's sample indices and the mode's share of it."""

    def __init__(self) -> None:
        self.epochs: list[list[int]] = []
        self.shares: list[tuple[int, int]] = []

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        self.epochs.append([])

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx) -> None:
        self.epochs[-1].extend(batch[2].tolist())
        self.shares.append((trainer.strategy.training_mode.share[0], len(batch[2])))


class _Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y, _ = batch
        loss = torch.nn.functional.mse_loss(self.layer(x), y)
        self.log("loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(N_SAMPLES, 4, generator=g), torch.randn(N_SAMPLES, 1, generator=g)
        return DataLoader(TensorDataset(x, y, torch.arange(N_SAMPLES)), batch_size=8)


@pytest.mark.parametrize("case", CASES, ids=_case_id)
def test_the_mode_trains_through_a_real_trainer(case, tmp_path) -> None:
    strategy_class, name, kind = case
    strategy = strategy_class(mode=name, controller=None if kind is None else kind())
    recorder, hetero = _Recorder(), HeteroCallback()  # the one the strategy adds is removed
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=2,
        default_root_dir=tmp_path,
        callbacks=[recorder, hetero],
    )
    trainer.fit(_Regression())
    mode = strategy.training_mode
    assert mode.sampler is not None
    for drawn in recorder.epochs:  # every sample once per epoch
        assert sorted(drawn) == list(range(N_SAMPLES))
    assert all(share == size for share, size in recorder.shares)  # b_k of every step
    assert len(strategy.history) >= 2  # at least one boundary per epoch
    last = strategy.history[-1]
    assert last["batch_sizes"] == strategy.batch_sizes == [8]
    assert math.isfinite(last["compute_times"][0]) and last["compute_times"][0] > 0
    state = hetero.state_dict()
    assert state["batch_sizes"] == [8] and state["history"] == strategy.history
    assert getattr(mode, "server", None) is None  # teardown released what the mode brought up
