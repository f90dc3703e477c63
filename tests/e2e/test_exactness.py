import torch

from tests.e2e.exact_step import PLAN, dataset, initial_layer
from tests.e2e.launch import run_script


def sgd_step(grads, layer, lr=0.1):
    return {name: p.detach() - lr * g for (name, p), g in zip(layer.named_parameters(), grads)}


def mean_loss_grads(layer, x, y):
    loss = torch.nn.functional.mse_loss(layer(x), y)
    return torch.autograd.grad(loss, list(layer.parameters()))


def test_weighted_step_on_uneven_batches_equals_one_step_on_the_union_batch(tmp_path):
    out = tmp_path / "weighted.pt"
    run_script("exact_step.py", "1", str(out))
    x, y = dataset().tensors
    layer = initial_layer()
    expected = sgd_step(mean_loss_grads(layer, x, y), layer)
    got = torch.load(out)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=0)


def test_unweighted_step_equals_ddp_plain_mean_of_rank_gradients(tmp_path):
    out = tmp_path / "plain.pt"
    run_script("exact_step.py", "0", str(out))
    x, y = dataset().tensors
    layer = initial_layer()
    bounds = [0, *torch.tensor(PLAN).cumsum(0).tolist()]
    per_rank = [mean_loss_grads(layer, x[a:b], y[a:b]) for a, b in zip(bounds, bounds[1:])]
    mean = [sum(g[i] for g in per_rank) / len(PLAN) for i in range(len(per_rank[0]))]
    expected = sgd_step(mean, layer)
    union = sgd_step(mean_loss_grads(layer, x, y), layer)
    got = torch.load(out)
    for name, value in expected.items():
        torch.testing.assert_close(got[name], value, atol=1e-5, rtol=0)
    assert any((got[n] - union[n]).abs().max() > 1e-4 for n in union), "plain mean should differ"
