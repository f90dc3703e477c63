"""StragglerReport in one process: its options, a fit's reports, what it logs, and that it
leaves no hook behind (the multi-rank behaviour: tests/e2e/test_straggler.py)."""

import math
from typing import Any

import lightning.pytorch as pl
import pytest
import torch
from lightning.pytorch.loggers import Logger
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import StragglerReport
from lightning_hetero.planning.stragglers import Verdict
from lightning_hetero.straggler import describe


@pytest.mark.parametrize("every", [0, -1])
def test_every_n_steps_below_one_is_refused(every):
    with pytest.raises(ValueError, match=f"every_n_steps={every}"):
        StragglerReport(every_n_steps=every)


@pytest.mark.parametrize("every", [True, 2.0, "5"])
def test_every_n_steps_that_is_no_int_is_refused(every):
    with pytest.raises(TypeError, match="takes an int or None"):
        StragglerReport(every_n_steps=every)


@pytest.mark.parametrize("gap", [-0.1, 1.0])
def test_min_gap_outside_0_1_is_refused(gap):
    with pytest.raises(ValueError, match="min_gap"):
        StragglerReport(min_gap=gap)


class _Recorder(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int | None, dict[str, float]]] = []

    @property
    def name(self) -> str:
        return "recorder"

    @property
    def version(self) -> int:
        return 0

    def log_hyperparams(self, params: Any, *args: Any, **kwargs: Any) -> None:
        pass

    def log_metrics(self, metrics: dict[str, float], step: int | None = None) -> None:
        self.rows.append((step, dict(metrics)))


class _Tiny(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(4, 1)

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(TensorDataset(torch.randn(20, 4), torch.randn(20, 1)), batch_size=4)


def test_a_fit_reports_every_n_steps_logs_the_strategys_tags_and_removes_its_hooks():
    report, logger, model = StragglerReport(every_n_steps=2), _Recorder(), _Tiny()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=1,
        max_epochs=1,
        callbacks=[report],
        logger=logger,
        enable_checkpointing=False,
        enable_model_summary=False,
        enable_progress_bar=False,
    )
    trainer.fit(model)
    assert [entry["step"] for entry in report.history] == [2, 4]  # 5 batches
    for entry in report.history:
        assert {"epoch", "step", "compute_times", "wait_times", "pace_setter"} <= set(entry)
        assert entry["pace_setter"] is None  # one rank sets no pace over others
        assert entry["batch_sizes"] == [4] and entry["allowed_speedup"] == 1.0
        # alone, a rank's wait is only the end of its backward after its last gradient
        assert 0 <= entry["wait_times"][0] < entry["compute_times"][0]
    # the first report: the epoch's first step is timed from its batch only and left out
    assert report.history[0]["steps"] == [1] and report.history[1]["steps"] == [2]
    logged = [metrics for _, metrics in logger.rows if "hetero/compute_time/rank0" in metrics]
    assert len(logged) == 2
    assert set(logged[0]) == {
        "hetero/compute_time/rank0",
        "hetero/wait_time/rank0",
        "hetero/throughput/rank0",
    }
    assert math.isclose(
        logged[0]["hetero/throughput/rank0"], 4 / logged[0]["hetero/compute_time/rank0"]
    )
    assert all(not p._post_accumulate_grad_hooks for p in model.parameters())


def _entry(compute, waits, setter, allowed=1.5, plan=(12, 4)):
    return {
        "epoch": 0,
        "step": 12,
        "compute_times": compute,
        "wait_times": waits,
        "pace_setter": setter,
        "batch_sizes": [8, 8],
    }, Verdict(setter, 3.0 if setter is not None else 1.0, allowed, list(plan))


def test_the_line_names_the_pace_setter_by_how_much_and_the_allowed_gain_with_its_plan():
    line = describe(*_entry([0.05, 0.15], [0.1, 0.0], 1))
    for said in (
        "StragglerReport (epoch 0, step 12): rank 1 sets the pace",
        "3.00x the other ranks' median",
        "allowed 1.50x faster steps than with the global batch of 16 split evenly",
        "with the plan [12, 4]",
    ):
        assert said in line, (said, line)


