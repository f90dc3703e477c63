import csv
import importlib.util
import subprocess
import sys
from pathlib import Path

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.cli import LightningCLI
from lightning.pytorch.demos.boring_classes import BoringModel, RandomDataset
from torch.utils.data import BatchSampler, DataLoader, IterableDataset, SequentialSampler

from lightning_hetero import HeteroCallback, HeteroStrategy
from lightning_hetero.bench.run import child_env
from lightning_hetero.planning import (
    Controller,
    PlanError,
    ProportionalController,
    RankStats,
    StaticController,
)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"min_batch_size": 8, "max_batch_size": 4}, "must not exceed"),
        ({"min_batch_size": 0}, "min_batch_size"),
        ({"deadband": 1.0}, "deadband"),
        ({"deadband": -0.1}, "deadband"),
        ({"smoothing": 1.0}, "smoothing"),
        ({"mode": "bogus"}, "Unknown mode"),
        ({"controller": "bogus"}, "Unknown controller"),
        ({"batch_sizes": "bogus"}, "Unknown initial plan"),
        ({"batch_sizes": [4, 0, 4]}, "positive"),
        ({"batch_sizes": [4, 4], "global_batch_size": 9}, "sums to 8"),
        ({"batch_sizes": [4, 12], "max_batch_size": 8}, "above its maximum"),
        ({"adjust_every": 0}, "adjust_every"),
        ({"adjust_every": "weekly"}, "adjust_every"),
        ({"global_batch_size": 0}, "global_batch_size"),
        ({"ddp_comm_hook": lambda state, bucket: None}, "communication hook"),
    ],
)
def test_bad_options_fail_at_construction_with_a_clear_message(kwargs, message):
    with pytest.raises((ValueError, PlanError), match=message):
        HeteroStrategy(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"mode": "async", "weighted": False}, "lr_scaling='none'"),
        ({"mode": "async", "lr_scaling": "quadratic"}, "`lr_scaling` must be one of"),
        ({"mode": "local", "lr_scaling": 0.5}, "`lr_scaling` must be one of"),
        ({"mode": "local", "weighted": False}, "BSP ablation"),
        ({"mode": "async", "adjust_every": 4}, "re-plans at epoch boundaries"),
        ({"mode": "local", "adjust_every": 4}, "after every mega-batch"),
        ({"mode": "async", "rpc_timeout": 0}, "rpc_timeout"),
        ({"mode": "async", "lookahead": "nesterov"}, "`lookahead` must be 'auto', True or False"),
        ({"mode": "bsp", "lookahead": False}, "mode='bsp' has no parameter server"),
        ({"mode": "local", "lookahead": True}, "mode='local' has no parameter server"),
        ({"mode": "local", "megabatch_size": 32, "global_batch_size": 64}, "32.*64"),
        ({"mode": "local", "delta": -0.1}, "delta"),
        ({"mode": "local", "gamma": -0.5}, "gamma"),
        ({"mode": "local", "gamma": 1.0}, "gamma"),
        ({"mode": "local", "perturb_threshold": 0.0}, "threshold"),
        ({"mode": "local", "first_boundary": 4}, "mode='local' does not.*first_boundary"),
        (
            {"mode": "async", "controller": "dual", "first_boundary": 4},
            "controller='dual' does not.*plan is fixed.*first_boundary",
        ),
        ({"first_boundary": 4, "adjust_every": 2}, "boundaries already come every few"),
        ({"first_boundary": "soon"}, "`first_boundary` must be 'auto'"),
    ],
)
def test_bad_mode_options_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HeteroStrategy(**kwargs)


