"""StragglerReport's benchmark: its overhead on a plain DDP job, and the backward straggler.

Every fit of a command runs in one launch (one process group; Lightning starts the other
ranks by re-running the command), one after another on every rank:

    python -m lightning_hetero.bench.straggler overhead [--workers 2] [--repeats 10]
    python -m lightning_hetero.bench.straggler scenario [--workers 4] [--delay 0.2] [--repeats 3]
    python -m lightning_hetero.bench.straggler hetero [--workers 4] [--delay 0.2] [--repeats 3]
    python -m lightning_hetero.bench.straggler timer [--accelerator gpu] [--repeats 5]

``--accelerator gpu --workers 1`` times the overhead on one GPU (CUDA events). ``timer``:
the step timer alone in a plain PyTorch loop on one device (no Lightning, no process
group; 9 layers of 1024, batch 512, 300 steps unless told): seconds per step with no
timer, with the gradient hooks only, and with the whole timer (the hooks, every mark and a
``collect`` each step, as ``StragglerReport`` runs it), which goes first rotating; the
ratios to the loop without it, median over repeats, and the timer's events created and
recorded per step (CUDA only).

``overhead``: the same DDP job with and without the report, alternating which goes first;
each fit's time per step is the median over its epochs after the first, and the result is
the median over repeats of (with / without). ``scenario``: ``--delay`` seconds of busy work
added to rank 1's backward only (inside an autograd function's backward), then the same job
with equal ranks; the table has each repeat's first report (pace-setter, rank 1's compute
against the injected delay plus rank 0's compute). ``hetero``: the delay (per ``--batch-size``
samples, so it grows with rank 1's share) under ``HeteroStrategy``, 4 epochs: each boundary's
plan, step time and pace-setter, and the fraction of the speedup the measured curves allow
that its plan recovers. Rank 0 prints a table and the JSON.
"""

import argparse
import json
import os
import statistics
import time
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero.straggler import StragglerReport

__all__ = ["hetero_rows", "main", "overhead_rows", "scenario_rows", "timer_rows"]


#: ``--sleep``: the work sleeps instead (ranks on fewer cores than ranks then do not slow each
#: other down, as separate devices would not)
_SLEEP = False


def _spin(seconds: float) -> None:
    """Busy work: a device's compute holds the training thread (``_SLEEP``: a sleep)."""
    if _SLEEP:
        time.sleep(seconds)
        return
    end = time.perf_counter() + seconds
    while time.perf_counter() < end:
        pass


class _SlowBackward(torch.autograd.Function):
    """The identity, whose backward spends ``delay`` seconds more."""

    @staticmethod
    def forward(ctx: Any, x: torch.Tensor, delay: float) -> torch.Tensor:
        ctx.delay = delay
        return x.view_as(x)

    @staticmethod
    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        if ctx.delay:
            _spin(ctx.delay)
        return grad, None


