"""HeteroCallback's checkpointed state: versions, a changed world size, ranks held at minimum."""

import math
import socket
import warnings
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import DataLoader

from lightning_hetero import HeteroCallback, HeteroStrategy
from lightning_hetero.callback import STATE_VERSION, _migrate
from lightning_hetero.context import RunContext
from lightning_hetero.plan_state import PlanState
from lightning_hetero.planning import BatchLimits, ProportionalController
from lightning_hetero.planning.faults import (
    RankIdentity,
    held_at_minimum,
    weights_for_new_world,
)
from lightning_hetero.replan import Replanner
from lightning_hetero.sampler import GlobalBatchSampler

A0, A1, B0, C0 = (RankIdentity(h, r) for h, r in (("a", 0), ("a", 1), ("b", 0), ("c", 0)))


# ---------------------------------------------------------------- pure planning
def test_matched_ranks_weigh_their_saved_throughput_whatever_their_new_rank():
    restored = weights_for_new_world([A0, A1, B0], [100.0, 300.0, 50.0], [B0, A1])
    assert restored.weights == [50.0, 300.0]
    assert restored.matched == {0: 2, 1: 1}
    assert restored.fallback == [] and not restored.uniform


def test_unmatched_ranks_weigh_the_mean_of_the_matched_ones():
    restored = weights_for_new_world([A0, A1], [100.0, 300.0], [A0, C0, A1])
    assert restored.weights == [100.0, 200.0, 300.0]
    assert restored.fallback == [1]


def test_without_any_match_every_rank_weighs_the_same():
    restored = weights_for_new_world([A0, A1], [100.0, 300.0], [B0, C0])
    assert restored.weights == [1.0, 1.0]
    assert restored.uniform and restored.matched == {} and restored.fallback == [0, 1]


def test_a_matched_rank_without_a_usable_throughput_falls_back_to_the_mean():
    restored = weights_for_new_world([A0, A1, B0], [math.nan, 300.0, 100.0], [A0, A1, B0])
    assert restored.weights == [200.0, 300.0, 100.0]
    assert restored.matched == {0: 0, 1: 1, 2: 2} and restored.fallback == [0]


def test_saved_ranks_and_throughputs_of_different_lengths_are_refused():
    with pytest.raises(ValueError, match="2 saved ranks but 1 saved throughputs"):
        weights_for_new_world([A0, A1], [1.0], [A0])


def test_a_slow_rank_at_its_minimum_is_reported_and_a_rank_that_fits_is_not():
    # B = 128; rank 3's share at 1/31 of the speed would be about 4 samples, below 16
    assert held_at_minimum([37, 37, 38, 16], [370.0, 370.0, 380.0, 12.0], [16] * 4) == [3]
    # at its minimum, but its share (about 19) is above it: the plan is not holding it up
    assert held_at_minimum([37, 37, 38, 16], [370.0, 370.0, 380.0, 200.0], [16] * 4) == []
    # slow but above its minimum: not held
    assert held_at_minimum([36, 36, 36, 20], [360.0, 360.0, 360.0, 12.0], [16] * 4) == []


def test_timing_noise_around_a_share_at_the_minimum_is_no_alarm():
    # two equal ranks at one sample each: noise puts one a little below its share of 1
    assert held_at_minimum([1, 1], [101.0, 99.0], [1, 1]) == []
    assert held_at_minimum([16, 48], [76.0, 240.0], [16, 16]) == []  # share 15.4 of 16
    assert held_at_minimum([16, 48], [40.0, 280.0], [16, 16]) == [0]  # share 8 of 16


def test_held_at_minimum_needs_every_throughput_and_one_entry_per_rank():
    assert held_at_minimum([16, 48], [math.nan, 100.0], [16, 16]) == []
    with pytest.raises(ValueError, match="2 batch sizes, 1 throughputs and 2 minimums"):
        held_at_minimum([16, 48], [1.0], [16, 16])


