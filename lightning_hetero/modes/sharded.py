"""Synchronous data parallelism over a sharded model (FSDP2), gradients weighted by share."""

import os
import sys
from collections.abc import Callable, Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import Any, ClassVar

import torch
from torch.nn.modules.batchnorm import _NormBase

from lightning_hetero._comm import shadow
from lightning_hetero._fsdp import CollectiveWaitMeter, WaitStats
from lightning_hetero.localsgd import weighted_average_
from lightning_hetero.modes.base import Mode

__all__ = ["WAITS_ENV", "RootRedirect", "ShardedMode", "norm_buffers", "wait_report_every"]

#: Environment variable: ``N`` prints every rank's seconds at each collective site every
#: ``N`` training batches (``1``: each).
WAITS_ENV = "LIGHTNING_HETERO_FSDP_WAITS"


def wait_report_every(environ: dict[str, str] | None = None) -> int:
    """Every how many batches to print the collective sites' times (``WAITS_ENV``); 0: never."""
    value = (os.environ if environ is None else environ).get(WAITS_ENV, "").strip()
    if not value:
        return 0
    try:
        every = int(value)
    except ValueError:
        raise ValueError(
            f"{WAITS_ENV}={value!r}: expected a whole number of batches (1: every batch),"
            f" or unset it."
        ) from None
    return max(every, 0)


def format_waits(rank: int, batch: int, stats: WaitStats) -> str:
    """One line of the per-site dump: this rank's seconds at each collective site."""
    sites = sorted(stats.by_site.items(), key=lambda item: -item[1])
    parts = ", ".join(f"{site} {seconds:.4f}" for site, seconds in sites)
    return f"hetero FSDP waits, rank {rank}, batch {batch}: {stats.wait_s:.4f} s ({parts})"


class RootRedirect:
    """Run a LightningModule's step method inside its sharded root's ``forward``.

    FSDP2 gathers a module's parameters in a hook before its ``forward`` and frees them
    after. A LightningModule sharded as the root is rarely called as ``self(x)``: most steps
    call submodules (``self.head(self.encoder(x))``) or read parameters directly, and the
    root's hooks would never run (``aten.addmm.default got mixed torch.Tensor and DTensor``).
    As Lightning's forward redirection for DDP and FSDP, the root's ``forward`` is replaced
    for one call by the step method, so ``root(*args)`` runs the step between the hooks:
    every direct call sees gathered parameters, and a nested ``self(x)`` runs the real
    ``forward`` (the replacement undoes itself before the step starts).

    Manual optimization runs backward and the optimizer *inside* the step:

    - backward comes before the root's post-forward hook has marked any output, so FSDP
      would never reduce the root's gradients. ``mark_output`` routes such a loss
      through the root once more, as the output of an empty forward, so backward runs the
      root's pre-backward hook and the final reduce-scatter as after any forward;
    - that backward leaves the root's parameters sharded, and an optimizer step changes
      the shards. ``regather`` gathers them again after each, so the rest of the step
      (a second optimizer's forward, as in a GAN) sees the current parameters.
    """

    def __init__(self) -> None:
        self.root: torch.nn.Module | None = None  # set while a step runs inside the root

    def __call__(self, root: torch.nn.Module, method_name: str, *args: Any, **kwargs: Any) -> Any:
        """``root.<method_name>(*args, **kwargs)``, inside ``root.forward`` if it is sharded."""
        from torch.distributed.fsdp import FSDPModule

        method = getattr(root, method_name)
        if not isinstance(root, FSDPModule) or self.root is not None:
            return method(*args, **kwargs)

        def step(*inner_args: Any, **inner_kwargs: Any) -> Any:
            restore()  # a `self(x)` in the step runs the real forward
            self.root = root
            try:
                return method(*inner_args, **inner_kwargs)
            finally:
                self.root = None

        with _forward_replaced(root, step) as restore:
            return root(*args, **kwargs)

    def mark_output(self, loss: torch.Tensor) -> torch.Tensor:
        """``loss``, made an output of the sharded root when backward runs inside a step."""
        root = self.root
        if root is None or not loss.requires_grad:
            return loss
        # no tensor input: FSDP registers no post-backward hook on the way in, only its
        # pre-backward hook on the output, which queues the reduce-scatter of every group
        with _forward_replaced(root, lambda: loss):
            return root()

    def regather(self) -> None:
        """Inside a step: gather the root's current parameters again (after a backward
        resharded them or an optimizer step changed the shards)."""
        root = self.root
        if root is not None:
            root.reshard()  # type: ignore[operator]
            root.unshard()  # type: ignore[operator]


