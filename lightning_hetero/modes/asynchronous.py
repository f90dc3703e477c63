"""Asynchronous SGD on a parameter server in rank 0's process (paper 002)."""

from collections.abc import Callable, Sequence
from typing import Any, ClassVar

import torch
from lightning_utilities.core.rank_zero import rank_zero_warn

from lightning_hetero._optim import (
    check_lookahead,
    check_lr_scaling,
    is_adaptive,
    optimizer_params,
    patched,
)
from lightning_hetero.collectives import add_note
from lightning_hetero.localsgd import weighted_average_
from lightning_hetero.modes.base import Mode, ModeOptions, OptionGroup, ServerOptions
from lightning_hetero.paramserver import ParameterServer, ServerClient
from lightning_hetero.planning import Controller
from lightning_hetero.planning.dual import DualBatchController

__all__ = ["ParameterServerMode"]


class ParameterServerMode(Mode):
    """``mode="async"``: each rank pushes its gradient to the server and pulls the model back.

    The server applies rank ``k``'s gradient as it arrives, with learning rate
    ``lr * b_k / B`` for SGD and, for adaptive optimizers, between that and
    ``lr * sqrt(b_k / B)`` by the measured gradient noise (``lr_scaling``), so ranks never
    wait for each other within an epoch. At validation, epoch ends and the end of training
    every rank loads the server's model (and the ranks' buffers are
    averaged); at the epoch's end (its validation included) and the training's, the server
    first takes the average of its parameters over the epoch's pushes (``epoch_average``).
    Checkpoints on rank 0 hold the server's model and optimizer state.
    """

    name: ClassVar[str] = "async"
    option_groups: ClassVar[tuple[type[OptionGroup], ...]] = (ServerOptions,)

    def __init__(self, controller: Controller, options: ModeOptions) -> None:
        super().__init__(controller, options)
        self.client: ServerClient | None = None
        self.pushes = 0
        self._seen_version = 0
        self._failed = False
        self._served_mark = 0.0  # the server's serving_s at this rank's last push (rank 0)

    @classmethod
    def check_options(cls, options: ModeOptions, controller: Controller) -> None:
        super().check_options(options, controller)
        if (
            isinstance(controller, DualBatchController)
            and check_lr_scaling(options.lr_scaling) == "none"
        ):
            raise ValueError(
                "With controller='dual' the server scales updates by the controller's"
                " update_factor rule; for the unscaled ablation use"
                " DualBatchController(update_factor='none') instead of lr_scaling=False."
            )
        if (
            isinstance(controller, DualBatchController)
            and controller.update_factor != "share"
            and check_lr_scaling(options.lr_scaling) in ("linear", "sqrt", "noise")
        ):
            raise ValueError(
                f"DualBatchController(update_factor={controller.update_factor!r}) is paper 003's"
                f" rule, which replaces batch-share scaling: lr_scaling={options.lr_scaling!r}"
                " would have no effect. Leave lr_scaling='auto', or use"
                " update_factor='share' to scale each push by its batch share."
            )

    # ---------------------------------------------------------------- set-up
    def setup_environment(self) -> None:
        ctx = self.ctx
        self._failed = False
        ServerClient.init_rpc(
            ctx.rank,
            ctx.world_size,
            ctx.main_address,
            self.options.rpc_timeout,
            ctx.main_port,
        )
        self.client = ServerClient(ctx.rank, self.options.rpc_timeout)

    def on_train_start(self) -> None:
        ctx = self.ctx
        check_lookahead(self.options.lookahead, ctx.optimizers)  # every rank: none waits
        if ctx.rank == 0:
            self.server = ParameterServer(
                ctx.optimizers,
                ctx.world_size,
                self._lr_scaling(),
                self.options.lookahead,
                self.options.epoch_average,
            )
            ServerClient.start_server(self.server)
            self._warn_adaptive()
        self.synchronize("the start of training")  # every rank starts from the server

    def _lr_scaling(self) -> bool | str:
        """The server's ``lr_scaling``: how an update's learning rate follows ``b_k / B``."""
        return self.options.lr_scaling

    def _warn_adaptive(self) -> None:
        """Say once what differs from DDP when the server steps an adaptive optimizer."""
        names = sorted({type(opt).__name__ for opt in self.ctx.optimizers if is_adaptive(opt)})
        if names:
            rank_zero_warn(
                f"hetero: {self.option_text()} with the adaptive optimizer(s) {names}: the server"
                " takes one optimizer step per push, on each rank's gradient alone, computed on"
                " parameters that other ranks' pushes may have changed since (stale), so the"
                " moment estimates see single, delayed gradients where DDP's see their average."
                f" Learning rates follow lr_scaling={self.options.lr_scaling!r} ('auto': the"
                " measured-noise rule, between b_k/B and sqrt(b_k/B), of the batch share"
                " b_k/B of DDP's global batch, also with controller='dual'); training"
                " converges like DDP's only approximately, and near DDP's largest stable"
                " learning rate it can still diverge with several ranks (then lower the learning"
                " rate or set lr_scaling='linear'). For DDP's exact update use mode='bsp'."
            )

    # ---------------------------------------------------------------- steps
    def post_backward(self) -> None:
        timer = self.ctx.timer
        if self.server is not None:
            # rank 0: the other ranks' pushes the server applied since this rank's last push
            # ran beside this step's forward and backward; they are no part of its cost
            timer.add_wait(self.server.serving_s - self._served_mark)
        timer.grads_ready()  # the push that follows counts as waiting

    def optimizer_step(self, optimizer: torch.optim.Optimizer, run: Callable[[], Any]) -> Any:
        index = self._optimizer_index(optimizer)

        def push_instead_of_step(closure: Any = None, **_: Any) -> Any:
            loss = closure() if closure is not None else None
            self._push(index, optimizer)
            return loss

        # Precision plugins call `optimizer.step`; the server steps instead of this rank.
        with patched(optimizer, {"step": push_instead_of_step}):
            output = run()
        optimizer._opt_called = True  # type: ignore[attr-defined]  # LR schedulers check it
        self.ctx.timer.step_done()
        return output

    def update_factor(self, optimizer: torch.optim.Optimizer) -> float:
        """Multiplier of this rank's pushed updates of ``optimizer``, besides the server's
        scaling by ``b_k / B``."""
        return 1.0

    def _optimizer_index(self, optimizer: torch.optim.Optimizer) -> int:
        """Position of ``optimizer`` (or the one a ``LightningOptimizer`` wraps)."""
        raw = getattr(optimizer, "_optimizer", optimizer)
        return next(i for i, opt in enumerate(self.ctx.optimizers) if opt is raw)

    def _push(self, index: int, optimizer: torch.optim.Optimizer) -> None:
        assert self.client is not None
        params = optimizer_params(optimizer)
        grads = [None if p.grad is None else p.grad.detach().to("cpu", copy=True) for p in params]
        lrs = [float(group["lr"]) for group in optimizer.param_groups]
        local, total = self.share
        result = self.client.push(
            index, grads, local, total, lrs, self._seen_version, self.update_factor(optimizer)
        )
        _load(params, result.params)
        self._seen_version = result.version
        self.pushes += 1
        self.ctx.timer.backward_done()
        if self.server is not None:
            self._served_mark = self.server.serving_s

    def _pull_all(self) -> None:
        """Load the server's latest parameters into this rank's model."""
        assert self.client is not None
        for index, optimizer in enumerate(self.ctx.optimizers):
            result = self.client.pull(index)
            _load(optimizer_params(optimizer), result.params)
            self._seen_version = result.version

    def timed_step_extra(self, module: torch.nn.Module) -> None:
        if self.client is not None:  # a worker's step includes its push: gradients out, back
            grads = [p.grad.detach().cpu() for p in module.parameters() if p.grad is not None]
            self.client.echo(grads)

    def synchronize(self, point: str, settle: bool = False) -> None:
        """Wait for every rank, then load the server's model everywhere; ``settle``: the
        server first replaces its parameters by their average over the pushes since the last
        settle (``epoch_average``; at the epoch's end and the training's)."""
        ctx = self.ctx
        ctx.barrier(point)  # every push of every rank has been applied
        if settle and self.server is not None:
            self.server.settle()
        self._pull_all()
        buffers = [b for b in ctx.module.buffers() if b.dtype.is_floating_point]
        with ctx.comm.guarded(f"the buffer average at {point}"):
            # BatchNorm statistics would stay per rank otherwise
            weighted_average_(buffers, 1.0, ctx.world_size)
        ctx.barrier(f"{point}, after the pulls")  # no rank tears the server down mid-pull
        if self.server is not None:
            self._served_mark = self.server.serving_s  # a break: what came before is no step's

    # ---------------------------------------------------------------- boundaries
    def on_train_epoch_end(self) -> bool:
        self.synchronize("the end of the epoch", settle=True)  # every rank on its model
        return True

    def boundary_stats(self) -> dict[str, Any]:
        # rank 0: the server's view of the epoch, taken before the boundary's all-gather; once
        # that completes, the other ranks may push the next epoch's first updates
        return self.server.take_epoch_stats() if self.server is not None else {}

    def on_validation_start(self, epoch_end: bool = False) -> None:
        if self.client is not None:  # validate the server's model (the epoch's, at its end)
            self.synchronize("validation", settle=epoch_end)

    def on_train_end(self) -> None:
        if self.client is not None:  # a fit that stops mid-epoch (max_steps) settles too
            self.synchronize("the end of training", settle=True)

    # ---------------------------------------------------------------- checkpoints, faults
    def before_model_state(self) -> None:
        if self.server is not None:
            self._pull_all()  # rank 0: checkpoints hold the server's model

    def optimizer_state(self, optimizer: torch.optim.Optimizer) -> dict[str, Any] | None:
        if self.server is None:
            return None
        return self.server.optimizer_state(self._optimizer_index(optimizer))

    def on_exception(self, exception: BaseException) -> None:
        self._failed = True
        if self.client is None or not isinstance(exception, Exception):
            return
        ctx = self.ctx
        gone = self.client.unreachable(range(ctx.world_size))
        if gone:
            add_note(
                exception,
                f"hetero: rank {ctx.rank} finds that rank(s) {gone} no longer answer:"
                " the rank that died, and any that stopped after it (each rank reports what"
                " it sees; rank 0 hosts the server). The parameter server applies each update"
                " whole, so its model holds only complete updates; resume from the last"
                " checkpoint with `trainer.fit(..., ckpt_path=...)`.",
            )

    def teardown(self) -> None:
        if self.server is not None:
            # Later `trainer.save_checkpoint` calls save the optimizers: give them the server's.
            for index, optimizer in enumerate(self.ctx.optimizers):
                optimizer.load_state_dict(self.server.optimizer_state(index))
        if self.client is not None:
            ServerClient.stop_server()
            ServerClient.shutdown(graceful=not self._failed)
            self.client = None
            self.server = None


def _load(params: Sequence[torch.Tensor], values: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for param, value in zip(params, values):
            param.copy_(value)