@pytest.mark.parametrize(
    ("kwargs", "early"),
    [
        ({}, True),
        ({"mode": "async"}, True),  # even steps: one wait, the epoch's end would cost it
        ({"mode": "async", "controller": "dual"}, False),  # a fixed plan
        ({"mode": "local"}, False),  # ranks claim different numbers of steps
    ],
)
def test_the_modes_with_even_steps_and_a_plan_that_may_change_take_the_early_boundary(
    kwargs, early
):
    strategy = HeteroStrategy(**kwargs)
    assert strategy.training_mode.early_boundary() is early
    if early:
        assert HeteroStrategy(first_boundary=4, **kwargs).first_boundary == 4


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"megabatch_szie": 640}, r"option 'megabatch_szie'\. Did you mean 'megabatch_size'"),
        ({"find_unused_paramters": True}, "Did you mean 'find_unused_parameters'"),
        ({"batch_size": 8}, "Did you mean 'batch_sizes'"),
        ({"device_ids": [0]}, "unknown option 'device_ids'"),  # Lightning passes it itself
        ({"zzz": 1, "yyy": 2}, r"unknown option 'yyy' \(also unknown: \['zzz'\]\)\. Its options"),
    ],
)
def test_unknown_options_are_refused_at_construction_with_the_closest_name(kwargs, message):
    # before: they reached DistributedDataParallel(...) when fit wrapped the model
    with pytest.raises(TypeError, match=message):
        HeteroStrategy(**kwargs)


def test_every_keyword_of_distributed_data_parallel_still_reaches_it():
    import inspect

    signature = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__)
    forwarded = {
        name: parameter.default
        for name, parameter in signature.parameters.items()
        if name not in ("self", "module", "device_ids")
    }
    assert "find_unused_parameters" in forwarded and "static_graph" in forwarded
    assert HeteroStrategy(**forwarded)._ddp_kwargs == forwarded


@pytest.mark.parametrize(
    ("mode", "controller"),
    [("bsp", "proportional"), ("async", "proportional"), ("local", "static")],
)
def test_each_mode_has_its_default_controller(mode, controller):
    assert HeteroStrategy(mode=mode).controller.name == controller


def test_controller_by_name_gets_the_deadband_and_objects_are_kept():
    strategy = HeteroStrategy(deadband=0.2)
    assert isinstance(strategy.controller, ProportionalController)
    assert strategy.controller.deadband == 0.2
    mine = StaticController()
    assert HeteroStrategy(controller=mine).controller is mine


def test_registered_name_builds_the_strategy():
    trainer = pl.Trainer(strategy="hetero", accelerator="cpu", devices=2, logger=False)
    assert isinstance(trainer.strategy, HeteroStrategy)
    assert trainer.strategy.batch_sizes == []


def test_explicit_plan_is_the_current_plan_before_training():
    assert HeteroStrategy(batch_sizes=[3, 5]).batch_sizes == [3, 5]


def _cli(args):
    return LightningCLI(BoringModel, run=False, args=args, save_config_kwargs={"overwrite": True})


def test_cli_registered_name_and_class_path_with_options(tmp_path):
    cli = _cli(["--trainer.strategy=hetero", "--trainer.accelerator=cpu", "--trainer.devices=1"])
    assert isinstance(cli.trainer.strategy, HeteroStrategy)
    cli = _cli(
        [
            "--trainer.strategy=lightning_hetero.HeteroStrategy",
            "--trainer.strategy.deadband=0.1",
            "--trainer.strategy.batch_sizes=[3, 5]",
            "--trainer.strategy.adjust_every=10",
            "--trainer.accelerator=cpu",
            "--trainer.devices=2",
        ]
    )
    strategy = cli.trainer.strategy
    assert isinstance(strategy, HeteroStrategy)
    assert strategy.controller.deadband == 0.1
    assert strategy.batch_sizes == [3, 5]
    assert strategy.adjust_every == 10


def test_cli_yaml_class_path_and_init_args(tmp_path):
    config = tmp_path / "config.yaml"
    config.write_text(
        "trainer:\n"
        "  accelerator: cpu\n"
        "  devices: 1\n"
        "  strategy:\n"
        "    class_path: lightning_hetero.HeteroStrategy\n"
        "    init_args:\n"
        "      controller: static\n"
        "      min_batch_size: 2\n"
        "      weighted: false\n"
        "      deadband: 0.05\n"
    )
    strategy = _cli([f"--config={config}"]).trainer.strategy
    assert isinstance(strategy.controller, StaticController)
    assert strategy.weighted is False and strategy.deadband == 0.05