@contextmanager
def _forward_replaced(module: torch.nn.Module, forward: Callable[..., Any]) -> Iterator[Any]:
    """Shadow ``module.forward`` with ``forward`` (an instance attribute); yields the undo,
    which is also run on exit and leaves the instance exactly as it was."""
    restore = shadow(module, "forward", forward)
    try:
        yield restore
    finally:
        restore()


def norm_buffers(module: torch.nn.Module) -> list[torch.Tensor]:
    """The running statistics of ``module``'s BatchNorm (and other norm) layers: the
    floating-point buffers each rank updates from its own batch."""
    return [
        buffer
        for layer in module.modules()
        if isinstance(layer, _NormBase) and layer.track_running_stats
        for buffer in layer.buffers(recurse=False)
        if buffer is not None and buffer.dtype.is_floating_point
    ]


class ShardedMode(Mode):
    """``HeteroFSDPStrategy(mode="bsp")``: every rank steps together on its own batch.

    FSDP2 averages each gradient over the ``K`` ranks when it reduce-scatters it. Scaling rank
    ``k``'s loss by ``K * b_k / B`` before backward turns that average into
    ``sum_k (b_k / B) g_k``: the gradient of the mean loss over the step's ``B`` samples,
    whatever the split (gradient clipping and accumulation then see the exact gradient).

    The step methods run inside the sharded root's forward (``RootRedirect``), so a
    LightningModule may call its submodules directly.

    BatchNorm: FSDP shards parameters, not buffers, so each rank's running statistics follow
    its own batches. They are averaged over the ranks, weighted by batch share as one large
    batch would weigh them, at the end of each epoch, before validation and before the model
    is saved (one all-reduce each); in between, each rank normalizes with its own.

    Timing: under FSDP every rank waits for the others inside forward and backward (each
    layer's all-gather, each reduce-scatter). The time this rank spends blocked in those
    waits, and in any other collective it waits on during a step (a gradient-norm
    all-reduce, Lightning's per-step broadcast), is measured (``CollectiveWaitMeter``) and
    recorded as a wait segment of the step timer, so a rank's compute time is its own however
    slow the others are. ``LIGHTNING_HETERO_FSDP_WAITS=N`` prints each rank's seconds per
    collective site every ``N`` batches.
    """

    name: ClassVar[str] = "bsp"
    steps_together: ClassVar[bool] = True
    wraps_model: ClassVar[bool] = True  # ``wrap`` shards it
    replans_within_epoch: ClassVar[bool] = True
    probe_steps_communicate: ClassVar[bool] = True
    micro_batches: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self.meter: CollectiveWaitMeter | None = None
        self.redirect = RootRedirect()
        self.report_every = 0
        self._batches = 0

    def register_hooks(self, model: Any) -> None:
        self.report_every = wait_report_every()
        self.meter = CollectiveWaitMeter(segment=self._waiting)
        self.meter.install(model)

    def _waiting(self) -> AbstractContextManager[Any]:
        # each wait is a segment of the step timer, which gives it to the step whose cycle
        # holds it (after a backward too: the optimizer step's, the next batch's broadcast)
        return self.ctx.timer.waiting()

    def on_train_batch_start(self, batch_idx: int) -> None:
        if self.meter is not None:
            stats = self.meter.take_stats()  # since the previous batch began
            every, done = self.report_every, self._batches
            if every and done and stats.calls and done % every == 0:
                print(format_waits(self.ctx.rank, done - 1, stats), file=sys.stderr, flush=True)
            self._batches += 1
        super().on_train_batch_start(batch_idx)

    def backward(self, loss: torch.Tensor, run: Callable[[torch.Tensor], None]) -> None:
        with self.ctx.comm.guarded("backward with its gradient reduce-scatter"):
            run(self.scale_loss(self.redirect.mark_output(loss)))
        self.redirect.regather()

    def optimizer_step(self, optimizer: torch.optim.Optimizer, run: Callable[[], Any]) -> Any:
        output = super().optimizer_step(optimizer, run)
        self.redirect.regather()
        return output

    # ---------------------------------------------------------------- BatchNorm statistics
    def average_norm_buffers(self) -> None:
        """Replace every rank's BatchNorm running statistics by their batch-weighted mean."""
        ctx = self.ctx
        buffers = norm_buffers(ctx.module)
        if not buffers or ctx.world_size == 1:
            return
        plan = ctx.plan_state.batch_sizes or [1] * ctx.world_size
        with ctx.comm.guarded("averaging the BatchNorm statistics"):
            weighted_average_(buffers, float(plan[ctx.rank]), float(sum(plan)))

    def on_train_epoch_end(self) -> bool:
        self.average_norm_buffers()
        return True

    def on_validation_start(self, epoch_end: bool = False) -> None:
        self.average_norm_buffers()

    def before_model_state(self) -> None:
        self.average_norm_buffers()

    def teardown(self) -> None:
        if self.meter is not None:
            self.meter.remove()
            self.meter = None
