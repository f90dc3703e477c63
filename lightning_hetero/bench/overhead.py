"""The plugin's own per-step cost: HeteroStrategy against plain DDPStrategy on a tiny model.

    python -m lightning_hetero.bench --overhead [--repeats 3] [--steps 400]
    python -m lightning_hetero.bench --overhead --adjust-every 2 [--repeats 6]

Two gloo ranks train a small MLP on random data with no throttle and a uniform plan, so
both strategies do the same arithmetic and any difference in step time is the plugin's
per-step work (its hook, timer and callbacks). Each run records the time between
consecutive ``on_train_batch_start`` calls on rank 0 and reports, after a warm-up, the
median over blocks of 8 consecutive steps of each block's mean step: a cost paid every
second step (a boundary at ``adjust_every=2``) is then spread over the steps as it is in
wall time, where the median of single steps falls anywhere between the two kinds of step,
and a stalled block is still left out. Runs alternate DDP/Hetero in pairs, and the figure
is the ratio within each pair. The CPU time ratio is the same for rank 0's process CPU
seconds per step (every thread, gloo's included): the work each strategy does, without the
waits and the scheduling that make consecutive runs on a busy machine differ by more than
a 1% cost.

With ``--adjust-every N`` the pair is HeteroStrategy(adjust_every=N) against
HeteroStrategy(adjust_every="epoch") instead: what re-planning every N steps costs over
re-planning once an epoch (the boundary's all-gather and decision, DESIGN section 6), the two
alternating in each pair as above. Both then run with a dead-band no gain passes, so both
keep the uniform plan and differ in the boundaries' work alone: on these 2.5 ms steps the
timings of the two equal ranks differ enough to move the plan, which changes the step's
arithmetic, not the boundaries' cost.
"""

import itertools
import json
import statistics
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

__all__ = [
    "boundary_share",
    "interleaved_ratio",
    "measure_interleaved",
    "measure_overhead",
    "overhead_table",
    "run_child",
    "step_time",
]

_WARMUP = 50
#: Steps per block of ``step_time``: a multiple of every ``adjust_every`` benchmarked (1, 2,
#: 4, 8).
_BLOCK = 8


def step_time(step_s: Sequence[float], block: int = _BLOCK) -> float:
    """The median over consecutive blocks of ``block`` steps of each block's mean step.

    Example:
        >>> step_time([1.0, 3.0] * 8 + [50.0] * 8, block=8)  # a stalled block is left out
        2.0
    """
    means = [
        statistics.fmean(step_s[i : i + block]) for i in range(0, len(step_s) - block + 1, block)
    ]
    return statistics.median(means) if means else statistics.median(step_s)


