"""Micro-batches (``micro_batch_size``): the optimizer step is one step on the union batch."""

import json

import pytest
import torch

from lightning_hetero.microbatch import micro_sizes
from tests.e2e.launch import run_script
from tests.e2e.micro_step import dataset, initial_layer

pytestmark = pytest.mark.e2e


def reference(plan, bounds, steps, clip=0.0, bf16=False, lr=0.1, deep=False):
    """``steps`` SGD steps on the union batch, each the gradient of its mean loss (with
    autocast: the sum of each micro-batch's gradient weighted by its samples / B)."""
    x, y = dataset(sum(plan)).tensors
    layer = initial_layer(deep)
    params = list(layer.parameters())
    total = sum(plan)
    for _ in range(steps):
        grads = [torch.zeros_like(p) for p in params]
        start = 0
        for samples, bound in zip(plan, bounds):
            for size in micro_sizes(samples, bound) if bf16 else [samples]:
                xs, ys = x[start : start + size], y[start : start + size]
                with torch.autocast("cpu", dtype=torch.bfloat16, enabled=bf16):
                    loss = torch.nn.functional.mse_loss(layer(xs).float(), ys)
                for g, part in zip(grads, torch.autograd.grad(loss, params)):
                    g += part * size / total
                start += size
        if clip:
            norm = torch.sqrt(sum((g * g).sum() for g in grads))
            grads = [g * min(1.0, clip / (norm.item() + 1e-6)) for g in grads]
        with torch.no_grad():
            for p, g in zip(params, grads):
                p -= lr * g
    return layer.state_dict(), y.mean().item()


def run(tmp_path, plan, bounds, clip=0.0, precision="32-true", steps=2, kind="ddp"):
    out = tmp_path / "micro.pt"
    args = [json.dumps(plan), json.dumps(bounds), str(clip), precision, str(steps), kind]
    run_script("micro_step.py", str(out), *args)
    return torch.load(out)


@pytest.mark.parametrize(
    ("plan", "bounds", "clip"),
    [
        # 2, 2 and 3 micro-batches (B divisible by K: Lightning averages the integer sample
        # counts of epoch means over ranks and truncates them, a separate matter)
        ([2, 3, 7], [1, 2, 3], 0.0),
        ([4, 6], [4, 4], 0.05),  # one rank whole, one in two; clipped (the norm is ~1)
    ],
)
def test_micro_batched_steps_equal_steps_on_the_union_batch(tmp_path, plan, bounds, clip):
    got = run(tmp_path, plan, bounds, clip=clip)
    expected, target_mean = reference(plan, bounds, steps=2, clip=clip)
    for name, value in expected.items():
        torch.testing.assert_close(got["state"][name], value, atol=1e-5, rtol=0)
    for rank, (samples, bound) in enumerate(zip(plan, bounds)):
        assert got["seen"][rank] == micro_sizes(samples, bound) * 2  # each step's parts
    # self.log(on_epoch=True) weighs each micro-batch by its own samples
    assert got["target_mean"] == pytest.approx(target_mean, abs=1e-5)


def test_one_micro_batch_beside_eight_finishes_exactly_under_bf16(tmp_path):
    plan, bounds = [2, 8], [2, 1]
    got = run(tmp_path, plan, bounds, precision="bf16-mixed", steps=3)
    assert got["seen"] == [[2] * 3, [1] * 24]
    expected, _ = reference(plan, bounds, steps=3, bf16=True)
    # bf16 rounds each backward's gradients after the loss was scaled (as it rounds DDP's
    # or any accumulation's): exact to bf16's precision (8 bits), not to float32's
    for name, value in expected.items():
        torch.testing.assert_close(got["state"][name], value, atol=2e-3, rtol=0)


