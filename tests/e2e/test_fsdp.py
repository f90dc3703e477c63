"""HeteroFSDPStrategy end to end: exact gradients on uneven batches (3 gloo ranks)."""

import pytest
import torch

from tests.e2e.fsdp_step import CLIP, PLAN, STEPS, dataset, initial_model
from tests.e2e.launch import run_script


def _expected(variant: str) -> dict[str, torch.Tensor]:
    """One SGD step of a single process on the union batch (the mean loss over B samples)."""
    model = initial_model()
    x, y = dataset().tensors
    total, micro = sum(PLAN), STEPS.get(variant, 1)
    for step in range(micro):
        xs, ys = x[step * total : (step + 1) * total], y[step * total : (step + 1) * total]
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=variant == "bf16"):
            loss = torch.nn.functional.mse_loss(model(xs), ys) / micro
        loss.backward()
    if variant == "clip":
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    with torch.no_grad():
        for param in model.parameters():
            param -= 0.1 * param.grad
    return {f"net.{k}": v for k, v in model.state_dict().items()}


@pytest.mark.parametrize(
    ("variant", "tolerance"),
    [("plain", 1e-5), ("clip", 1e-5), ("accumulate", 1e-5), ("user_sharded", 1e-5), ("bf16", 2e-2)],
)
def test_a_sharded_step_on_uneven_batches_equals_one_step_on_the_union_batch(
    tmp_path, variant, tolerance
):
    out = tmp_path / "params.pt"
    run_script("fsdp_step.py", variant, str(out))
    got = torch.load(out)
    expected = _expected(variant)
    assert got.keys() == expected.keys()
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=tolerance, rtol=tolerance, msg=name)
    # the step moved the parameters: equal parameters would pass trivially otherwise
    start = {f"net.{k}": v for k, v in initial_model().state_dict().items()}
    assert any((got[name] - start[name]).abs().max() > 1e-3 for name in start)
