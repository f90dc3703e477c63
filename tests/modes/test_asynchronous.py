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


def test_the_epochs_end_validates_and_continues_from_the_servers_epoch_average(group):
    # validation within the epoch sees the server's parameters as they are; the one at the
    # epoch's end (before on_train_epoch_end) sees them averaged over the epoch's pushes,
    # and the epoch's end adds nothing more (no push since)
    torch.manual_seed(0)
    module = torch.nn.Linear(2, 1)
    optimizer = torch.optim.SGD(module.parameters(), lr=0.1, momentum=0.9)
    mode, _ = bound("async", [3], port=group, module=module)
    mode.ctx.optimizers = [optimizer]
    mode.setup_environment()
    try:
        mode.on_train_start()
        mode.share = (3, 8)
        for _ in range(5):
            optimizer.zero_grad()
            module(torch.randn(4, 2)).sum().backward()
            mode.optimizer_step(optimizer, lambda: optimizer.step())
        latest = [p.detach().clone() for p in mode.server.pull(0).params]
        mode.on_validation_start(epoch_end=False)
        for param, value in zip(module.parameters(), latest):
            torch.testing.assert_close(param.detach(), value)
        mode.on_validation_start(epoch_end=True)
        averaged = [p.detach().clone() for p in module.parameters()]
        assert any(not torch.equal(a, b) for a, b in zip(averaged, latest))
        for param, value in zip(mode.server.pull(0).params, averaged):
            torch.testing.assert_close(param, value)  # the server goes on from it
        mode.on_train_epoch_end()
        for param, value in zip(module.parameters(), averaged):
            torch.testing.assert_close(param.detach(), value)
    finally:
        mode.teardown()
