"""RayHeteroStrategy's contract with Ray and Lightning, and the example program."""

import ast
import inspect
import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path
from types import SimpleNamespace

import lightning.pytorch as pl
import pytest
from lightning.fabric.plugins.environments import (
    KubeflowEnvironment,
    LightningEnvironment,
    SLURMEnvironment,
)
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
        # none until the Trainer gives one: Ray's guide gives it in `plugins`
        assert strategy.cluster_environment is None
        given = RayLightningEnvironment()
        strategy.cluster_environment = given  # as the Trainer does with `plugins`
        assert strategy.cluster_environment is given
        # with no `plugins` the Trainer gives what it detects: Ray's instead
        strategy.cluster_environment = LightningEnvironment()
        assert type(strategy.cluster_environment) is RayLightningEnvironment
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
    # the setter refuses or replaces any other environment; Ray's own check stays in ours
    fsdp._ray_environment = LightningEnvironment()
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


def test_an_environment_that_is_not_rays_is_refused_by_name(monkeypatch) -> None:
    with pytest.raises(ValueError, match=r"RayHeteroStrategy.*got SLURMEnvironment.*plugins"):
        RayHeteroStrategy(cluster_environment=SLURMEnvironment())
    # in `plugins`: one the Trainer would not pick itself (not detected here)
    monkeypatch.delenv("KUBERNETES_PORT", raising=False)
    for strategy in (RayHeteroStrategy(), RayHeteroFSDPStrategy()):
        name = type(strategy).__name__
        with pytest.raises(ValueError, match=rf"{name}.*got KubeflowEnvironment"):
            pl.Trainer(strategy=strategy, plugins=[KubeflowEnvironment()], logger=False)


def test_options_that_ray_owns_are_refused_with_where_they_go() -> None:
    with pytest.raises(ValueError, match=r"process_group_backend='nccl'.*TorchConfig\(backend"):
        RayHeteroStrategy(process_group_backend="nccl")
    with pytest.raises(ValueError, match=r"start_method='spawn'.*TorchConfig"):
        RayHeteroStrategy(start_method="spawn")
    with pytest.raises(ValueError, match=r"RayHeteroFSDPStrategy.*TorchConfig\(backend"):
        RayHeteroFSDPStrategy(process_group_backend="gloo")


def test_micro_batches_are_the_plain_strategies_on_ray() -> None:
    # RayHeteroFSDPStrategy is HeteroFSDPStrategy's micro-batches: "auto" probes held
    # micro-batches as there (the class flag comes with it), bad values are refused as there
    assert RayHeteroStrategy(micro_batch_size="auto").micro_batch_size == "auto"
    assert RayHeteroFSDPStrategy(micro_batch_size=[2, 8]).micro_batch_size == [2, 8]
    sharded = RayHeteroFSDPStrategy(micro_batch_size="auto")
    assert sharded.micro_batch_size == "auto" and sharded.micro_batches_hold_more
    assert not RayHeteroStrategy().micro_batches_hold_more
    with pytest.raises(ValueError, match="micro_batch_size"):
        RayHeteroFSDPStrategy(micro_batch_size=0)


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


def _run_example(address: str, storage: Path, *args: str) -> str:
    proc = subprocess.run(
        [sys.executable, str(EXAMPLE), "--address", address, "--epochs", "1"]
        + ["--storage", str(storage), *args],
        capture_output=True,
        text=True,
        timeout=600,  # a start of Ray's worker group took minutes on a loaded machine
        env={**os.environ, "RAY_USAGE_STATS_ENABLED": "0"},
        cwd=storage,
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stdout


def test_the_example_trains_on_the_running_cluster(ray_cluster, tmp_path) -> None:
    address = ray_cluster.get_runtime_context().gcs_address
    out = _run_example(address, tmp_path)
    line = next(row for row in out.splitlines() if row.startswith("final batch sizes"))
    sizes = [int(s) for s in line.split("[")[1].rstrip("]").split(",")]
    assert len(sizes) == 2 and sum(sizes) == 64  # the example's global batch
    assert "of which 0.0 ms throttle" in out and "balance = T*/max t_k" in out  # explained
    # each run is new unless named: an earlier one is not silently continued
    name = next(r for r in out.splitlines() if r.startswith("run ")).split()[1]
    assert f"run {name} in {tmp_path}: new" in out
    again = _run_example(address, tmp_path, "--name", name)
    assert f"run {name} in {tmp_path}: continued from its latest checkpoint" in again


def test_rays_guide_program_trains_with_only_the_strategy_swapped(ray_cluster, tmp_path) -> None:
    from tests.ray import workloads
    from tests.ray.conftest import fit_on_ray

    fit_on_ray(workloads.guide_program, {"out": str(tmp_path), "epochs": 2}, 2, tmp_path / "s")
    runs = json.loads((tmp_path / "guide.json").read_text())
    with_plugin, without = runs
    assert with_plugin["type"] == without["type"] == "RayLightningEnvironment"
    assert with_plugin["given"]  # the guide's own instance
    for run in runs:
        assert run["world_size"] == 2 and sum(run["batch_sizes"]) == 32  # 2 x 16
        assert run["global_step"] == 2 * 256 // 32  # 2 epochs of the whole data set
        assert run["loss"] < 1.0