def test_the_held_rank_is_warned_about_once():
    # the re-planner's check (it was HeteroCallback._check_minimum before the re-planner)
    state = PlanState(plan=[37, 37, 38, 16], limits=BatchLimits.build(4, 128, min_batch_size=16))
    mode = SimpleNamespace(
        fixed_plan=False, controller=ProportionalController(), bind=lambda *args: None
    )
    replanner = Replanner(mode, smoothing=0.8, adjust_every="epoch")
    replanner.bind(RunContext.single(state, world_size=4))
    replanner._samples_per_s = [370.0, 370.0, 380.0, 12.0]
    with pytest.warns(UserWarning, match=r"rank 3 is held at min_batch_size=16.*removing it"):
        assert replanner._check_minimum() == [3]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert replanner._check_minimum() == [3]  # still held, not warned again
        # a dual plan pins every rank's batch on purpose: nothing to report
        mode.fixed_plan = True
        replanner._warned_minimum.clear()
        assert replanner._check_minimum() == []


# ---------------------------------------------------------------- versions
def _state(version, **extra):
    return {
        "version": version,
        "batch_sizes": [8, 24],
        "world_size": 2,
        "controller_class": "ProportionalController",
        "controller": {},
        "history": [],
        "adjustments": 1,
        "batches": 4,
        **extra,
    }


def test_a_version_1_state_is_migrated_without_rank_records():
    migrated = _migrate(_state(1))
    assert migrated["version"] == STATE_VERSION == 3
    assert migrated["ranks"] == [] and migrated["mode"] == {}
    assert migrated["batch_sizes"] == [8, 24]


def test_a_version_2_state_is_migrated_without_the_modes_state():
    migrated = _migrate(_state(2, ranks=[]))
    assert migrated == _state(STATE_VERSION, ranks=[], mode={})


def test_a_state_of_this_version_loads_unchanged():
    ranks = [{"host": "a", "local_rank": 0, "batch_size": 8, "samples_per_s": 1.0}]
    state = _state(STATE_VERSION, ranks=ranks, mode={})
    assert _migrate(state) == state


def test_a_newer_state_is_refused_with_both_versions_named():
    callback = HeteroCallback()
    message = r"version 4, written by a newer.*versions 1 to 3.*Upgrade"
    with pytest.raises(ValueError, match=message):
        callback.load_state_dict(_state(4))


@pytest.mark.parametrize("version", [None, 0, "2", True])
def test_a_state_without_a_valid_version_is_refused(version):
    with pytest.raises(ValueError, match="no valid version"):
        _migrate(_state(version))


# ---------------------------------------------------------------- resume in one process
class _Model(BoringModel):
    def train_dataloader(self):
        return DataLoader(RandomDataset(32, 32), batch_size=8)


def _trainer(tmp_path, epochs, **strategy_kwargs):
    return pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=HeteroStrategy(**strategy_kwargs),
        max_epochs=epochs,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True)],
        logger=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )


@pytest.fixture(scope="module")
def checkpoint(tmp_path_factory):
    path = tmp_path_factory.mktemp("ckpt")
    _trainer(path, 1).fit(_Model())
    return torch.load(path / "last.ckpt", weights_only=False)


def test_checkpoint_records_each_rank_s_host_local_rank_and_throughput(checkpoint):
    state = checkpoint["callbacks"]["HeteroCallback"]
    assert state["version"] == STATE_VERSION
    (rank,) = state["ranks"]
    assert rank["host"] == socket.gethostname() and rank["local_rank"] == 0
    assert rank["batch_size"] == 8 and rank["samples_per_s"] > 0


def _resume(tmp_path, checkpoint, state):
    checkpoint = {**checkpoint, "callbacks": {**checkpoint["callbacks"], "HeteroCallback": state}}
    path = tmp_path / "edited.ckpt"
    torch.save(checkpoint, path)
    trainer = _trainer(tmp_path / "out", 2)
    trainer.fit(_Model(), ckpt_path=path)
    return trainer


def test_a_resume_on_another_world_size_names_the_matched_ranks(tmp_path, checkpoint):
    state = dict(checkpoint["callbacks"]["HeteroCallback"])
    host = socket.gethostname()
    state.update(
        world_size=2,
        batch_sizes=[2, 6],
        ranks=[
            {"host": host, "local_rank": 5, "batch_size": 2, "samples_per_s": 10.0},
            {"host": host, "local_rank": 0, "batch_size": 6, "samples_per_s": 30.0},
        ],
    )
    with pytest.warns(UserWarning, match=r"written by 2 ranks, this run has 1: ranks matched") as w:
        trainer = _resume(tmp_path, checkpoint, state)
    assert any(f"0 ({host}:0) <- saved rank 1" in str(r.message) for r in w)
    assert trainer.strategy.batch_sizes == [8]
    assert len(trainer.strategy.history) == 2  # the saved boundary and this run's


