"""LocalSGDMode (``mode="local"``) on a real run context."""

import math
import operator

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.callbacks import ModelCheckpoint
from lightning_utilities.core.imports import compare_version
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy
from lightning_hetero.localsgd import ReplicaMerger
from lightning_hetero.modes.local import LocalSGDMode
from lightning_hetero.sampler import EpochPermutation

from .conftest import bound


def _local(plan: list[int], **kwargs) -> tuple[LocalSGDMode, list]:
    mode, replans = bound("local", plan, world_size=len(plan), **kwargs)
    assert isinstance(mode, LocalSGDMode)
    return mode, replans


@pytest.mark.parametrize(("lr_scaling", "factor"), [(True, 2 * 3 / 8), (False, 1.0)])
def test_the_learning_rate_is_scaled_by_world_size_times_share_for_the_step_only(
    lr_scaling, factor
):
    mode, _ = _local([3, 5], lr_scaling=lr_scaling)
    mode.share = (3, 8)
    optimizer = torch.optim.SGD([torch.zeros(1, requires_grad=True)], lr=0.1)
    seen = mode.optimizer_step(optimizer, lambda: optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx(0.1 * factor)
    assert optimizer.param_groups[0]["lr"] == 0.1


@pytest.mark.parametrize(
    ("lr_scaling", "factor"),
    [("auto", 2 * math.sqrt(3 / 8)), ("sqrt", 2 * math.sqrt(3 / 8)), ("linear", 2 * 3 / 8)],
)
def test_an_adaptive_replica_steps_k_times_the_square_root_of_its_share(lr_scaling, factor):
    # the merge moves the model 1/K of each replica's step: K times an async push's factor
    # (at an even split sqrt(K) times lr; K Adam replicas at lr trailed DDP, issue 32)
    mode, _ = _local([3, 5], lr_scaling=lr_scaling)
    mode.share = (3, 8)
    optimizer = torch.optim.Adam([torch.zeros(1, requires_grad=True)], lr=0.1)
    seen = mode.optimizer_step(optimizer, lambda: optimizer.param_groups[0]["lr"])
    assert seen == pytest.approx(0.1 * factor)
    assert optimizer.param_groups[0]["lr"] == 0.1


def test_replicas_merge_after_each_megabatch_and_replan_with_the_update_counts(group):
    module = torch.nn.Linear(2, 1)
    mode, replans = _local([4], port=group, module=module, megabatch_size=8)
    mode.setup_environment()  # the claim counter in the group's store
    sampler = mode.batch_sampler(EpochPermutation(16), [4], drop_last=False, lower=1)
    mode.on_train_start()
    mode.on_train_epoch_start()
    drawn: list[int] = []
    for batch_idx, batch in enumerate(sampler):
        # read before the step (Throttle does) without consuming the step's tag
        assert mode.step_samples(batch_idx) == mode.step_samples(batch_idx) == len(batch)
        mode.on_train_batch_start(batch_idx)
        drawn += batch
        if batch_idx == 2:  # the first batch of the second mega-batch merged the first
            assert replans == [[2]]
    assert sorted(drawn) == list(range(16))  # every sample once
    assert mode.on_train_epoch_end() is False  # it re-planned at each merge instead
    assert replans == [[2], [2]]
    assert [merge["megabatch"] for merge in mode.merges] == [0, 1]
    assert all(merge["weights"] == [1.0] for merge in mode.merges)


def test_proportional_local_steps_keep_the_batch_sizes_and_refuse_a_controller_that_moves_them():
    from lightning_hetero.planning import StaticController

    mode, _ = _local([4, 4])  # the default: local_steps="proportional"
    assert isinstance(mode.controller, StaticController)  # each rank's steps follow its speed
    mode, _ = _local([4, 4], local_steps="equal")
    assert mode.controller.name == "updates"  # paper 004's controller
    with pytest.raises(ValueError, match="local_steps='proportional' keeps"):
        _local([4, 4], controller="updates")


def test_the_outer_optimizer_moves_the_merged_model_by_nesterov_on_the_pseudo_gradient():
    from lightning_hetero.localsgd import ReplicaMerger

    module = torch.nn.Linear(1, 1, bias=False)
    with torch.no_grad():
        module.weight.fill_(1.0)
    merger = ReplicaMerger(module, rank=0, gamma=0.0, outer_lr=0.5)
    with torch.no_grad():
        module.weight.fill_(0.8)  # the replica's local steps (one rank: the average itself)
    merger.merge([1.0])
    assert module.weight.item() == pytest.approx(1.0 - 0.5 * (0.2 + 0.9 * 0.2))  # 0.81
    with torch.no_grad():
        module.weight.fill_(0.71)
    merger.merge([1.0])
    assert module.weight.item() == pytest.approx(0.81 - 0.5 * (0.1 + 0.9 * 0.28))  # 0.634


def test_a_merge_keeps_each_tensors_dtype_and_storage_and_sums_in_float32():
    from lightning_hetero.localsgd import ReplicaMerger, flatten, weighted_average_

    # a bfloat16 layer beside a float32 one (a model keeping some modules in float32): the
    # flattened merge used to promote the bfloat16 parameters to float32 when written back
    module = torch.nn.Sequential(torch.nn.Linear(2, 2).to(torch.bfloat16), torch.nn.Linear(2, 2))
    before = {
        name: (p.dtype, p.data_ptr(), p.detach().clone()) for name, p in module.named_parameters()
    }
    merger = ReplicaMerger(module, rank=0, gamma=0.0, outer_lr=0.5)
    merger.merge([1.0])  # one rank: the average is the replica, the outer step moves nothing
    for name, param in module.named_parameters():
        dtype, pointer, values = before[name]
        assert (param.dtype, param.data_ptr()) == (dtype, pointer), name
        torch.testing.assert_close(param.detach(), values, rtol=0, atol=0)
    assert merger.state_dict()["global"].dtype == torch.float32  # the outer state: float32
    # the all-reduce carries float32 (a bfloat16 sum of ranks' values would round at 2**-8)
    tensors = [torch.tensor([1.0 + 2**-7], dtype=torch.bfloat16), torch.tensor([1.0 + 2**-20])]
    assert flatten(tensors).dtype == torch.float32
    weighted_average_(tensors, 3.0, 3.0)
    assert [t.dtype for t in tensors] == [torch.bfloat16, torch.float32]
    assert tensors[0].item() == 1.0 + 2**-7 and tensors[1].item() == 1.0 + 2**-20


def test_the_optimizer_state_a_merge_averages_is_what_is_shaped_like_the_parameters():
    from lightning.pytorch.core.optimizer import LightningOptimizer

    from lightning_hetero.localsgd import optimizer_state_tensors

    module = torch.nn.Linear(3, 2)
    sgd = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    adam = torch.optim.Adam(torch.nn.Linear(2, 1).parameters())
    assert optimizer_state_tensors([sgd, adam]) == ([], [0.0, 0.0, 0.0])  # nothing stepped
    module(torch.ones(1, 3)).sum().backward()
    sgd.step()
    tensors, layout = optimizer_state_tensors([LightningOptimizer(sgd)])
    assert [t.shape for t in tensors] == [(2, 3), (2,)]  # the momentum buffers
    assert layout == [2.0, 8.0, 1 * 6 + 2 * 2]
    for param in adam.param_groups[0]["params"]:
        param.grad = torch.ones_like(param)
    adam.step()
    tensors, layout = optimizer_state_tensors([sgd, adam])
    # Adam's two moments per parameter, its `step` counters left out
    assert [t.shape for t in tensors] == [(2, 3), (2,), (1, 2), (1, 2), (1,), (1,)]
    assert layout[:2] == [6.0, 8.0 + 2 * 2 + 2 * 1]
    with pytest.raises(ValueError, match="merge_optimizer_state"):
        _local([4, 4], merge_optimizer_state="yes")


class _Line(pl.LightningModule):
    """Least squares on a fixed data set (one merge per epoch at the default mega-batch)."""

    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05)

    def train_dataloader(self):
        g = torch.Generator().manual_seed(0)
        x, y = torch.randn(48, 4, generator=g), torch.randn(48, 1, generator=g)
        return DataLoader(TensorDataset(x, y), batch_size=8)