def test_the_line_says_when_no_rank_sets_the_pace_or_a_rank_has_no_timings():
    assert "no rank sets the pace beyond the timing noise" in describe(
        *_entry([0.05, 0.051], [0.0, 0.0], None, allowed=1.0, plan=(8, 8))
    )
    untimed = describe(*_entry([0.05, math.nan], [0.0, math.nan], None, allowed=math.nan))
    assert untimed.endswith("no timed steps on rank(s) [1] since the last report.")


def _recorded_waiting(events: list[str]):
    """A timer's ``waiting`` that records where it begins and ends in ``events``."""
    from contextlib import contextmanager

    @contextmanager
    def waiting():
        events.append("(")
        yield
        events.append(")")

    return waiting


def test_lightnings_per_batch_broadcast_is_timed_as_waiting_and_put_back():
    """Under accumulation a DDP rank meets its slower peers in Lightning's SIGTERM broadcast
    before every loader batch, not only in the all-reduce: the report counts it as wait
    (before, a 2.6x slower rank under accumulation 2 read as no pace-setter)."""
    from types import SimpleNamespace

    from lightning_hetero._lightning import time_sigterm_broadcast

    events = []

    class Loop:
        def _broadcast_sigterm_tensor(self):
            events.append("broadcast")

    loop = Loop()
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=loop))
    undo = time_sigterm_broadcast(trainer, _recorded_waiting(events))
    loop._broadcast_sigterm_tensor()
    assert events == ["(", "broadcast", ")"]
    undo()
    loop._broadcast_sigterm_tensor()
    assert events[-1] == "broadcast" and len(events) == 4


def test_each_rank_checks_its_own_sigterm_flag_until_teardown_puts_the_broadcast_back():
    # the modes whose ranks make different numbers of steps replace the per-batch broadcast
    from types import SimpleNamespace

    from lightning.pytorch.utilities.exceptions import SIGTERMException

    from lightning_hetero._lightning import check_own_sigterm_only

    class Loop:
        def _broadcast_sigterm_tensor(self):
            return "broadcast"

    loop = Loop()
    trainer = SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=loop), received_sigterm=False)
    undo = check_own_sigterm_only(trainer)
    assert loop._broadcast_sigterm_tensor() is None  # no collective: this rank's flag only
    trainer.received_sigterm = True
    with pytest.raises(SIGTERMException):
        loop._broadcast_sigterm_tensor()
    undo()
    assert (
        loop._broadcast_sigterm_tensor() == "broadcast"
        and "_broadcast_sigterm_tensor" not in vars(loop)
    )
    assert (
        check_own_sigterm_only(SimpleNamespace(fit_loop=SimpleNamespace(epoch_loop=object())))()
        is None
    )


def test_the_strategys_collectives_in_a_step_are_timed_as_waiting_and_put_back():
    """``self.log(..., sync_dist=True)`` reduces inside ``training_step``: a faster rank waits
    there for the slower ones (before, counted as its compute: a 2.6x straggler under
    accumulation read as 1.4x)."""
    from lightning_hetero._comm import time_calls
    from lightning_hetero.straggler import _STRATEGY_COLLECTIVES

    events = []

    class Strategy:
        def reduce(self, value):
            events.append("reduce")
            return value

        def barrier(self, name=None):
            events.append("barrier")

        all_gather = broadcast = reduce

    strategy = Strategy()
    undo = time_calls(strategy, _STRATEGY_COLLECTIVES, _recorded_waiting(events))
    assert strategy.reduce(3) == 3
    strategy.barrier()
    assert events == ["(", "reduce", ")", "(", "barrier", ")"]
    undo()
    assert "reduce" not in vars(strategy) and strategy.reduce(4) == 4
    assert events[-1] == "reduce"