def test_a_version_1_checkpoint_on_another_world_size_starts_uniform(tmp_path, checkpoint):
    state = dict(checkpoint["callbacks"]["HeteroCallback"])
    del state["ranks"]
    state.update(version=1, world_size=3, batch_sizes=[2, 2, 4])
    with pytest.warns(UserWarning, match="no rank could be matched"):
        trainer = _resume(tmp_path, checkpoint, state)
    assert trainer.strategy.batch_sizes == [8]


class _StateAtStart(pl.Callback):
    """Records the HeteroCallback's state as a checkpoint would save it before any boundary."""

    def on_train_start(self, trainer, pl_module):
        (hetero,) = [cb for cb in trainer.callbacks if isinstance(cb, HeteroCallback)]
        self.ranks = hetero.state_dict()["ranks"]


@pytest.mark.parametrize(("local_rank", "kept"), [(0, True), (5, False)])
def test_a_resume_keeps_the_saved_throughput_of_a_rank_that_runs_where_it_ran(
    tmp_path, checkpoint, local_rank, kept
):
    state = dict(checkpoint["callbacks"]["HeteroCallback"])
    host = socket.gethostname()
    state["ranks"] = [
        {"host": host, "local_rank": local_rank, "batch_size": 8, "samples_per_s": 123.0}
    ]
    checkpoint = {**checkpoint, "callbacks": {**checkpoint["callbacks"], "HeteroCallback": state}}
    path = tmp_path / "edited.ckpt"
    torch.save(checkpoint, path)
    record = _StateAtStart()
    trainer = _trainer(tmp_path / "out", 2)
    trainer.callbacks.append(record)
    trainer.fit(_Model(), ckpt_path=path)
    (rank,) = record.ranks
    assert rank["batch_size"] == 8 and rank["local_rank"] == 0
    if kept:
        assert rank["samples_per_s"] == 123.0
    else:  # another place: its old speed says nothing about this rank
        assert math.isnan(rank["samples_per_s"])


# ---------------------------------------------------------------- a file from the last release
RELEASE_CHECKPOINT = Path(__file__).parent / "data" / "release_0.1.0_lbbsp.ckpt"


def test_a_checkpoint_written_by_the_previous_release_resumes(tmp_path):
    """``release_0.1.0_lbbsp.ckpt`` was written by lightning_hetero before training modes
    became objects (``tests/data/make_release_checkpoint.py``, run on that release): one rank,
    the lbbsp controller, a boundary every 2 batches, 2 epochs of 4 batches."""
    saved = torch.load(RELEASE_CHECKPOINT, weights_only=False)["callbacks"]["HeteroCallback"]
    seen = {}

    class _Look(pl.Callback):
        def on_train_start(self, trainer, pl_module):
            seen["controller"] = trainer.strategy.controller.state_dict()
            seen["history"] = list(trainer.strategy.history)

    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        # a boundary every 2 batches (the test counts them), however short the steps
        strategy=HeteroStrategy(controller="lbbsp", adjust_every=2, replan_budget=None),
        max_epochs=3,
        callbacks=[_Look(), hetero := HeteroCallback()],  # the one the strategy adds is removed
        logger=False,
        limit_val_batches=0,
        default_root_dir=tmp_path,
    )
    with warnings.catch_warnings():
        warnings.filterwarnings("error", message=".*starts fresh")  # the controller is kept
        trainer.fit(_Model(), ckpt_path=RELEASE_CHECKPOINT)
    assert seen["controller"] == saved["controller"]
    assert seen["history"] == saved["history"]
    history = trainer.strategy.history
    assert len(history) == len(saved["history"]) + 2  # one more epoch of 4 batches
    assert [entry["epoch"] for entry in history[-2:]] == [2, 2]
    assert trainer.strategy.batch_sizes == saved["batch_sizes"] == [8]
    state = hetero.state_dict()
    assert state["batches"] == saved["batches"] + 4 and state["version"] == STATE_VERSION


