"""Training on Ray Train workers: exactness, convergence, resume on another worker count."""

import json
from pathlib import Path

import pytest
import torch

from lightning_hetero.planning import proportional_split
from tests.ray import workloads
from tests.ray.conftest import fit_on_ray


def _grads_of_the_union_batch() -> dict[str, torch.Tensor]:
    x, y = workloads.regression_data().tensors
    net = workloads.initial_net()
    loss = torch.nn.functional.mse_loss(net(x), y)
    grads = torch.autograd.grad(loss, list(net.parameters()))
    return {f"net.{name}": g for (name, _), g in zip(net.named_parameters(), grads)}


@pytest.fixture(scope="module")
def trained(ray_cluster, tmp_path_factory) -> tuple[Path, object]:
    """Exact steps, then 3 BSP epochs with a throttled rank 1, on 2 Ray workers."""
    out = tmp_path_factory.mktemp("ray_train")
    config = {"out": str(out), "epochs": 3, "record": "train.json"}
    result = fit_on_ray(workloads.exact_and_train, config, 2, out / "storage")
    return out, result


def test_an_uneven_step_equals_one_process_on_the_union_batch(trained) -> None:
    out, _ = trained
    expected = _grads_of_the_union_batch()
    got = torch.load(out / "ddp_grads.pt")
    assert got.keys() == expected.keys()
    for name, grad in expected.items():
        torch.testing.assert_close(got[name], grad, atol=1e-5, rtol=0)


def test_an_uneven_sharded_step_equals_one_process_on_the_union_batch(trained) -> None:
    out, _ = trained
    net = workloads.initial_net()
    expected = {
        f"net.{name}": p.detach() - 0.1 * _grads_of_the_union_batch()[f"net.{name}"]
        for name, p in net.named_parameters()
    }
    got = torch.load(out / "fsdp.pt")
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=0)


def test_training_converges_and_moves_work_off_the_slow_worker(trained) -> None:
    out, result = trained
    rows = json.loads((out / "train.json").read_text())
    assert rows["world_size"] == 2 and rows["device"] == "cpu"
    losses, final = rows["losses"], rows["final_plan"]
    assert len(losses) == 3 and losses[-1] < 0.5 * losses[0], losses
    assert sum(final) == 32 and final[1] < final[0], rows  # rank 1 is throttled
    # Ray got the epoch's metrics, ours included, and a checkpoint through `train.report`
    assert result.metrics["epoch"] == 2
    assert result.metrics["hetero/batch_size/rank1"] == rows["plans"][-1][1]
    assert result.checkpoint is not None


def test_a_resume_on_three_workers_plans_from_the_saved_throughputs(trained, tmp_path) -> None:
    out, result = trained
    with result.checkpoint.as_directory() as folder:
        state = torch.load(Path(folder) / "checkpoint.ckpt", weights_only=False)
    hetero = state["callbacks"]["HeteroCallback"]
    saved = hetero["ranks"]
    # the checkpoint holds the last epoch's boundary (HeteroCallback ran before Ray's report)
    assert hetero["batch_sizes"] == json.loads((out / "train.json").read_text())["final_plan"]
    speeds = [r["samples_per_s"] for r in saved]
    assert len(saved) == 2 and all(s > 0 for s in speeds), saved

    config = {"out": str(tmp_path), "epochs": 4, "record": "resume.json"}
    fit_on_ray(workloads.train_bsp, config, 3, out / "storage")  # the same run, restored
    rows = json.loads((tmp_path / "resume.json").read_text())
    assert rows["world_size"] == 3 and len(rows["losses"]) == 1  # epoch 3 only
    # ranks 0 and 1 come back on the same host and local rank: their saved throughputs;
    # rank 2 is new and gets their mean
    weights = [speeds[0], speeds[1], sum(speeds) / 2]
    start = rows["plans"][0]
    assert start == proportional_split(weights, 32, [1] * 3, [32] * 3)
    assert start[1] < start[2] < start[0], start


def test_the_asynchronous_modes_train_on_ray(ray_cluster, tmp_path) -> None:
    config = {"out": str(tmp_path), "epochs": 2, "modes": ["async", "local"]}
    fit_on_ray(workloads.train_modes, config, 2, tmp_path / "storage")
    for mode in config["modes"]:
        rows = json.loads((tmp_path / f"{mode}.json").read_text())
        assert rows["world_size"] == 2 and len(rows["losses"]) == 2, (mode, rows)
        assert rows["losses"][-1] < rows["losses"][0], (mode, rows["losses"])
        assert sum(rows["final_plan"]) == 32, (mode, rows)