# ---------------------------------------------------------------- one-process runs
class _Model(BoringModel):
    def __init__(self, loader_fn):
        super().__init__()
        self.loader_fn = loader_fn

    def train_dataloader(self):
        return self.loader_fn()

    def val_dataloader(self):
        return None


def _fit(loader_fn, callbacks=(), model_class=None, trainer_options=None, **strategy_kwargs):
    # One-process checks of set-up and data handling: nothing to log or checkpoint. Real
    # programs with every Lightning default on run in tests/e2e/test_user_programs.py.
    options = dict(
        max_epochs=2,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        limit_val_batches=0,
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        strategy=HeteroStrategy(**strategy_kwargs),
        callbacks=list(callbacks),
        **{**options, **(trainer_options or {})},
    )
    model = (model_class or _Model)(loader_fn)
    trainer.fit(model)
    return trainer


class _Stream(IterableDataset):
    def __iter__(self):
        return iter(torch.randn(8, 32))


def test_iterable_dataset_is_refused_with_an_explanation():
    """On several ranks (one rank trains it as it is: tests/test_microbatch.py; two ranks:
    the compatibility matrix's ``iterable`` cells)."""
    from lightning_hetero._data import check_training_loader

    with pytest.raises(TypeError, match="training _Stream: it is an IterableDataset.*map-style"):
        check_training_loader(DataLoader(_Stream(), batch_size=2))


def test_user_batch_sampler_is_refused_with_an_explanation():
    class MyBatches(BatchSampler):
        pass

    data = RandomDataset(32, 16)
    with pytest.raises(TypeError, match="batch_sampler MyBatches"):
        _fit(lambda: DataLoader(data, batch_sampler=MyBatches(SequentialSampler(data), 4, False)))


def test_dataset_smaller_than_one_global_batch_is_refused():
    with pytest.raises(PlanError, match="fewer than one global batch"):
        _fit(lambda: DataLoader(RandomDataset(32, 8), batch_size=4), global_batch_size=16)


def test_global_batch_outside_the_bounds_is_refused():
    with pytest.raises(PlanError, match="between the sum"):
        _fit(
            lambda: DataLoader(RandomDataset(32, 64), batch_size=4),
            max_batch_size=8,
            global_batch_size=16,
        )


class _RecordIndices(pl.Callback):
    def __init__(self):
        self.seen = []

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.seen.append(batch.shape[0])


class _BadTimings(pl.Callback):
    def __init__(self, value):
        self.value = value

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        timer = trainer.strategy.timer
        timer.finish()  # close this step: pending as (batch_size, start, end, wait segments)
        timer._pending = [(b, 0.0, self.value, (), 0.0, True, 0) for b, *_ in timer._pending]


@pytest.mark.parametrize(
    ("value", "message"),
    [
        (float("nan"), "no finite step timings"),
        (0.0, "not all finite and positive"),
        (-1.0, "positive"),
    ],
)
def test_bad_timings_keep_the_plan_and_warn_without_skipping_samples(value, message):
    recorder = _RecordIndices()
    with pytest.warns(UserWarning, match=message):
        trainer = _fit(
            lambda: DataLoader(RandomDataset(32, 40), batch_size=8),
            callbacks=[_BadTimings(value), recorder],
        )
    strategy = trainer.strategy
    assert [e["changed"] for e in strategy.history] == [False, False]
    assert strategy.batch_sizes == [8]
    assert recorder.seen == [8] * 10


def test_callback_is_attached_once_and_user_instance_is_kept():
    mine = HeteroCallback(tensorboard_layout=False)
    trainer = _fit(lambda: DataLoader(RandomDataset(32, 16), batch_size=4), callbacks=[mine])
    attached = [cb for cb in trainer.callbacks if isinstance(cb, HeteroCallback)]
    assert attached == [mine]