class _Model(pl.LightningModule):
    """An MLP of ``depth`` layers; ``busy`` seconds of work in each step's forward, and
    ``delay`` more per ``base`` samples in ``slow_rank``'s backward."""

    def __init__(
        self, width: int, depth: int, busy: float, delay: float, slow_rank: int, base: int
    ) -> None:
        super().__init__()
        self.busy, self.delay, self.slow_rank, self.base = busy, delay, slow_rank, base
        self.layers = torch.nn.ModuleList(torch.nn.Linear(width, width) for _ in range(depth))
        self.head = torch.nn.Linear(width, 1)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        if self.busy:
            _spin(self.busy)
        for i, layer in enumerate(self.layers):
            x = torch.relu(layer(x))
            if i == 0:  # the delay grows with the batch: `delay` at the base batch size
                slow = self.global_rank == self.slow_rank
                x = _SlowBackward.apply(x, self.delay * len(x) / self.base if slow else 0.0)
        return torch.nn.functional.mse_loss(self.head(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.01)


class _EpochClock(Callback):
    """Seconds per training step of each epoch, on this rank."""

    def __init__(self) -> None:
        self.per_step: list[float] = []
        self._started = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._started = time.perf_counter()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        batches = max(1, int(trainer.num_training_batches))
        self.per_step.append((time.perf_counter() - self._started) / batches)


def _fit(
    args: argparse.Namespace, report: bool, delay: float, strategy: Any = "ddp"
) -> tuple[float, list[dict], Any]:
    """One fit; returns its median seconds per step (epochs after the first), the
    report's history (empty without the report) and the trainer."""
    torch.manual_seed(0)
    samples = args.workers * args.batch_size * args.steps
    data = TensorDataset(torch.randn(samples, args.width), torch.randn(samples, 1))
    clock = _EpochClock()
    straggler = StragglerReport()
    trainer = pl.Trainer(
        accelerator=args.accelerator,
        devices=args.workers,
        strategy=strategy,
        max_epochs=args.epochs,
        callbacks=[clock, straggler] if report else [clock],
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = _Model(args.width, args.depth, args.busy, delay, slow_rank=1, base=args.batch_size)
    trainer.fit(model, DataLoader(data, batch_size=args.batch_size))
    later = clock.per_step[1:] or clock.per_step
    return statistics.median(later), straggler.history, trainer


def overhead_rows(args: argparse.Namespace) -> list[dict[str, float]]:
    """Each repeat's seconds per step without and with the report, and their ratio."""
    rows = []
    for repeat in range(args.repeats):
        order = (False, True) if repeat % 2 == 0 else (True, False)
        times = {with_report: _fit(args, with_report, 0.0)[0] for with_report in order}
        rows.append(
            {"without_s": times[False], "with_s": times[True], "ratio": times[True] / times[False]}
        )
    return rows


def scenario_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each repeat's first report with the delay on rank 1, and with equal ranks."""
    rows = []
    for repeat in range(args.repeats):
        for delay in (args.delay, 0.0):
            _, history, _ = _fit(args, True, delay)
            first = history[0]
            compute = first["compute_times"]
            expected = delay + compute[0]
            rows.append(
                {
                    "repeat": repeat,
                    "delay_s": delay,
                    "pace_setter": first["pace_setter"],
                    "compute_s": compute,
                    "wait_s": first["wait_times"],
                    "rank1_vs_expected": compute[1] / expected,
                    "allowed_speedup": first["allowed_speedup"],
                }
            )
    return rows


def hetero_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """The same delay under ``HeteroStrategy`` (the delay grows with rank 1's batch): each
    boundary's plan, step time, and the fraction of the allowed speedup it recovers."""
    from lightning_hetero import HeteroStrategy
    from lightning_hetero.planning.base import BatchLimits
    from lightning_hetero.planning.model import allowed_speedup
    from lightning_hetero.planning.stragglers import pace_setter

    rows = []
    for repeat in range(args.repeats):
        strategy = HeteroStrategy(controller=args.controller)
        _, report, trainer = _fit(args, True, args.delay, strategy=strategy)
        history = trainer.strategy.history
        # what the measured curves allow (every size each rank ran: fixed costs fitted)
        seen: list[dict[int, list[float]]] = [{} for _ in history[0]["batch_sizes"]]
        for entry in history:
            for by_size, b, t in zip(seen, entry["batch_sizes"], entry["compute_times"]):
                by_size.setdefault(int(b), []).append(float(t))
        curves = [[(b, statistics.median(ts)) for b, ts in sorted(s.items())] for s in seen]
        plan = history[0]["batch_sizes"]
        allowed = allowed_speedup(curves, BatchLimits.build(len(plan), sum(plan)))
        uniform_s = history[0]["step_time"]
        for k, entry in enumerate(history):
            rows.append(
                {
                    "repeat": repeat,
                    "boundary": k,
                    "batch_sizes": entry["batch_sizes"],
                    "step_s": entry["step_time"],
                    "pace_setter": pace_setter(entry["compute_times"]),
                    "report_pace_setter": report[k]["pace_setter"] if k < len(report) else None,
                    "allowed_speedup": allowed,
                    "recovered": uniform_s / entry["step_time"] / allowed,
                }
            )
    return rows


class _Counted:
    """A CUDA event that counts its records (``timer``'s records per step)."""

    records = 0

    def __init__(self) -> None:
        self.event = torch.cuda.Event(enable_timing=True)

    def record(self, stream: Any = None) -> None:
        _Counted.records += 1
        self.event.record() if stream is None else self.event.record(stream)

    def query(self) -> bool:
        return self.event.query()

    def synchronize(self) -> None:
        self.event.synchronize()

    def elapsed_time(self, end: "_Counted") -> float:
        return self.event.elapsed_time(end.event)


def timer_rows(args: argparse.Namespace) -> list[dict[str, Any]]:
    """Each repeat's seconds per step of a plain training loop without the step timer,
    with its gradient hooks only, and with the whole timer; the ratios to the first."""
    from lightning_hetero._comm import CudaStepTimer, HostStepTimer
    from lightning_hetero.modes.bsp import mark_grads_ready

    device = torch.device("cuda" if args.accelerator == "gpu" else "cpu")
    torch.manual_seed(0)
    layers: list[torch.nn.Module] = []
    for _ in range(args.depth):
        layers += [torch.nn.Linear(args.width, args.width), torch.nn.ReLU()]
    model = torch.nn.Sequential(*layers, torch.nn.Linear(args.width, 1)).to(device)
    optimizer = torch.optim.SGD(model.parameters(), lr=1e-4)
    x = torch.randn(args.batch_size, args.width, device=device)
    y = torch.randn(args.batch_size, 1, device=device)

    def sync() -> None:
        if device.type == "cuda":
            torch.cuda.synchronize(device)

    def fit(kind: str) -> tuple[float, dict[str, float]]:
        timer: HostStepTimer | None = None
        if kind == "timer":
            timer = CudaStepTimer(event_factory=_Counted) if device.type == "cuda" else None
            timer = timer or HostStepTimer()
        ready = timer.grads_ready if timer is not None else (lambda: None)
        handles = mark_grads_ready(model, ready) if kind != "none" else []
        before = _Counted.records

        def step() -> None:
            if timer is not None:
                timer.start(args.batch_size)
            loss = torch.nn.functional.mse_loss(model(x), y)
            optimizer.zero_grad(set_to_none=True)
            loss.backward()
            if timer is not None:
                timer.backward_done()
            optimizer.step()
            if timer is not None:
                timer.step_done()
                timer.collect()

        try:
            for _ in range(10):  # warm-up
                step()
            sync()
            before = _Counted.records
            began = time.perf_counter()
            for _ in range(args.steps):
                step()
            sync()
            seconds = (time.perf_counter() - began) / args.steps
        finally:
            for handle in handles:
                handle.remove()
        counts: dict[str, float] = {}
        if isinstance(timer, CudaStepTimer):
            counts = {
                "events_created": timer.events_created,
                "records_per_step": (_Counted.records - before) / args.steps,
            }
        return seconds, counts

    kinds = ["none", "hooks", "timer"]
    rows = []
    for repeat in range(args.repeats):
        order = kinds[repeat % 3 :] + kinds[: repeat % 3]
        measured = {kind: fit(kind) for kind in order}
        none_s = measured["none"][0]
        rows.append(
            {
                "repeat": repeat,
                **{f"{kind}_s": measured[kind][0] for kind in kinds},
                "hooks_ratio": measured["hooks"][0] / none_s,
                "timer_ratio": measured["timer"][0] / none_s,
                **measured["timer"][1],
            }
        )
    return rows


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(prog="python -m lightning_hetero.bench.straggler")
    parser.add_argument("what", choices=["overhead", "scenario", "hetero", "timer"])
    parser.add_argument("--workers", type=int, default=None, help="2 (overhead), 4 (scenario)")
    parser.add_argument("--repeats", type=int, default=None, help="10 (overhead), 3 (scenario)")
    parser.add_argument("--delay", type=float, default=0.2, help="rank 1's backward, s/step")
    parser.add_argument("--busy", type=float, default=None, help="every rank's forward, s/step")
    parser.add_argument("--epochs", type=int, default=None)
    parser.add_argument("--steps", type=int, default=None, help="per epoch")
    parser.add_argument("--batch-size", type=int, default=None, help="16 (timer: 512)")
    parser.add_argument("--width", type=int, default=None, help="128 (timer: 1024)")
    parser.add_argument("--depth", type=int, default=8)
    parser.add_argument("--accelerator", default="cpu", help="cpu (gloo ranks) or gpu")
    parser.add_argument("--sleep", action="store_true", help="sleep instead of busy work")
    parser.add_argument("--controller", default="proportional", help="hetero: its controller")
    parser.add_argument("--out", default=None, help="write the rows as JSON here")
    args = parser.parse_args(argv)
    global _SLEEP
    _SLEEP = args.sleep
    torch.set_num_threads(1)
    overhead = args.what == "overhead"
    if args.what == "timer":
        for name, default in (("repeats", 5), ("steps", 300), ("width", 1024), ("batch_size", 512)):
            if getattr(args, name) is None:
                setattr(args, name, default)
        rows = timer_rows(args)
        for row in rows:
            print(json.dumps(row))
        print(
            f"step timer alone ({args.accelerator}, {args.depth + 1} layers of {args.width},"
            f" batch {args.batch_size}, {args.steps} steps, a step"
            f" {statistics.median(r['none_s'] for r in rows) * 1e3:.2f} ms without it):"
            f" hooks only {statistics.median(r['hooks_ratio'] for r in rows):.4f}x, the whole"
            f" timer {statistics.median(r['timer_ratio'] for r in rows):.4f}x (median over"
            f" {len(rows)} repeats)"
        )
        if args.out:
            with open(args.out, "w") as f:
                json.dump({"args": vars(args), "rows": rows}, f, indent=1)
        return
    for name, for_overhead, for_scenario in (
        ("workers", 2, 4),
        ("repeats", 10, 3),
        ("busy", 0.01, 0.05),
        ("epochs", 3, 1 if args.what == "scenario" else 4),
        ("steps", 40, 8),
        ("batch_size", 16, 16),
        ("width", 128, 128),
    ):
        if getattr(args, name) is None:
            setattr(args, name, for_overhead if overhead else for_scenario)
    rows: list[dict[str, Any]] = (
        overhead_rows(args)
        if overhead
        else scenario_rows(args)
        if args.what == "scenario"
        else hetero_rows(args)
    )
    if int(os.environ.get("LOCAL_RANK", "0")) != 0:  # rank 0 says it
        return
    for row in rows:
        print(json.dumps(row))
    if overhead:
        ratios = [row["ratio"] for row in rows]
        step_s = statistics.median(row["without_s"] for row in rows)
        print(
            f"report overhead ({args.workers} {args.accelerator} ranks, {args.depth + 1} layers"
            f" of {args.width}, batch {args.batch_size},"
            f" {args.busy * 1e3:.0f} ms busy a step): with/without seconds per step, median"
            f" {statistics.median(ratios):.4f} (min {min(ratios):.4f}, max {max(ratios):.4f})"
            f" over {len(ratios)} repeats; a step takes {step_s * 1e3:.1f} ms without it"
        )
    elif args.what == "hetero":
        for row in rows:
            print(
                f"hetero, repeat {row['repeat']}, boundary {row['boundary']}: plan"
                f" {row['batch_sizes']}, step {row['step_s']:.3f} s, pace-setter"
                f" {row['pace_setter']} (report: {row['report_pace_setter']}), recovered"
                f" {row['recovered']:.2f} of the allowed {row['allowed_speedup']:.2f}x"
            )
    else:
        slow = [row for row in rows if row["delay_s"] > 0]
        equal = [row for row in rows if row["delay_s"] == 0]
        print(
            f"backward straggler ({args.workers} ranks, {args.delay * 1e3:.0f} ms in rank 1's"
            f" backward): pace-setters {[r['pace_setter'] for r in slow]}, rank 1's compute /"
            f" (delay + rank 0's) {[round(r['rank1_vs_expected'], 3) for r in slow]}; equal"
            f" ranks: pace-setters {[r['pace_setter'] for r in equal]}"
        )
    if args.out:
        with open(args.out, "w") as f:
            json.dump({"args": vars(args), "rows": rows}, f, indent=1)


if __name__ == "__main__":
    main()