def test_a_resumed_run_keeps_the_plan_and_the_bounds_and_stays_exact(tmp_path):
    plan, bounds = [3, 7], [2, 3]  # B = 10, as the script's global_batch_size
    run_script("micro_resume.py", str(tmp_path), json.dumps(plan), json.dumps(bounds))
    got = torch.load(tmp_path / "resumed.pt")
    assert got["plan"] == plan  # from the checkpoint, not the resumed run's uniform start
    assert got["seen"] == [micro_sizes(3, 2), micro_sizes(7, 3)]  # the second epoch's step
    expected, _ = reference(plan, bounds, steps=2)
    for name, value in expected.items():
        torch.testing.assert_close(got["state"][name], value, atol=1e-5, rtol=0)


# FSDP2's collectives in one ordinary step, in order, with the elements of each output (2
# ranks; dim 0 padded to even shards: Linear(5, 4) gathers 20 + 4, Linear(4, 1) 2 x 4 + 2).
# Each Linear a unit: the forward gathers both, the backward the second and (prefetch) the
# first, then reduce-scatters each. The model as one root unit: the root stays gathered from
# forward to backward.
ONE_STEP = {
    "fsdp": [f"all_gather_single {n}" for n in (24, 10, 10, 24)]
    + ["reduce_scatter_single 5", "reduce_scatter_single 12"],
    "fsdp_root": ["all_gather_single 34", "reduce_scatter_single 17"],
}


@pytest.mark.parametrize(
    ("kind", "precision", "clip", "tolerance"),
    [("fsdp", "32-true", 0.0, 1e-5), ("fsdp_root", "bf16-mixed", 0.05, 2e-3)],
)
def test_sharded_micro_batches_eight_beside_one_issue_one_steps_collectives_exactly(
    tmp_path, kind, precision, clip, tolerance
):
    """HeteroFSDPStrategy: rank 0 runs 8 micro-batches, rank 1 one; both issue the
    collectives of one ordinary step (else they would hang: the run has a timeout), and the
    step is one step on the union batch."""
    plan, bounds, steps = [16, 4], [2, 4], 2
    got = run(tmp_path, plan, bounds, clip=clip, precision=precision, steps=steps, kind=kind)
    assert got["seen"] == [[2] * 8 * steps, [4] * steps]
    assert got["collectives"] == [ONE_STEP[kind] * steps] * 2
    bf16 = precision == "bf16-mixed"
    expected, _ = reference(plan, bounds, steps=steps, clip=clip, bf16=bf16, deep=True)
    assert got["state"].keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got["state"][name], value, atol=tolerance, rtol=0, msg=name)
    start = initial_layer(deep=True).state_dict()  # the steps moved the parameters
    assert any((got["state"][n] - start[n]).abs().max() > 1e-3 for n in start)


def test_auto_bounds_under_fsdp_probe_held_micro_batches_in_lock_step_and_stay_exact(tmp_path):
    """HeteroFSDPStrategy(micro_batch_size="auto"): both ranks probe each size as two
    micro-batches held as in training, issuing one ordinary step's collectives per size (a
    rank out of step would hang: the run has a timeout); the gathered bounds become the
    micro-batch bounds and the steps stay exact."""
    from tests.e2e.micro_step import PROBE_SIZES

    plan, steps = [16, 4], 2
    got = run(tmp_path, plan, "auto", steps=steps, kind="fsdp")
    probe, bounds = got["probe"], got["micro_bounds"]
    assert probe["micro_batches"] == 2 and [s for s, _ in probe["samples"]] == PROBE_SIZES
    assert bounds == probe["max_batch_sizes"] and len(bounds) == 2 and min(bounds) >= 1
    held = [size for size in PROBE_SIZES for _ in range(2)]  # two micro-batches per size
    for rank, (samples, bound) in enumerate(zip(plan, bounds)):
        assert got["seen"][rank] == held + micro_sizes(samples, bound) * steps
    assert got["collectives"] == [ONE_STEP["fsdp"] * (len(PROBE_SIZES) + steps)] * 2
    expected, _ = reference(plan, plan, steps=steps, deep=True)
    for name, value in expected.items():
        torch.testing.assert_close(got["state"][name], value, atol=1e-5, rtol=0, msg=name)