def test_the_callback_the_strategy_adds_is_removed_after_fit():
    # issue 40, failure 8: teardown leaves the Trainer's callbacks as it found them
    during = []

    class Look(pl.Callback):
        def on_train_end(self, trainer, pl_module):
            during.extend(type(cb).__name__ for cb in trainer.callbacks)

    look = Look()
    trainer = _fit(lambda: DataLoader(RandomDataset(32, 16), batch_size=4), callbacks=[look])
    assert "HeteroCallback" in during
    assert not any(isinstance(cb, HeteroCallback) for cb in trainer.callbacks)
    assert look in trainer.callbacks


def _epoch_orders(**strategy_kwargs):
    orders = []

    class Record(pl.Callback):
        def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
            orders.append(batch[:, 0].tolist())

    data = torch.arange(16, dtype=torch.float32).repeat(32, 1).T.contiguous()
    _fit(lambda: DataLoader(data, batch_size=4), callbacks=[Record()], **strategy_kwargs)
    flat = [int(v) for batch in orders for v in batch]
    return flat[:16], flat[16:]


def test_training_set_is_shuffled_every_epoch_as_ddp_does_whatever_the_loader_says():
    first, second = _epoch_orders()
    assert sorted(first) == sorted(second) == list(range(16))
    assert first != list(range(16)) and first != second


def test_shuffle_false_keeps_the_dataset_order():
    assert _epoch_orders(shuffle=False) == (list(range(16)), list(range(16)))


def test_plan_length_different_from_world_size_is_refused():
    with pytest.raises(PlanError, match="one batch size per rank"):
        _fit(lambda: DataLoader(RandomDataset(32, 64), batch_size=4), batch_sizes=[4, 4])


@pytest.mark.parametrize("use_distributed_sampler", [True, False])
def test_weighted_sampler_is_refused_by_name_with_class_balancing_advice(use_distributed_sampler):
    from torch.utils.data import WeightedRandomSampler

    data = RandomDataset(32, 16)
    sampler = WeightedRandomSampler([1.0] * 16, num_samples=16)
    options = {"use_distributed_sampler": use_distributed_sampler}
    with pytest.raises(TypeError, match="sampler WeightedRandomSampler.*class balancing"):
        _fit(lambda: DataLoader(data, batch_size=4, sampler=sampler), trainer_options=options)


def test_custom_sampler_is_refused_by_name_with_advice_that_keeps_its_order():
    class EveryOther(torch.utils.data.Sampler):
        def __iter__(self):
            return iter(range(0, 16, 2))

        def __len__(self):
            return 8

    loader = lambda: DataLoader(RandomDataset(32, 16), batch_size=4, sampler=EveryOther())  # noqa: E731
    with pytest.raises(TypeError, match="sampler EveryOther.*shuffle=False"):
        _fit(loader)


def test_cores_plan_on_one_rank_is_the_whole_global_batch():
    trainer = _fit(lambda: DataLoader(RandomDataset(32, 64), batch_size=8), batch_sizes="cores")
    assert trainer.strategy.batch_sizes == [8]


class _Failing(Controller):
    name = "failing"

    def update(self, batch_sizes, compute_s, limits, stats=None):
        raise ZeroDivisionError("boom")


def test_a_failing_controller_stops_training_with_its_error_named():
    with (
        pytest.warns(UserWarning, match="ZeroDivisionError: boom"),
        pytest.raises(RuntimeError, match="the _Failing controller failed") as raised,
    ):
        _fit(lambda: DataLoader(RandomDataset(32, 16), batch_size=4), controller=_Failing())
    assert "broadcast failed" not in str(raised.value) + "".join(
        getattr(raised.value, "__notes__", [])
    )


class _Recording(Controller):
    name = "recording"

    def __init__(self):
        self.calls = []

    def update(self, batch_sizes, compute_s, limits, stats=None):
        self.calls.append((list(batch_sizes), list(compute_s), stats))
        return list(batch_sizes)


