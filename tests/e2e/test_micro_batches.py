"""Micro-batches (``micro_batch_size``): the optimizer step is one step on the union batch."""

import json

import pytest
import torch

from lightning_hetero.microbatch import micro_sizes
from tests.e2e.launch import run_script
from tests.e2e.micro_step import dataset, initial_layer

pytestmark = pytest.mark.e2e


def reference(plan, bounds, steps, clip=0.0, bf16=False, lr=0.1):
    """``steps`` SGD steps on the union batch, each the gradient of its mean loss (with
    autocast: the sum of each micro-batch's gradient weighted by its samples / B)."""
    x, y = dataset(sum(plan)).tensors
    layer = initial_layer()
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


def run(tmp_path, plan, bounds, clip=0.0, precision="32-true", steps=2):
    out = tmp_path / "micro.pt"
    args = [json.dumps(plan), json.dumps(bounds), str(clip), precision, str(steps)]
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
