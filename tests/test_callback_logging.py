"""HeteroCallback's logging: ``hetero/*`` rows at the step of Lightning's own rows."""

import csv
from pathlib import Path

import lightning.pytorch as pl
import pytest
from lightning.pytorch.demos.boring_classes import BoringModel
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger

from lightning_hetero import HeteroStrategy


class _Logged(BoringModel):
    """Logs what users log: a training loss per step and per epoch, a validation loss."""

    def training_step(self, batch, batch_idx):
        output = super().training_step(batch, batch_idx)
        self.log("train_loss", output["loss"], on_step=True, on_epoch=True)
        return output

    def validation_step(self, batch, batch_idx):
        output = super().validation_step(batch, batch_idx)
        self.log("val_loss", output["x"])
        return output


def _fit(tmp_path: Path, adjust_every, log_every_n_steps: int, batches: int, epochs: int):
    # every boundary logged (these tests count rows): no spreading of short steps' boundaries
    strategy = HeteroStrategy(adjust_every=adjust_every, replan_budget=None)
    trainer = pl.Trainer(
        strategy=strategy,
        accelerator="cpu",
        devices=1,
        max_epochs=epochs,
        limit_train_batches=batches,
        limit_val_batches=2,
        log_every_n_steps=log_every_n_steps,
        logger=[CSVLogger(tmp_path, name="csv"), TensorBoardLogger(tmp_path, name="tb")],
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(_Logged())
    with open(Path(trainer.loggers[0].log_dir) / "metrics.csv") as f:
        csv_steps: dict[str, list[int]] = {}
        for row in csv.DictReader(f):
            for name, value in row.items():
                if value and name != "step":
                    csv_steps.setdefault(name, []).append(int(row["step"]))
    from tensorboard.backend.event_processing import event_accumulator

    events = event_accumulator.EventAccumulator(
        trainer.loggers[1].log_dir, size_guidance={event_accumulator.SCALARS: 0}
    ).Reload()
    tb_steps = {tag: [e.step for e in events.Scalars(tag)] for tag in events.Tags()["scalars"]}
    return strategy, csv_steps, tb_steps


def test_epoch_boundaries_share_the_step_of_lightnings_epoch_values(tmp_path):
    """Lightning logs an epoch's ``on_epoch`` values and the validation after its last batch
    at that batch's step (3, 7, 11 for 4-batch epochs), not at its step counter after it."""
    strategy, csv_steps, tb_steps = _fit(tmp_path, "epoch", 50, batches=4, epochs=3)
    assert len(strategy.history) == 3
    for steps in (csv_steps, tb_steps):
        assert steps["hetero/balance"] == [3, 7, 11]
        assert steps["hetero/balance"] == steps["val_loss"] == steps["train_loss_epoch"]
        assert steps["hetero/batch_size/rank0"] == [3, 7, 11]


def test_boundaries_every_few_batches_ride_on_lightnings_logged_rows(tmp_path):
    """adjust_every=3 with log_every_n_steps=5: Lightning logs steps 4, 9, 14, 19 (its
    ``train_loss_step``); each of these rows also gets the latest boundary's values (a plan
    change would be logged at once, at its own batch's step; one rank never changes it)."""
    strategy, csv_steps, tb_steps = _fit(tmp_path, 3, 5, batches=10, epochs=2)
    assert len(strategy.history) == 6  # after batches 3, 6, ..., 18 of 20
    assert not any(entry["changed"] for entry in strategy.history)
    for steps in (csv_steps, tb_steps):
        assert steps["train_loss_step"] == [4, 9, 14, 19]
        # step 4 has the boundary of step 2, 9 of 8, 14 of 14, 19 of 17
        assert steps["hetero/balance"] == [4, 9, 14, 19]


def test_boundaries_every_batch_are_logged_with_every_row_lightning_logs(tmp_path):
    strategy, csv_steps, tb_steps = _fit(tmp_path, 1, 2, batches=4, epochs=2)
    assert len(strategy.history) == 8
    for steps in (csv_steps, tb_steps):
        assert steps["hetero/balance"] == steps["train_loss_step"] == [1, 3, 5, 7]


def _csv_epochs(log_dir: str, name: str) -> list[tuple[int, str]]:
    """(step, epoch) of each CSV row that has ``name``."""
    with open(Path(log_dir) / "metrics.csv") as f:
        return [(int(row["step"]), row["epoch"]) for row in csv.DictReader(f) if row[name]]


@pytest.mark.parametrize(("adjust_every", "epochs_seen"), [("epoch", [0, 1]), (2, [0, 0, 1, 1])])
def test_csv_rows_of_boundaries_carry_their_epoch(tmp_path, adjust_every, epochs_seen):
    # issue 43: the rows had the step but an empty `epoch`, which a groupby("epoch") drops
    strategy, _, _ = _fit(tmp_path, adjust_every, 2, batches=4, epochs=2)
    log_dir = strategy.lightning_module.trainer.loggers[0].log_dir
    rows = _csv_epochs(log_dir, "hetero/balance")
    assert [int(float(epoch)) for _, epoch in rows] == epochs_seen, rows
