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
    server.push(1, 0, grads, 1, 2, [0.5], 1)
    twin.push(1, 0, grads, 1, 2, [0.5], 0)
    # the applied step is the same (what a push returns also moves ahead by the momentum
    # to come, from the ranks' recent pushes, which a resume learns again)
    for x, y in zip(server.pull(0).params, twin.pull(0).params):
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


def test_apply_seconds_are_counted_per_pushing_rank_and_reset_per_epoch(monkeypatch):
    layer, _, server = server_for()
    grads = [torch.zeros_like(p) for p in layer.parameters()]
    clock = iter([0.0, 0.25, 1.0, 2.0, 3.0, 3.5])  # each push reads the clock twice
    monkeypatch.setattr("lightning_hetero.paramserver.time.perf_counter", lambda: next(clock))
    server.push(0, 0, grads, 1, 3, [0.5], 0)  # 0.25 s: rank 0's own, on its training thread
    server.push(1, 0, grads, 1, 3, [0.5], 0)  # 1.0 s: served for rank 1
    server.push(1, 0, grads, 1, 3, [0.5], 0)  # 0.5 s
    stats = server.take_epoch_stats()
    assert stats["apply_s"] == [0.25, 1.5, 0.0]
    assert server.serving_s == 1.5  # only the other ranks' pushes
    monkeypatch.undo()
    assert server.take_epoch_stats()["apply_s"] == [0.0, 0.0, 0.0]


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


def _buffers(server: ParameterServer) -> list[torch.Tensor]:
    state = server.optimizer_state(0)["state"]
    return [state[i]["momentum_buffer"] for i in sorted(state)]


@pytest.mark.parametrize("nesterov", [False, True])
def test_a_push_returns_the_parameters_moved_ahead_by_the_momentum_to_come(nesterov):
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    optimizer = torch.optim.SGD(layer.parameters(), lr=0.5, momentum=0.9, nesterov=nesterov)
    server = ParameterServer([optimizer], 2)
    grads = [torch.randn_like(p) for p in layer.parameters()]
    first = server.push(1, 0, grads, 32, 128, [0.5], 0)  # nothing known of rank 0 yet
    assert all(torch.equal(a, b) for a, b in zip(first.params, server.pull(0).params))
    result = server.push(0, 0, grads, 96, 128, [0.5], 0)  # staleness 1: one push to come
    # rank 1's next push (factor 32/128) applies lr * 0.25 * mu * buffer of momentum first
    # (Nesterov's step one power of mu more), before rank 0's next gradient arrives
    ahead = 0.5 * 32 / 128 * (0.81 if nesterov else 0.9)
    exact = server.pull(0).params
    for got, param, buffer in zip(result.params, exact, _buffers(server)):
        torch.testing.assert_close(got, param - ahead * buffer)
        assert not torch.equal(got, param)


def test_lookahead_follows_the_ranks_recent_staleness_and_can_be_turned_off():
    torch.manual_seed(0)
    grads = [torch.randn(2, 4), torch.randn(2)]
    results = {}
    for lookahead in ("auto", False):
        layer = torch.nn.Linear(4, 2)
        torch.manual_seed(1)
        optimizer = torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.5)
        server = ParameterServer([optimizer], 3, lookahead=lookahead)
        server.push(1, 0, grads, 4, 12, [0.1], 0)
        server.push(2, 0, grads, 4, 12, [0.1], 0)
        results[lookahead] = (server.push(0, 0, grads, 4, 12, [0.1], 0), server)
    result, server = results["auto"]
    # rank 0's staleness 2: two pushes at the others' factor 4/12, momentum 0.5 + 0.25
    for got, param, buffer in zip(result.params, server.pull(0).params, _buffers(server)):
        torch.testing.assert_close(got, param - 0.1 * 4 / 12 * 0.75 * buffer)
    result, server = results[False]
    assert all(torch.equal(a, b) for a, b in zip(result.params, server.pull(0).params))


def test_optimizers_without_momentum_get_the_parameters_themselves():
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    grads = [torch.randn_like(p) for p in layer.parameters()]
    for optimizer in (
        torch.optim.Adam(layer.parameters(), lr=0.1),
        torch.optim.SGD(layer.parameters(), lr=0.1),
    ):
        server = ParameterServer([optimizer], 2)
        server.push(1, 0, grads, 1, 2, [0.1], 0)
        result = server.push(0, 0, grads, 1, 2, [0.1], 0)
        assert all(torch.equal(a, b) for a, b in zip(result.params, server.pull(0).params))
    with pytest.raises(ValueError, match="lookahead=True .* Adam has none"):
        ParameterServer([torch.optim.Adam(layer.parameters())], 2, lookahead=True)


def test_with_two_optimizers_the_lookahead_counts_each_ones_own_pushes():
    torch.manual_seed(0)
    a, b = torch.nn.Linear(3, 2), torch.nn.Linear(2, 1)
    optimizers = [
        torch.optim.SGD(a.parameters(), lr=0.1, momentum=0.9),
        torch.optim.SGD(b.parameters(), lr=0.2, momentum=0.9),
    ]
    server = ParameterServer(optimizers, 2)
    grads = [[torch.randn_like(p) for p in m.parameters()] for m in (a, b)]
    for rank, index in [(1, 0), (1, 1), (0, 0), (0, 1)]:  # each rank steps both, in turn
        server.push(rank, index, grads[index], 8, 16, [[0.1], [0.2]][index], 0)
    # rank 1 again: one push of rank 0's to each optimizer since its last to that one (the
    # server's version counts three); the momentum of that one push, at rank 0's 8 / 16
    result = server.push(1, 0, grads[0], 8, 16, [0.1], 2)
    state = server.optimizer_state(0)["state"]
    for got, param, i in zip(result.params, server.pull(0).params, sorted(state)):
        torch.testing.assert_close(got, param - 0.1 * 0.5 * 0.9 * state[i]["momentum_buffer"])


