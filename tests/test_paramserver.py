"""The parameter server of async mode, in one process (the RPC path is covered end to end)."""

import threading

import pytest
import torch

from lightning_hetero.paramserver import ParameterServer


def server_for(lr: float = 0.5, momentum: float = 0.0, lr_scaling: bool = True, world_size=3):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=lr, momentum=momentum)
    return layer, optimizer, ParameterServer([optimizer], world_size, lr_scaling=lr_scaling)


def test_applied_step_is_lr_times_batch_share_times_gradient():
    layer, _, server = server_for(lr=0.5)
    before = [p.detach().clone() for p in layer.parameters()]
    grads = [torch.randn_like(p) for p in before]
    result = server.push(1, 0, grads, 24, 96, [0.5], 0)
    for old, new, grad in zip(before, result.params, grads):
        torch.testing.assert_close(new, old - 0.5 * 24 / 96 * grad)
    assert result.version == 1


def test_without_lr_scaling_the_full_learning_rate_is_applied():
    layer, _, server = server_for(lr=0.5, lr_scaling=False)
    before = [p.detach().clone() for p in layer.parameters()]
    grads = [torch.ones_like(p) for p in before]
    result = server.push(0, 0, grads, 24, 96, [0.5], 0)
    for old, new in zip(before, result.params):
        torch.testing.assert_close(new, old - 0.5)


def test_an_update_factor_scales_the_step_on_top_of_the_batch_share():
    layer, _, server = server_for(lr=0.5)
    before = [p.detach().clone() for p in layer.parameters()]
    grads = [torch.randn_like(p) for p in before]
    result = server.push(2, 0, grads, 24, 96, [0.5], 0, 0.8)
    for old, new, grad in zip(before, result.params, grads):
        torch.testing.assert_close(new, old - 0.5 * 24 / 96 * 0.8 * grad)


def test_the_pushed_learning_rate_is_used_and_kept_unscaled_in_the_state():
    layer, _, server = server_for(lr=0.5)
    before = [p.detach().clone() for p in layer.parameters()]
    grads = [torch.ones_like(p) for p in before]
    result = server.push(0, 0, grads, 10, 20, [0.1], 0)  # the rank's scheduler says 0.1
    for old, new in zip(before, result.params):
        torch.testing.assert_close(new, old - 0.1 * 0.5)
    assert server.optimizer_state(0)["param_groups"][0]["lr"] == 0.1


def test_server_owns_a_copy_the_users_parameters_do_not_move():
    layer, _, server = server_for()
    before = [p.detach().clone() for p in layer.parameters()]
    server.push(0, 0, [torch.ones_like(p) for p in before], 1, 2, [0.5], 0)
    for old, param in zip(before, layer.parameters()):
        assert torch.equal(old, param)


def test_momentum_state_is_the_servers_and_survives_a_state_dict_round_trip():
    layer, optimizer, server = server_for(momentum=0.9)
    grads = [torch.ones_like(p) for p in layer.parameters()]
    server.push(0, 0, grads, 1, 2, [0.5], 0)
    state = server.optimizer_state(0)
    assert len(state["state"]) == 2 and "momentum_buffer" in state["state"][0]
    optimizer.load_state_dict(state)  # as a resume would: the server is rebuilt from it
    with torch.no_grad():
        for param, value in zip(layer.parameters(), server.pull(0).params):
            param.copy_(value)
    twin = ParameterServer([optimizer], 3)
    a = server.push(1, 0, grads, 1, 2, [0.5], 1)
    b = twin.push(1, 0, grads, 1, 2, [0.5], 0)
    for x, y in zip(a.params, b.params):
        torch.testing.assert_close(x, y)


def test_staleness_is_the_number_of_updates_since_the_pull():
    layer, _, server = server_for()
    grads = [torch.zeros_like(p) for p in layer.parameters()]
    server.push(0, 0, grads, 1, 3, [0.5], 0)  # staleness 0
    server.push(1, 0, grads, 1, 3, [0.5], 0)  # rank 1 pulled version 0: staleness 1
    server.push(2, 0, grads, 1, 3, [0.5], 0)  # staleness 2
    server.push(1, 0, grads, 1, 3, [0.5], 2)  # staleness 1
    stats = server.take_epoch_stats()
    assert stats["updates"] == [1.0, 2.0, 1.0]
    assert stats["staleness"] == [0.0, 1.0, 2.0]
    assert stats["staleness_max"] == [0.0, 1.0, 2.0]
    assert server.take_epoch_stats()["updates"] == [0.0, 0.0, 0.0]  # reset per epoch
    assert server.updates == [1, 2, 1]  # since the start


def test_concurrent_pushes_lose_no_update():
    layer, _, server = server_for(lr=1.0, lr_scaling=False, world_size=4)
    before = [p.detach().clone() for p in layer.parameters()]
    grads = [torch.full_like(p, 1e-3) for p in before]
    pushes = 50

    def worker(rank: int) -> None:
        for _ in range(pushes):
            server.push(rank, 0, grads, 1, 4, [1.0], 0)

    threads = [threading.Thread(target=worker, args=(rank,)) for rank in range(4)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    assert server.updates == [pushes] * 4 and server.version == 4 * pushes
    for old, new in zip(before, server.pull(0).params):
        torch.testing.assert_close(new, old - 4 * pushes * 1e-3)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        ((0, 0, [None], 1, 2, [0.5], 0), "pushed 1 gradients"),
        ((0, 0, [None, None], 1, 2, [0.5, 0.1], 0), "2 learning rates"),
        ((0, 0, [None, None], 3, 2, [0.5], 0), "batch of 3 out of a global batch of 2"),
        ((0, 1, [None, None], 1, 2, [0.5], 0), "holds 1 optimizers"),
        ((0, 0, [None, None], 1, 2, [0.5], 0, 0.0), "update factor of 0.0"),
        ((0, 0, [None, None], 1, 2, [0.5], 0, float("nan")), "update factor of nan"),
    ],
)
def test_malformed_pushes_are_refused_with_the_reason(args, message):
    _, _, server = server_for()
    with pytest.raises((ValueError, IndexError), match=message):
        server.push(*args)
    assert server.version == 0
