"""ParameterServerMode (``mode="async"``) on a real run context, with its RPC and server in
this process (one rank, rank 0, hosts the server)."""

import pytest
import torch

from lightning_hetero.modes.asynchronous import ParameterServerMode

from .conftest import bound


@pytest.mark.parametrize(("lr_scaling", "factor"), [(True, 3 / 8), (False, 1.0)])
def test_a_step_pushes_the_gradient_and_loads_the_servers_update_with_lr_times_share(
    group, lr_scaling, factor
):
    torch.manual_seed(0)
    module = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1)
    mode, _ = bound("async", [3], port=group, module=module, lr_scaling=lr_scaling)
    assert isinstance(mode, ParameterServerMode)
    mode.ctx.optimizers = [optimizer]
    mode.setup_environment()
    try:
        mode.on_train_start()
        assert mode.server is not None
        before = [p.detach().clone() for p in module.parameters()]
        module(torch.ones(4, 2)).sum().backward()
        grads = [p.grad.detach().clone() for p in module.parameters()]
        mode.share = (3, 8)  # this rank's batch of a global batch of 8
        stepped: list[bool] = []
        mode.optimizer_step(optimizer, lambda: stepped.append(True) or optimizer.step())
        assert stepped == [True] and mode.pushes == 1
        for param, old, grad in zip(module.parameters(), before, grads):
            # one update, the server's: the rank's own optimizer did not step as well
            torch.testing.assert_close(param.detach(), old - 0.1 * factor * grad)
    finally:
        mode.teardown()
    assert mode.client is None and mode.server is None


def test_lookahead_true_without_momentum_is_refused_before_the_server_starts(group):
    module = torch.nn.Linear(2, 1)
    mode, _ = bound("async", [3], port=group, module=module, lookahead=True)
    mode.ctx.optimizers = [torch.optim.SGD(module.parameters(), lr=0.1)]  # momentum 0
    mode.setup_environment()
    try:
        # every rank checks its own optimizers, so no rank waits for a server that rank 0
        # failed to build
        with pytest.raises(ValueError, match="lookahead=True .* SGD has none"):
            mode.on_train_start()
        assert mode.server is None
    finally:
        mode.teardown()