def run_child(config: dict[str, Any]) -> None:
    """One training run (this process and the rank Lightning launches); rank 0 writes JSON."""
    import lightning.pytorch as pl
    import torch
    from lightning.pytorch.strategies import DDPStrategy
    from torch import nn
    from torch.utils.data import DataLoader, TensorDataset

    from lightning_hetero.bench.run import release_process_group
    from lightning_hetero.strategy import HeteroStrategy

    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    steps, batch, width = config["steps"] + _WARMUP, config["batch_size"], config["width"]
    generator = torch.Generator().manual_seed(0)
    samples = steps * batch * 2 + batch
    data = TensorDataset(
        torch.randn(samples, width, generator=generator),
        torch.randint(0, 10, (samples,), generator=generator),
    )

    class Tiny(pl.LightningModule):
        def __init__(self) -> None:
            super().__init__()
            self.net = nn.Sequential(nn.Linear(width, width), nn.ReLU(), nn.Linear(width, 10))

        def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
            inputs, labels = batch
            return nn.functional.cross_entropy(self.net(inputs), labels)

        def configure_optimizers(self) -> torch.optim.Optimizer:
            return torch.optim.SGD(self.parameters(), lr=0.01)

        def train_dataloader(self) -> DataLoader:
            return DataLoader(data, batch_size=batch, shuffle=True)

    class StepClock(pl.Callback):
        def __init__(self) -> None:
            self.marks: list[float] = []
            self.cpu_marks: list[float] = []  # the process's CPU time (all its threads)
            self.thread_marks: list[float] = []  # the training thread's CPU time

        def on_train_batch_start(self, *args: Any) -> None:
            self.marks.append(time.perf_counter())
            self.cpu_marks.append(time.process_time())
            self.thread_marks.append(time.thread_time())

    class Interleave(pl.Callback):
        """Boundaries on for ``block`` batches, off for the next ``block``, and so on (the
        same batches on every rank, so boundaries stay collective): one run holds both
        kinds of step, alternating faster than the machine's load drifts."""

        def __init__(self, block: int) -> None:
            self.block, self.phases, self._kept = block, [], None

        def on_train_batch_start(self, trainer: Any, module: Any, batch: Any, index: int) -> None:
            replanner = trainer.strategy.replanner
            off = (index // self.block) % 2 == 1
            if off and self._kept is None:  # the interval the budget chose, kept for later
                self._kept, replanner.interval = replanner.interval, 1 << 30
            elif not off and self._kept is not None:
                replanner.interval, self._kept = self._kept, None
            self.phases.append(int(off))

    clock = StepClock()
    block = int(config.get("interleave", 0))
    interleave = Interleave(block) if block and config["strategy"] == "hetero" else None
    defaults = bool(config.get("defaults", False))
    strategy: Any = (
        HeteroStrategy(**config.get("options", {}))
        if config["strategy"] == "hetero"
        else DDPStrategy()
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_steps=steps,
        max_epochs=1,
        callbacks=[clock] + ([interleave] if interleave is not None else []),
        # Lightning's defaults (logger, progress bar, checkpoint) or none of them
        logger=defaults,
        enable_checkpointing=defaults,
        enable_progress_bar=defaults,
        enable_model_summary=defaults,
        num_sanity_val_steps=0,
    )
    trainer.fit(Tiny())
    if trainer.global_rank == 0:
        gaps = [b - a for a, b in zip(clock.marks[_WARMUP:], clock.marks[_WARMUP + 1 :])]
        cpu = clock.cpu_marks[_WARMUP:]
        cpu_gaps = [b - a for a, b in zip(cpu, cpu[1:])]
        thread = clock.thread_marks[_WARMUP:]
        thread_gaps = [b - a for a, b in zip(thread, thread[1:])]
        history = getattr(strategy, "history", [])
        boundary_s = [entry["boundary_s"] for entry in history]
        gather_s = [entry.get("gather_s", 0.0) for entry in history]
        intervals = [entry.get("interval") for entry in history]
        result = {
            "step_s": gaps,
            "cpu_s": cpu_gaps,
            "thread_s": thread_gaps,
            "boundary_s": boundary_s,
            "gather_s": gather_s,
            "interval": intervals,
        }
        if interleave is not None:  # 1: the step's batch had boundaries off
            result["off"] = interleave.phases[_WARMUP : _WARMUP + len(gaps)]
        Path(config["result"]).write_text(json.dumps(result))
    release_process_group()


def measure_overhead(
    repeats: int = 3,
    steps: int = 400,
    batch_size: int = 32,
    width: int = 64,
    defaults: bool = False,
    options: dict[str, Any] | None = None,
    progress: Any = None,
    baseline: dict[str, Any] | None = None,
) -> list[dict[str, float]]:
    """Alternated DDP/Hetero pairs; per pair the step time of each (``step_time``) and
    their ratio.

    ``baseline``: HeteroStrategy options that replace DDPStrategy in each pair (the ``"ddp"``
    entry is then that HeteroStrategy's step), e.g. ``{"adjust_every": "epoch"}`` against
    ``options={"adjust_every": 2}``."""
    from lightning_hetero.bench.run import launch

    base = {"steps": steps, "batch_size": batch_size, "width": width, "defaults": defaults}
    pairs = []
    with tempfile.TemporaryDirectory() as tmp:
        for repeat in range(repeats):
            medians = {}
            order = ("ddp", "hetero") if repeat % 2 == 0 else ("hetero", "ddp")
            for name in order:
                config = {**base, "strategy": name, "options": options or {}}
                if name == "ddp" and baseline is not None:
                    config = {**config, "strategy": "hetero", "options": baseline}
                run = launch(config, Path(tmp), 600, "lightning_hetero.bench.overhead")
                medians[name] = step_time(run["step_s"])
                if run.get("cpu_s"):  # CPU seconds per step: the work, without the waits
                    medians[f"{name}_cpu"] = statistics.fmean(run["cpu_s"])
                if name == "hetero":  # its boundaries' time per step over its mean step
                    steps_run = len(run["step_s"]) + _WARMUP + 1
                    mean_step = statistics.fmean(run["step_s"])
                    per_step = sum(run["boundary_s"]) / steps_run
                    medians["boundary_share"] = per_step / mean_step
                    gathers = sum(run.get("gather_s", [])) / steps_run  # the all-gather's part
                    medians["boundary_share_local"] = (per_step - gathers) / mean_step
                if progress is not None:
                    progress.update()
            medians["ratio"] = medians["hetero"] / medians["ddp"]
            if "hetero_cpu" in medians and "ddp_cpu" in medians:
                medians["cpu_ratio"] = medians["hetero_cpu"] / medians["ddp_cpu"]
            pairs.append(medians)
    return pairs


def interleaved_ratio(step_s: Sequence[float], off: Sequence[int], block: int) -> float:
    """The median, over consecutive pairs of blocks (boundaries on, then off), of the on
    block's mean step over the off block's.

    Example:
        >>> interleaved_ratio([1.1, 1.1, 1.0, 1.0] * 3, [0, 0, 1, 1] * 3, block=2)
        1.1
    """
    ratios, on_block, start = [], None, 0
    for kind, group in itertools.groupby(off[: len(step_s)]):
        size = len(list(group))
        mean = statistics.fmean(step_s[start : start + size])
        start += size
        if size != block:  # a block cut by the warm-up or the end: not used
            on_block = None
        elif kind == 0:
            on_block = mean
        elif on_block is not None:
            ratios.append(on_block / mean)
            on_block = None
    if not ratios:
        raise ValueError(f"no pair of whole blocks of {block} steps in {len(step_s)} steps")
    return statistics.median(ratios)


def boundary_share(
    step_s: Sequence[float], off: Sequence[int], boundary_s: Sequence[float]
) -> float:
    """The boundaries' own time over the time of the steps that had boundaries on: their
    cost as counted directly, where the on/off ratio also holds the machine's noise.

    Example:
        >>> boundary_share([2.0, 2.0, 1.0, 1.0], [0, 0, 1, 1], [0.02, 0.02])
        0.01
    """
    on = sum(step for step, kind in zip(step_s, off) if not kind)
    return sum(boundary_s) / on


def _on_off_ratios(run: dict[str, Any], block: int, prefix: str = "") -> dict[str, float]:
    """``interleaved_ratio`` of a run's wall, process CPU and training-thread CPU times."""
    series = (("ratio", "step_s"), ("cpu_ratio", "cpu_s"), ("thread_ratio", "thread_s"))
    return {
        prefix + name: interleaved_ratio(run[times], run["off"], block) for name, times in series
    }


def measure_interleaved(
    repeats: int = 3,
    steps: int = 4000,
    block: int = 128,
    options: dict[str, Any] | None = None,
    progress: Any = None,
    control: bool = False,
) -> list[dict[str, float]]:
    """One HeteroStrategy run per repeat whose boundaries are on and off in alternate
    blocks of ``block`` batches; per run, the median over block pairs of the on block's mean
    step (wall time, the process's CPU time and the training thread's) over the off block's
    (``interleaved_ratio``), and the boundaries' own share of the on blocks' time
    (``boundary_share``).

    ``control``: each repeat also runs the same blocks with ``adjust_every="epoch"``, so
    that neither block has a boundary (an A/A run): its ratios (``control_ratio``,
    ``control_cpu_ratio``, ``control_thread_ratio``) show what the machine's noise alone
    gives."""
    from lightning_hetero.bench.run import launch

    config = {
        "steps": steps, "batch_size": 32, "width": 64, "defaults": True, "strategy": "hetero",
        "options": options or {}, "interleave": block,
    }  # fmt: skip
    runs = []
    with tempfile.TemporaryDirectory() as tmp:
        for _ in range(repeats):
            run = launch(config, Path(tmp), 900, "lightning_hetero.bench.overhead")
            row = {
                **_on_off_ratios(run, block),
                "boundary_share": boundary_share(run["step_s"], run["off"], run["boundary_s"]),
                "step_s": statistics.median(run["step_s"]),
                "boundaries": float(len(run["boundary_s"])),
                "interval": float(statistics.median(i for i in run["interval"] if i)),
            }
            if control:
                same = {**config, "options": {**config["options"], "adjust_every": "epoch"}}
                null = launch(same, Path(tmp), 900, "lightning_hetero.bench.overhead")
                row.update(_on_off_ratios(null, block, prefix="control_"))
            runs.append(row)
            if progress is not None:
                progress.update()
    return runs


def overhead_table(
    pairs: Sequence[dict[str, float]],
    names: tuple[str, str] = ("DDPStrategy", "HeteroStrategy"),
) -> str:
    """Markdown: min / median / max over pairs of each strategy's median step and the ratio
    (``names``: the baseline's and the candidate's column names), and where the pairs have it
    the candidate's time at boundaries over its steps' time (``boundary_share``; without the
    all-gather, ``boundary_share_local``)."""

    from lightning_hetero.bench._format import spread

    def cell(key: str, scale: float, fmt: str) -> str:
        return spread([pair[key] for pair in pairs], fmt, scale)

    share = all("boundary_share" in pair and "boundary_share_local" in pair for pair in pairs)
    cpu = all("cpu_ratio" in pair for pair in pairs)
    return "\n".join(
        [
            f"| {names[0]} step (ms) | {names[1]} step (ms) | ratio |"
            + (" CPU time ratio |" if cpu else "")
            + (" boundaries / steps | without the all-gather |" if share else ""),
            "|---|---|---|" + ("---|" if cpu else "") + ("---|---|" if share else ""),
            f"| {cell('ddp', 1e3, '.3f')} | {cell('hetero', 1e3, '.3f')}"
            f" | {cell('ratio', 1, '.3f')} |"
            + (f" {cell('cpu_ratio', 1, '.3f')} |" if cpu else "")
            + (
                f" {cell('boundary_share', 1, '.4f')} | {cell('boundary_share_local', 1, '.4f')} |"
                if share
                else ""
            ),
        ]
    )


if __name__ == "__main__":
    run_child(json.loads(sys.argv[1]))