def test_controller_gets_each_rank_s_resource_readings_and_they_are_logged():
    controller = _Recording()
    trainer = _fit(lambda: DataLoader(RandomDataset(32, 16), batch_size=4), controller=controller)
    assert len(controller.calls) == 2
    for plan, compute_s, stats in controller.calls:
        assert plan == [4] and compute_s[0] > 0
        assert len(stats) == 1 and isinstance(stats[0], RankStats)
        reading = stats[0]
        assert 0.0 < reading.memory_used < 1.0
        assert 0.0 <= reading.cpu_available <= 1.0 and 0.0 < reading.memory_available < 1.0
        assert reading.updates is None
    used = [entry["memory_used"] for entry in trainer.strategy.history]
    assert used == [[c[2][0].memory_used] for c in controller.calls]


# ---------------------------------------------------------------- max_batch_size="auto"
def _weights(trainer):
    return [p.detach().clone() for p in trainer.lightning_module.parameters()]


def test_auto_max_batch_size_probes_and_leaves_training_unchanged():
    def loader():
        return DataLoader(RandomDataset(32, 64), batch_size=8, shuffle=True)

    torch.manual_seed(0)
    plain = _fit(loader)
    torch.manual_seed(0)
    probed = _fit(loader, max_batch_size="auto", probe_batch_sizes=[2, 4, 8])
    probe = probed.strategy.memory_probe
    assert probe is not None and probe["max_batch_sizes"] == [8]  # capped at B
    assert [size for size, _ in probe["samples"]] == [2, 4, 8]
    assert probed.strategy.limits.max_batch_size == [8]
    # the probe's steps left model, optimizer and random state as they were
    for a, b in zip(_weights(plain), _weights(probed)):
        torch.testing.assert_close(a, b, rtol=0, atol=0)


def test_auto_max_batch_size_bounds_each_rank_by_its_measured_memory(monkeypatch):
    from lightning_hetero import memory_probe
    from lightning_hetero.planning import MemoryModel

    fitted = MemoryModel(fixed_bytes=1000.0, per_sample_bytes=100.0)
    monkeypatch.setattr(memory_probe, "host_budget_bytes", lambda: 2000.0)
    monkeypatch.setattr(memory_probe.MemoryModel, "fit", classmethod(lambda cls, s: fitted))
    # 0.9 * 2000 = 1800 bytes -> (1800 - 1000) / 100 = 8 samples fit; B = 8 fits
    trainer = _fit(lambda: DataLoader(RandomDataset(32, 64), batch_size=8), max_batch_size="auto")
    assert trainer.strategy.memory_probe["max_batch_sizes"] == [8]
    monkeypatch.setattr(memory_probe, "host_budget_bytes", lambda: 1500.0)
    # 0.9 * 1500 = 1350 -> 3 samples fit, B = 8 does not
    with pytest.raises(PlanError, match=r"max_batch_size='auto' measured per-rank maximums \[3\]"):
        _fit(lambda: DataLoader(RandomDataset(32, 64), batch_size=8), max_batch_size="auto")
    monkeypatch.setattr(memory_probe, "host_budget_bytes", lambda: 900.0)
    with pytest.raises(PlanError, match="Memory probe on cpu.*Not even a batch of 1 fits"):
        _fit(lambda: DataLoader(RandomDataset(32, 64), batch_size=8), max_batch_size="auto")


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"max_batch_size": "big"}, "'auto'"),
        ({"memory_safety": 0.0}, "memory_safety"),
        ({"memory_safety": 1.5}, "memory_safety"),
        ({"probe_batch_sizes": [4]}, "two distinct"),
        ({"probe_batch_sizes": [0, 4]}, "two distinct"),
    ],
)
def test_bad_memory_options_fail_at_construction(kwargs, message):
    with pytest.raises(ValueError, match=message):
        HeteroStrategy(**kwargs)