def test_each_parameter_group_looks_ahead_at_its_own_learning_rate():
    torch.manual_seed(0)
    layer = torch.nn.Linear(4, 2)
    groups = [{"params": [layer.weight], "lr": 0.1}, {"params": [layer.bias], "lr": 0.3}]
    server = ParameterServer([torch.optim.SGD(groups, momentum=0.9)], 2)
    grads = [torch.randn_like(p) for p in layer.parameters()]
    server.push(1, 0, grads, 1, 2, [0.1, 0.3], 0)
    result = server.push(0, 0, grads, 1, 2, [0.1, 0.3], 0)  # staleness 1, rank 1's share 1/2
    for got, param, buffer, lr in zip(
        result.params, server.pull(0).params, _buffers(server), [0.1, 0.3]
    ):
        torch.testing.assert_close(got, param - lr * 0.5 * 0.9 * buffer)


def test_joining_the_rpc_group_warns_nothing(monkeypatch):
    # issue 43: torch's TensorPipe agent gathers device maps over a backend of its own, which
    # torch then calls deprecated ("You are using a Backend ... as a ProcessGroup"), once per
    # rank on every async run; the join keeps that to itself
    import warnings

    import torch.distributed as dist

    from lightning_hetero.paramserver import RPC_PORT_ENV, ServerClient, free_port

    port = free_port("127.0.0.1")
    own = not dist.is_initialized()  # an earlier test in this process may have left one
    if own:
        dist.init_process_group(
            "gloo", init_method=f"tcp://127.0.0.1:{free_port('127.0.0.1')}", rank=0, world_size=1
        )
    elif dist.get_world_size() != 1:
        pytest.skip("a process group of several ranks is already up in this process")
    monkeypatch.setenv(RPC_PORT_ENV, str(port))
    try:
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            ServerClient.init_rpc(0, 1, "127.0.0.1", timeout=30.0, main_port=port - 1)
        assert [str(w.message) for w in caught] == []
    finally:
        ServerClient.shutdown(graceful=True)
        if own:
            dist.destroy_process_group()


def _pushed_params(server: ParameterServer, layer: torch.nn.Linear, pushes: int) -> list:
    """Push ``pushes`` random gradients from rank 0; the parameters after each push."""
    seen = []
    for _ in range(pushes):
        grads = [torch.randn_like(p) for p in layer.parameters()]
        server.push(0, 0, grads, 4, 8, [0.1], server.version)
        seen.append([p.clone() for p in server.pull(0).params])
    return seen


def test_epoch_average_replaces_the_parameters_by_the_polynomial_decay_average():
    # the n-th push enters with weight min(1, 3 / n), which telescopes to push i of n
    # weighing 3 (i - 1) (i - 2) / (n (n - 1) (n - 2)): written out here, not recurred
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    server = ParameterServer([torch.optim.SGD(layer.parameters(), lr=0.1, momentum=0.9)], 2)
    n = 9
    seen = _pushed_params(server, layer, n)
    weights = [3 * (i - 1) * (i - 2) / (n * (n - 1) * (n - 2)) for i in range(1, n + 1)]
    assert sum(weights) == pytest.approx(1.0)
    version = server.version
    assert server.settle()
    assert server.version == version + 1  # later gradients count as taken on older ones
    for index, param in enumerate(server.pull(0).params):
        expected = sum(w * params[index] for w, params in zip(weights, seen))
        torch.testing.assert_close(param, expected)
    assert not server.settle()  # no push since: nothing to average, nothing changes
    # momentum is kept: the next push steps by the buffer the pushes built
    assert server.optimizer_state(0)["state"][0]["momentum_buffer"] is not None


@pytest.mark.parametrize(
    ("optimizer", "epoch_average", "averages"),
    [
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), "auto", True),
        (lambda p: torch.optim.SGD(p, lr=0.1), "auto", False),  # no momentum: no swings
        (lambda p: torch.optim.Adam(p, lr=0.1), "auto", False),
        (lambda p: torch.optim.Adam(p, lr=0.1), True, True),
        (lambda p: torch.optim.SGD(p, lr=0.1, momentum=0.9), False, False),
    ],
)
def test_epoch_average_auto_is_on_for_heavy_ball_momentum(optimizer, epoch_average, averages):
    torch.manual_seed(0)
    layer = torch.nn.Linear(3, 2)
    server = ParameterServer([optimizer(layer.parameters())], 2, epoch_average=epoch_average)
    last = _pushed_params(server, layer, 5)[-1]
    assert server.settle() is averages
    after = server.pull(0).params
    changed = any(not torch.equal(a, b) for a, b in zip(after, last))
    assert changed is averages


@pytest.mark.parametrize("value", ["on", 1, None, 0.5])
def test_epoch_average_refuses_other_values(value):
    layer = torch.nn.Linear(3, 2)
    with pytest.raises(ValueError, match="`epoch_average` must be 'auto', True or False"):
        ParameterServer([torch.optim.SGD(layer.parameters(), lr=0.1)], 2, epoch_average=value)