# ---------------------------------------------------------------- portable checkpoints
class _Indexed(pl.LightningModule):
    """Trains on 40 indexed samples in loader batches of 4 and records the indices."""

    def __init__(self, samples: int = 40) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(2, 1)
        self.seen: list[int] = []
        self.samples = samples

    def train_dataloader(self):
        n = self.samples
        data = torch.utils.data.TensorDataset(torch.arange(n), torch.randn(n, 2))
        self.loader = DataLoader(data, batch_size=4)
        return self.loader

    def training_step(self, batch, batch_idx):
        self.seen += batch[0].tolist()
        return self.layer(batch[1]).pow(2).mean()

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def _run(strategy, tmp_path: Path, max_steps: int, ckpt_path=None, samples=40):
    model = _Indexed(samples)
    saves = ModelCheckpoint(tmp_path / "saved", every_n_train_steps=3, save_top_k=-1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=strategy,
        max_steps=max_steps,
        callbacks=[saves],
        logger=False,
        enable_model_summary=False,
        enable_progress_bar=False,
        default_root_dir=tmp_path,
    )
    trainer.fit(model, ckpt_path=ckpt_path)
    assert trainer.global_step == max_steps
    model.final_loop_state = trainer.fit_loop.state_dict()
    return model, tmp_path / "saved" / f"epoch=0-step={min(max_steps, 3)}.ckpt"


def _hetero():
    return HeteroStrategy(controller="static")


@pytest.mark.parametrize("resume_under", ["auto", "ddp", "hetero"])
def test_a_mid_epoch_hetero_checkpoint_resumes_under_any_strategy(tmp_path, resume_under):
    # issue 40, failure 6: "The CombinedLoader has 0 stateful loaders, but found 1 states"
    first, checkpoint = _run(_hetero(), tmp_path / "first", max_steps=3)
    saved = torch.load(checkpoint, weights_only=False)
    assert "combined_loader" not in saved["loops"]["fit_loop"]["state_dict"]
    assert saved["lightning_hetero/train_loader"][0]["step"] == 3
    strategy = _hetero() if resume_under == "hetero" else resume_under
    resumed, _ = _run(strategy, tmp_path / "again", max_steps=10, ckpt_path=checkpoint)
    if resume_under == "hetero":  # the epoch goes on where it stopped: each sample once
        assert sorted(first.seen + resumed.seen) == list(range(40))


def test_after_fit_the_trainer_holds_the_user_s_loader_and_no_loader_position(tmp_path):
    # issue 40, Lightning's test_loop_state_on_exception: the live loop state after `fit`
    # equals the checkpoint's (whose position is kept under a key of its own), as under DDP
    model, checkpoint = _run(_hetero(), tmp_path, max_steps=3)
    loader = model.trainer.train_dataloader  # Lightning's, as under DDP: not the strategy's
    assert loader.dataset is model.loader.dataset
    assert not isinstance(loader.batch_sampler, GlobalBatchSampler)
    saved = torch.load(checkpoint, weights_only=False)["loops"]["fit_loop"]
    assert model.final_loop_state["state_dict"] == saved["state_dict"] == {}


def test_a_mid_epoch_ddp_checkpoint_resumes_under_hetero(tmp_path):
    _, checkpoint = _run("ddp", tmp_path / "first", max_steps=3)
    resumed, _ = _run(_hetero(), tmp_path / "again", max_steps=10, ckpt_path=checkpoint)
    assert len(resumed.seen) == 7 * 4  # the epoch's 7 steps left, as under DDP


def test_a_mid_epoch_resume_on_a_longer_training_set_starts_the_order_over(tmp_path):
    _, checkpoint = _run(_hetero(), tmp_path / "first", max_steps=3)
    with pytest.warns(UserWarning, match="40 training samples.*48 samples.*starts over"):
        resumed, _ = _run(_hetero(), tmp_path / "again", 12, ckpt_path=checkpoint, samples=48)
    fresh, _ = _run(_hetero(), tmp_path / "fresh", max_steps=1, samples=48)
    assert resumed.seen[:4] == fresh.seen  # from the start of the new order
    assert len(resumed.seen) == 9 * 4  # the epoch's steps Lightning has left