def test_cli_controller_object_with_its_own_options():
    from lightning_hetero.planning import LBBSPController

    cli = _cli(
        [
            "--trainer.strategy=lightning_hetero.HeteroStrategy",
            "--trainer.strategy.controller=lightning_hetero.planning.LBBSPController",
            "--trainer.strategy.controller.predictor=narx",
            "--trainer.strategy.max_batch_size=auto",
            "--trainer.accelerator=cpu",
            "--trainer.devices=1",
        ]
    )
    strategy = cli.trainer.strategy
    assert isinstance(strategy.controller, LBBSPController)
    assert strategy.controller.predictor == "narx"
    assert strategy.plan_state.max_batch_size == "auto"


@pytest.mark.parametrize("name", ["proportional", "lbbsp", "stepwise", "updates", "static"])
def test_every_controller_is_selectable_by_name(name):
    strategy = HeteroStrategy(controller=name, deadband=0.1)
    assert strategy.controller.name == name
    if name != "static":
        assert strategy.controller.deadband == 0.1


def test_bare_strategy_sets_up_its_environment_and_takes_ddp_positional_arguments():
    # Lightning's own tests use a strategy without a LightningModule for its collectives,
    # built with DDPStrategy's positional arguments.
    # The gloo group is destroyed at exit while the interpreter is alive (left to finalization
    # it can abort a successful run with SIGABRT); a handler registered first runs last.
    code = """
import atexit
import torch
atexit.register(lambda: print("destroyed", not torch.distributed.is_initialized()))
from lightning.fabric.plugins.environments import LightningEnvironment
from lightning.pytorch.accelerators import CPUAccelerator
from lightning_hetero import HeteroStrategy

strategy = HeteroStrategy(CPUAccelerator(), [torch.device("cpu")], LightningEnvironment())
strategy.setup_environment()
assert strategy.reduce(torch.tensor(3.0)).item() == 3.0
strategy.barrier()
assert strategy.broadcast("x") == "x"
print("ok")
"""
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=120, env=child_env()
    )
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.split()[-3:] == ["ok", "destroyed", "True"], proc.stdout


def test_batchnorm_model_that_would_get_one_sample_per_rank_fails_naming_the_option():
    class Normed(_Model):
        def __init__(self, loader_fn):
            super().__init__(loader_fn)
            self.layer = torch.nn.Sequential(torch.nn.Linear(32, 2), torch.nn.BatchNorm1d(2))

    with pytest.raises(PlanError, match="BatchNorm.*`min_batch_size` defaults to 2"):
        _fit(lambda: DataLoader(RandomDataset(32, 16), batch_size=1), model_class=Normed)


@pytest.mark.parametrize(
    ("mode", "shown", "hidden"),
    [
        ("bsp", "step time (s)", "staleness per rank (server versions)"),
        ("async", "staleness per rank (server versions)", "step time (s)"),
    ],
)
def test_the_tensorboard_layout_charts_only_what_the_mode_logs(
    tmp_path, monkeypatch, mode, shown, hidden
):
    from lightning.pytorch.loggers import TensorBoardLogger
    from torch.utils.tensorboard import SummaryWriter

    layouts = []
    monkeypatch.setattr(
        SummaryWriter, "add_custom_scalars", lambda self, layout: layouts.append(layout)
    )
    _fit(
        lambda: DataLoader(RandomDataset(32, 16), batch_size=4),
        trainer_options={"logger": TensorBoardLogger(tmp_path)},
        mode=mode,
    )
    assert len(layouts) == 1
    charts = layouts[0]["hetero"]
    assert shown in charts and hidden not in charts
    assert "batch size per rank" in charts


