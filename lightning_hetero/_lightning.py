"""What lightning_hetero needs from Lightning's loops beyond its public hooks, in one place.

Each helper says which Lightning behaviour it relies on (checked against lightning 2.6).
"""

from typing import TYPE_CHECKING

if TYPE_CHECKING:
    import lightning.pytorch as pl

__all__ = ["in_training_batch", "request_train_reload", "settle_logged_metrics"]


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


def request_train_reload(trainer: "pl.Trainer") -> None:
    """Make Lightning build the training loader again before the next epoch starts.

    Lightning rebuilds it at an epoch start when it has none (``fit_loop.setup_data``);
    call this at or before the previous epoch's end, or before the first one.
    """
    trainer.fit_loop._combined_loader = None


def in_training_batch(trainer: "pl.Trainer") -> bool:
    """Whether a reduction now is of a training batch's step-level logged value.

    Lightning reduces a ``sync_dist`` value logged on step at once, when it is logged
    (``_ResultMetric.update``), and an epoch-level one (a sum and a sample count, each
    reduced) only when it is first read after the epoch's last batch. The logger connector's
    ``_first_loop_iter`` is set at the first batch's start (``on_batch_start``) and back to
    ``None`` once the batches are over (``epoch_end_reached``); validation within the epoch
    runs with ``trainer.training`` false.
    """
    connector = getattr(trainer, "_logger_connector", None)
    return trainer.training and getattr(connector, "_first_loop_iter", None) is not None
