"""Every use of Lightning's private attributes, in one place.

Each helper says which Lightning behaviour it relies on (checked against the versions in
``SUPPORTED``); ``PRIVATE_ATTRIBUTES`` lists what they touch, and a test fails loudly
when a Lightning release drops one of them. A Lightning upgrade touches this file only.
"""

from typing import TYPE_CHECKING

from lightning.fabric.utilities.init import _materialize_distributed_module
from lightning.fabric.utilities.optimizer import _optimizers_to_device
from lightning.pytorch.utilities.exceptions import SIGTERMException

if TYPE_CHECKING:
    import lightning.pytorch as pl
    import torch

__all__ = [
    "PRIVATE_ATTRIBUTES",
    "PRIVATE_FUNCTIONS",
    "SUBCLASS_ATTRIBUTES",
    "SUPPORTED",
    "check_own_sigterm_only",
    "in_training_batch",
    "logging_step",
    "materialize_module",
    "optimizers_to_device",
    "request_train_reload",
    "settle_logged_metrics",
]

#: The Lightning versions these helpers were checked against (``>=`` floor, ``<`` ceiling).
SUPPORTED = (">=2.4", "<2.7")
#: ``(where, attribute)`` for each private attribute used here; ``where`` is a dotted path
#: from a ``Trainer`` (``""``: the Trainer itself).
PRIVATE_ATTRIBUTES = (
    ("fit_loop", "_combined_loader"),
    ("", "_logger_connector"),
    ("_logger_connector", "_first_loop_iter"),
    ("fit_loop.epoch_loop", "_broadcast_sigterm_tensor"),
    ("fit_loop.epoch_loop", "_batches_that_stepped"),
)
#: Private functions of Lightning used here (``module``, ``name``).
PRIVATE_FUNCTIONS = (
    ("lightning.fabric.utilities.init", "_materialize_distributed_module"),
    ("lightning.fabric.utilities.optimizer", "_optimizers_to_device"),
)
#: The second and last place: the strategies subclass Lightning's and override or read these
#: protected members (their subclassing surface, not a loop's internals): ``(class, name)``.
SUBCLASS_ATTRIBUTES = (
    ("DDPStrategy", "_setup_model"),
    ("DDPStrategy", "_register_ddp_hooks"),
    ("DDPStrategy", "_layer_sync"),
    ("DDPStrategy", "_timeout"),
    ("ModelParallelStrategy", "_data_parallel_size"),
    ("ModelParallelStrategy", "_timeout"),
    ("ModelParallelStrategy", "_layer_sync"),
)


def settle_logged_metrics(trainer: "pl.Trainer") -> None:
    """Run Lightning's pending epoch-level metric syncs now, on this rank.

    Lightning reduces values logged with ``sync_dist=True`` and torchmetrics objects lazily,
    with a collective, the first time anyone reads them after the epoch's last batch: on rank
    0 that is the progress bar (or any ``@rank_zero_only`` callback), on the other ranks the
    logger connector, after every ``on_train_epoch_end`` callback. A collective of ours in
    between would pair with the wrong one and hang. Reading the metrics on every rank before
    our own collectives puts the metric syncs first everywhere, in the same order, whatever
    the callback order; values computed once are cached, so nothing is synced twice.
    """
    _ = trainer.callback_metrics


def logging_step(trainer: "pl.Trainer") -> int:
    """The step at which Lightning logs what is logged now (``self.log`` in a training step).

    Lightning's loggers count batches that stepped, raised after a batch's
    ``on_train_batch_end``; ``trainer.global_step`` counts optimizer steps and is already
    raised there, one ahead.
    """
    return int(trainer.fit_loop.epoch_loop._batches_that_stepped)


def request_train_reload(trainer: "pl.Trainer") -> None:
    """Make Lightning build the training loader again before the next epoch starts.

    Lightning rebuilds it at an epoch start when it has none (``fit_loop.setup_data``);
    call this at or before the previous epoch's end, or before the first one.
    """
    trainer.fit_loop._combined_loader = None


def in_training_batch(module: "pl.LightningModule | None") -> bool:
    """Whether a reduction now is of a training batch's step-level logged value (``False``
    for a module attached to no Trainer).

    Lightning reduces a ``sync_dist`` value logged on step at once, when it is logged
    (``_ResultMetric.update``), and an epoch-level one (a sum and a sample count, each
    reduced) only when it is first read after the epoch's last batch. The logger connector's
    ``_first_loop_iter`` is set at the first batch's start (``on_batch_start``) and back to
    ``None`` once the batches are over (``epoch_end_reached``); validation within the epoch
    runs with ``trainer.training`` false.
    """
    if module is None:
        return False
    try:
        trainer = module.trainer
    except RuntimeError:  # a module attached to no Trainer
        return False
    connector = getattr(trainer, "_logger_connector", None)
    return trainer.training and getattr(connector, "_first_loop_iter", None) is not None


def check_own_sigterm_only(trainer: "pl.Trainer") -> None:
    """Stop Lightning from broadcasting rank 0's SIGTERM flag before every training step.

    Lightning 2.5.6 and later run that broadcast
    (``_TrainingEpochLoop._broadcast_sigterm_tensor``), a collective that ties every rank to
    rank 0's pace and deadlocks ranks that make different numbers of steps. Each rank checks
    its own flag instead.
    """
    loop = trainer.fit_loop.epoch_loop
    if not hasattr(loop, "_broadcast_sigterm_tensor"):
        return  # earlier releases (2.5.0 among them) have no such broadcast

    def check_own_sigterm() -> None:
        if getattr(trainer, "received_sigterm", False):
            raise SIGTERMException()

    loop._broadcast_sigterm_tensor = check_own_sigterm


def materialize_module(module: "torch.nn.Module", device: "torch.device") -> None:
    """Materialize parameters created on the meta device (``tensor_init_context``), as
    ``ModelParallelStrategy.setup`` does (Lightning's ``_materialize_distributed_module``)."""
    _materialize_distributed_module(module, device)


def optimizers_to_device(optimizers: list, device: "torch.device") -> None:
    """Move every optimizer's state to ``device`` (Lightning's ``_optimizers_to_device``)."""
    _optimizers_to_device(optimizers, device)
