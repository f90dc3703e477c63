"""HeteroFSDPStrategy on LightningModules written as users write them (fsdp_styles.py).

Every style must give, on the uneven plan, exactly the parameters a single process gets on
the union batch: submodules called directly, a grandchild, a module used twice, a parameter
of the LightningModule itself, manual optimization with one and two optimizers, gradient
accumulation, clipping and bf16; validation, test and predict with direct calls see the
trained model; BatchNorm statistics end equal on every rank.
"""

from pathlib import Path

import pytest
import torch

from tests.e2e.fsdp_styles import CLIP, LR, PLAN, STEPS, STYLES, Styled, dataset
from tests.e2e.launch import run_script

B = sum(PLAN)


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    out = tmp_path_factory.mktemp("fsdp_styles")
    run_script("fsdp_styles.py", str(out))
    return out


def _sgd(params) -> None:
    with torch.no_grad():
        for param in params:
            if param.grad is not None:
                param -= LR * param.grad
                param.grad = None


def _expected(style: str) -> Styled:
    """The fit of ``fsdp_styles.py`` in one process on the union of the ranks' batches."""
    model = Styled(style)
    x, y = dataset().tensors
    micro = STEPS.get(style, 1)
    if style == "two_optimizers":
        batch = [x[:B], y[:B]]
        model.loss(batch).backward()
        _sgd([*model.inp.parameters(), *model.body.parameters()])
        model.zero_grad()
        model.loss(batch).backward()
        _sgd([*model.head.parameters(), model.scale])
        return model
    for step in range(micro):
        rows = slice(step * B, (step + 1) * B)
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=style == "bf16"):
            loss = model.loss([x[rows], y[rows]]) / micro
        loss.backward()
    if style == "clip":
        torch.nn.utils.clip_grad_norm_(model.parameters(), CLIP)
    _sgd(model.parameters())
    return model


@pytest.mark.parametrize("style", [s for s in STYLES if s != "batch_norm"])
def test_each_style_steps_exactly_as_one_process_on_the_union_batch(results, style):
    got = torch.load(results / f"{style}.pt")["state"]
    model = _expected(style)
    expected = {k: v for k, v in model.state_dict().items() if k in got}
    assert got.keys() == expected.keys()
    tolerance = 2e-2 if style == "bf16" else 1e-5
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=tolerance, rtol=tolerance, msg=name)
    # the step moved the parameters used: equal parameters would pass trivially otherwise
    start = Styled(style).state_dict()
    assert (got["head.weight"] - start["head.weight"]).abs().max() > 1e-3


def test_the_memory_probe_runs_its_steps_through_the_root_and_leaves_no_trace(results):
    # its steps are undone: the `probed` style's parameters are checked exact above
    probe = torch.load(results / "probed.pt")["memory_probe"]
    assert probe is not None and len(probe["max_batch_sizes"]) == len(PLAN)
    assert probe["samples"]


def test_validation_test_and_predict_see_the_trained_model_with_direct_calls(results):
    result = torch.load(results / "direct.pt")
    model = _expected("direct").eval()
    x, y = dataset(48).tensors
    with torch.no_grad():
        loss = torch.nn.functional.mse_loss(model(x), y).item()
        expected = model(x)
    # each rank holds 16 of the 48 samples (equal shares): the synced mean is the mean
    assert result["val_loss"] == pytest.approx(loss, rel=1e-5)
    assert result["test_loss"] == pytest.approx(loss, rel=1e-5)
    for rank, predictions in enumerate(result["predictions"]):
        indices = list(range(rank, 48, len(PLAN)))  # Lightning's DistributedSampler
        torch.testing.assert_close(predictions, expected[indices], atol=1e-5, rtol=1e-5)


def test_batch_norm_statistics_end_equal_on_every_rank_weighted_by_batch(results):
    result = torch.load(results / "batch_norm.pt")
    (mean0, var0), (mean1, var1) = result["rank_buffers"]
    torch.testing.assert_close(mean0, mean1)
    torch.testing.assert_close(var0, var1)
    # one step: rank k's statistics are m * (mean, unbiased var) of its own b_k samples
    # (from 0 and 1), averaged with weights b_k / B
    model = Styled("batch_norm")
    x = dataset().tensors[0][:B]
    with torch.no_grad():
        hidden = model.inp(x)
    momentum, means, variances, start = 0.1, [], [], 0
    for size in PLAN:
        rows = hidden[start : start + size]
        means.append(momentum * rows.mean(0))
        variances.append((1 - momentum) + momentum * rows.var(0, unbiased=True))
        start += size
    weights = [size / B for size in PLAN]
    expected_mean = sum(w * m for w, m in zip(weights, means))
    expected_var = sum(w * v for w, v in zip(weights, variances))
    torch.testing.assert_close(mean0, expected_mean, atol=1e-6, rtol=1e-5)
    torch.testing.assert_close(var0, expected_var, atol=1e-6, rtol=1e-5)
    # the weighted mean of the ranks' batch means is the union batch's mean
    torch.testing.assert_close(expected_mean, momentum * hidden.mean(0), atol=1e-6, rtol=1e-5)
    assert not torch.allclose(means[0], means[1])  # the ranks did differ before averaging