class _MergerAtStart(pl.Callback):
    """The local mode's merge state when the first epoch of a fit starts (after the
    strategy's ``on_train_start``, where the merger is made)."""

    def on_train_epoch_start(self, trainer, pl_module) -> None:
        if not hasattr(self, "state"):
            self.state = trainer.strategy.training_mode.merger.state_dict()


def _fit(tmp_path, epochs: int, ckpt_path=None, **options) -> tuple[torch.Tensor, dict]:
    pl.seed_everything(0, verbose=False)
    seen = _MergerAtStart()
    trainer = pl.Trainer(
        strategy=HeteroStrategy(mode="local", **options),
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        default_root_dir=tmp_path,
        callbacks=[ModelCheckpoint(dirpath=tmp_path, save_last=True), seen],
        logger=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = _Line()
    trainer.fit(model, ckpt_path=ckpt_path)
    return model.layer.weight.detach().clone(), seen.state


@pytest.mark.parametrize("options", [{"outer_lr": 0.5}, {"gamma": 0.5}], ids=["outer", "gamma"])
def test_a_resumed_run_keeps_the_merges_momentum(tmp_path, options):
    # the outer optimizer's momentum buffer and gamma's previous model are checkpointed in
    # HeteroCallback's entry (Mode.state_dict) and the resumed run's merger starts from them:
    # two epochs resumed after the first end where two epochs in one go end
    whole, _ = _fit(tmp_path / "whole", 2, **options)
    _fit(tmp_path, 1, **options)
    last = tmp_path / "last.ckpt"
    entries = torch.load(last, weights_only=True)["callbacks"]
    saved = next(v for k, v in entries.items() if "HeteroCallback" in k)["mode"]["merger"]
    # one merge: the previous model is the start, the momentum the first pseudo-gradient
    assert not torch.equal(saved["previous"], saved["global"])
    assert (saved["velocity"] is not None) == ("outer_lr" in options)
    weights, resumed = _fit(tmp_path, 2, ckpt_path=str(last), **options)
    for name, vector in saved.items():
        if vector is None:
            assert resumed[name] is None
        else:
            torch.testing.assert_close(resumed[name], vector, rtol=0, atol=0)
    if not compare_version("lightning", operator.ge, "2.5.0"):
        # measured with `make test-oldest`: Lightning 2.4, resuming at an epoch's end, skips
        # the first batch of a loader without a length (local mode's): the resumed epoch
        # draws the same order from its second batch on, and ends 0.02 away in the weights,
        # with or without these options (the merger's state above is restored exactly)
        pytest.xfail("Lightning < 2.5 skips a lengthless loader's first batch on resume")
    torch.testing.assert_close(weights, whole)


def test_a_merge_state_of_another_model_is_refused():
    saved = ReplicaMerger(torch.nn.Linear(2, 1), rank=0, gamma=0.5).state_dict()
    merger = ReplicaMerger(torch.nn.Linear(3, 1), rank=0, gamma=0.5)
    with pytest.raises(ValueError, match="3 values, this model 4 parameters"):
        merger.load_state_dict(saved)
