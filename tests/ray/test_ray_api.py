"""RayHeteroStrategy's contract with Ray and Lightning, and the example program."""

import ast
import inspect
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
from lightning.pytorch.plugins.environments import LightningEnvironment
from ray.train.lightning import RayDDPStrategy, RayFSDPStrategy, RayLightningEnvironment
from ray.train.lightning import prepare_trainer as ray_prepare_trainer

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy
from lightning_hetero.integrations.ray import (
    RayHeteroFSDPStrategy,
    RayHeteroStrategy,
    prepare_trainer,
)

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "ray_train.py"


def _trainer(strategy: object) -> pl.Trainer:
    return pl.Trainer(accelerator="cpu", devices=1, strategy=strategy, logger=False)


def test_the_strategies_are_rays_and_bring_rays_environment() -> None:
    ddp, fsdp = RayHeteroStrategy(mode="local"), RayHeteroFSDPStrategy()
    assert isinstance(ddp, RayDDPStrategy) and isinstance(ddp, HeteroStrategy)
    assert isinstance(fsdp, HeteroFSDPStrategy)
    for strategy in (ddp, fsdp):
        assert isinstance(strategy.cluster_environment, RayLightningEnvironment)
        # Ray checks the trainer's strategy only (a Trainer with Ray's environment can be built
        # in Ray's workers only)
        trainer = SimpleNamespace(strategy=strategy)
        assert prepare_trainer(trainer) is trainer
    assert ray_prepare_trainer(SimpleNamespace(strategy=ddp)).strategy is ddp


def test_the_fsdp2_strategy_is_no_ray_fsdp1_strategy_for_anyone_else() -> None:
    # no process-wide registration: Ray's own check still refuses it, ours prepares it
    fsdp = RayHeteroFSDPStrategy()
    assert not isinstance(fsdp, RayFSDPStrategy)
    with pytest.raises(RuntimeError, match="Invalid strategy class"):
        ray_prepare_trainer(SimpleNamespace(strategy=fsdp))
    fsdp.cluster_environment = LightningEnvironment()
    with pytest.raises(RuntimeError, match=r"RayLightningEnvironment.*LightningEnvironment"):
        prepare_trainer(SimpleNamespace(strategy=fsdp))


def test_rays_prepare_trainer_makes_only_the_checks_ours_makes_for_the_fsdp2_strategy() -> None:
    # ours makes Ray's checks for RayHeteroFSDPStrategy instead of calling Ray's function:
    # when Ray's prepare_trainer does something more, this fails, so that ours does it too
    tree = ast.parse(textwrap.dedent(inspect.getsource(inspect.unwrap(ray_prepare_trainer))))
    body = [ast.unparse(statement) for statement in tree.body[0].body]  # type: ignore[attr-defined]
    if body[0].startswith(("'", '"')):
        body = body[1:]  # the docstring
    checks = [s for s in body if s.startswith("if ")]
    assert len(checks) == 2 and all("raise RuntimeError" in s for s in checks), body
    assert "valid_strategy_class" in checks[0] and "RayLightningEnvironment" in checks[1]
    rest = [s for s in body if s not in checks]
    assert rest[0].startswith("valid_strategy_class = [RayDDPStrategy, RayFSDPStrategy")
    assert rest[1] == "cluster_environment = getattr(trainer.strategy, 'cluster_environment', None)"
    assert rest[2].startswith("record_extra_usage_tag(")  # Ray's usage statistics
    assert rest[3:] == ["return trainer"]


@pytest.mark.parametrize(
    ("strategy", "use"),
    [(HeteroStrategy(), "RayHeteroStrategy"), (HeteroFSDPStrategy(), "RayHeteroFSDPStrategy")],
)
def test_a_plain_strategy_is_refused_with_the_ray_class_to_use(strategy, use) -> None:
    trainer = _trainer(strategy)
    with pytest.raises(TypeError, match=rf"{type(strategy).__name__}.*integrations\.ray\.{use}"):
        prepare_trainer(trainer)
    # Ray's own check refuses it too (naming its own classes)
    with pytest.raises(RuntimeError, match="RayDDPStrategy"):
        ray_prepare_trainer(trainer)


def test_options_that_ray_owns_are_refused_with_where_they_go() -> None:
    with pytest.raises(ValueError, match=r"process_group_backend='nccl'.*TorchConfig\(backend"):
        RayHeteroStrategy(process_group_backend="nccl")
    with pytest.raises(ValueError, match=r"start_method='spawn'.*TorchConfig"):
        RayHeteroStrategy(start_method="spawn")
    with pytest.raises(ValueError, match=r"RayHeteroFSDPStrategy.*TorchConfig\(backend"):
        RayHeteroFSDPStrategy(process_group_backend="gloo")


def test_pytorch_lightning_is_refused_with_the_copy_ray_uses() -> None:
    pytorch_lightning = pytest.importorskip("pytorch_lightning")
    with pytest.raises(TypeError, match=r"RayHeteroStrategy is built on lightning\.pytorch.*Ray"):
        pytorch_lightning.Trainer(accelerator="cpu", devices=1, strategy=RayHeteroStrategy())

    class PLModule(pytorch_lightning.LightningModule):
        pass

    with pytest.raises(TypeError, match=r"PLModule is from pytorch_lightning.*lightning\.pytorch"):
        RayHeteroStrategy().connect(PLModule())


def test_modes_with_a_side_channel_need_the_jobs_main_address(monkeypatch) -> None:
    monkeypatch.delenv("MASTER_ADDR", raising=False)
    with pytest.raises(RuntimeError, match=r"mode='async'.*MASTER_ADDR.*init_method='env'"):
        RayHeteroStrategy(mode="async")._check_side_channel()
    RayHeteroStrategy(mode="bsp")._check_side_channel()  # BSP needs only the process group


def test_the_example_trains_on_the_running_cluster(ray_cluster, tmp_path) -> None:
    address = ray_cluster.get_runtime_context().gcs_address
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--address", address, "--epochs", "1"]
        + ["--storage", str(tmp_path)],
        capture_output=True,
        text=True,
        timeout=300,
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    line = next(row for row in proc.stdout.splitlines() if row.startswith("final batch sizes"))
    sizes = [int(s) for s in line.split("[")[1].rstrip("]").split(",")]
    assert len(sizes) == 2 and sum(sizes) == 64  # the example's global batch