def test_metrics_are_logged_at_lightnings_step_and_are_in_callback_metrics(tmp_path):
    from lightning.pytorch.loggers import CSVLogger

    class Logged(_Model):
        def training_step(self, batch, batch_idx):
            output = super().training_step(batch, batch_idx)
            self.log("train_loss", output["loss"])
            return output

    trainer = _fit(
        lambda: DataLoader(RandomDataset(32, 16), batch_size=4),
        model_class=Logged,
        trainer_options={"logger": CSVLogger(tmp_path), "log_every_n_steps": 1},
        adjust_every=2,
        replan_budget=None,  # a boundary every 2 batches (the test reads them), however short
    )
    with open(trainer.logger.log_dir + "/metrics.csv") as f:
        rows = list(csv.DictReader(f))
    ours = [int(r["step"]) for r in rows if r.get("hetero/balance")]
    lightnings = [int(r["step"]) for r in rows if r.get("train_loss")]
    # boundaries after batches 1 and 3 of each 4-batch epoch: Lightning logs those at 1, 3, ...
    assert ours[:2] == [1, 3] and set(ours) <= set(lightnings)
    last = trainer.strategy.history[-1]
    assert trainer.callback_metrics["hetero/balance"].item() == pytest.approx(last["balance"])
    assert trainer.callback_metrics["hetero/batch_size/rank0"].item() == 4
    assert trainer.callback_metrics["hetero/deadband"].item() == pytest.approx(last["deadband"])


class DataLoader2(DataLoader):
    """A loader class of another library, named DataLoader there too (PyG's, say)."""


DataLoader2.__qualname__ = DataLoader2.__name__ = "DataLoader"
DataLoader2.__module__ = "torch_geometric.loader.dataloader"


def test_a_replaced_loader_is_named_by_its_qualified_name():
    with pytest.warns(
        UserWarning,
        match=r"^hetero: HeteroStrategy replaces the training"
        r" torch_geometric\.loader\.dataloader\.DataLoader"
        r" by a plain torch\.utils\.data\.DataLoader",
    ):
        _fit(
            lambda: DataLoader2(RandomDataset(32, 16), batch_size=4),
            trainer_options={"max_epochs": 1},
        )


def test_ddps_unused_parameters_error_names_the_hetero_option():
    """Lightning's advice (`strategy='ddp_find_unused_parameters_true'`) would drop hetero."""
    error = RuntimeError(
        "Expected to have finished reduction in the prior iteration before starting a new one."
    )
    HeteroStrategy().on_exception(error)
    (message,) = error.args
    assert message.startswith("It looks like your LightningModule has parameters that were")
    assert "pass `strategy=HeteroStrategy(find_unused_parameters=True)`" in message
    assert "would train with plain DDP instead" in message


def test_the_cli_example_prints_the_strategy_options(monkeypatch, capsys):
    examples = Path(__file__).resolve().parents[1] / "examples"
    monkeypatch.syspath_prepend(str(examples))  # cli.py imports train.py from its folder
    spec = importlib.util.spec_from_file_location("cli_example", examples / "cli.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    with pytest.raises(SystemExit) as exited:
        cli.main(["fit", "--print_config"])
    assert exited.value.code == 0
    printed = capsys.readouterr().out
    assert "strategy: auto" not in printed
    assert "class_path: lightning_hetero.HeteroStrategy" in printed
    for option in ("mode: bsp", "deadband: auto", "batch_sizes: uniform", "adjust_every: epoch"):
        assert f"      {option}\n" in printed  # under init_args


def test_the_cli_page_quotes_lightnings_error_for_an_unregistered_strategy_name():
    # what a LightningCLI script that never imports lightning_hetero gets for strategy=hetero
    page = (Path(__file__).resolve().parents[1] / "docs" / "cli.md").read_text()
    quoted = page.split("```text\n", 1)[1].split("\n```", 1)[0]
    quoted = " ".join(quoted.split())
    assert quoted.startswith(
        "ValueError: You selected an invalid strategy name: `strategy='hetero'`."
    )
    with pytest.raises(ValueError) as error:
        pl.Trainer(strategy="not_imported", logger=False)
    assert f"ValueError: {error.value}" == quoted.replace("'hetero'", "'not_imported'")
