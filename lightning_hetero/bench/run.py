"""One training run of the digits workload on emulated workers, as its own process group.

Used by the benchmark, the demo and the end-to-end tests:

    python -m lightning_hetero.bench.run '{"strategy": "hetero", "workers": 4, ...}'

Lightning's launcher starts the other ranks by re-running this command; rank 0 writes
a JSON summary to ``result`` when the run ends.
"""

import json
import math
import os
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from lightning.pytorch.loggers import CSVLogger, TensorBoardLogger
from lightning.pytorch.strategies import DDPStrategy, ModelParallelStrategy
from lightning.pytorch.trainer.states import TrainerFn
from lightning.pytorch.utilities.data import extract_batch_size

from lightning_hetero._comm import HostStepTimer
from lightning_hetero.modes.bsp import mark_grads_ready

__all__ = [
    "AccuracyCurve",
    "EpochTimer",
    "RunConfig",
    "StepTimes",
    "child_env",
    "launch",
    "run",
    "run_pair",
]


@dataclass
class RunConfig:
    """What to run; every field has a JSON-friendly type."""

    # "hetero" or "ddp"; sharded (FSDP2): "hetero_fsdp" or "fsdp" (ModelParallelStrategy)
    strategy: str = "hetero"
    workers: int = 4
    sample_cost: list[float] | dict[str, list[float]] | None = None
    throttle_unit: str = "epoch"  # what the keys of a sample_cost mapping count: epoch or step
    # Throttle's other costs (a number for every rank or one per rank): seconds per sample of
    # loading on the training thread, seconds per step, the least compute delay per step;
    # noise: relative standard deviation of every delay; stalls: [probability, seconds] (or
    # one pair per rank) of a stall at an optimizer step (both seeded with `seed`)
    load_cost: float | list[float] = 0.0
    step_cost: float | list[float] = 0.0
    floor: float | list[float] = 0.0
    noise: float = 0.0
    stalls: list[float] | list[list[float]] = field(default_factory=lambda: [0.0, 0.0])
    epochs: int = 4
    batch_size: int = 32  # per rank under uniform DDP; B = batch_size * workers
    controller: str = "proportional"
    controller_options: dict[str, Any] = field(default_factory=dict)  # e.g. {"predictor": "narx"}
    batch_sizes: str | list[int] = "uniform"
    adjust_every: str | int = "epoch"
    weighted: bool = True
    deadband: float | str = "auto"
    # "cnn" (BatchNorm + torchmetrics), "boring" (Lightning's BoringModel) or "reverse" (a
    # one-layer transformer reversing digit sequences, Adam with warm-up and cosine decay)
    model: str = "cnn"
    resolution: int = 8  # digits upsampled to resolution x resolution
    dropout: float = 0.0
    # ProgressiveSchedule stages: [{"lr": 0.05, "substages": [{"epochs": 2, "resolution": 24,
    # "dropout": 0.1}, ...]}, ...]
    progressive: list[dict[str, Any]] | None = None
    lr: float = 0.05
    num_workers: int = 0
    seed: int = 0
    log_dir: str | None = None
    checkpoint_dir: str | None = None
    resume_from: str | None = None
    validate: bool = True  # validate once after fit
    val_every_epoch: bool = False  # validate after every epoch during fit: accuracy_curve
    result: str | None = None
    # a file where rank 0 writes the number of training epochs finished (launch's progress)
    progress: str | None = None
    # Lightning's default; benchmarks turn it off (their own bar counts runs, and per-rank
    # bars in captured output would only interleave)
    progress_bar: bool = True
    extra: dict[str, Any] = field(default_factory=dict)
    # "cpu", or "gpu": every worker shares cuda:0 (gloo, since NCCL refuses two ranks per GPU)
    accelerator: str = "cpu"
    # per-rank CUDA_MPS_ACTIVE_THREAD_PERCENTAGE (GPU, under an MPS daemon): unequal SM shares
    mps_shares: list[int] | None = None
    width: int = 1  # channel multiplier of the digits CNN
    # "ddp" only: each rank's compute and wait time per step, with HeteroStrategy's meter
    # (summary["step_times"], see StepTimes); off by default (a Python hook per parameter)
    step_times: bool = False
    # Lightning's gradient accumulation (the DDP baseline of memory-bound ranks; the hetero
    # strategy plans a step's samples as one global batch of micro-batches instead)
    accumulate_grad_batches: int = 1


def _validating_in_fit(trainer: pl.Trainer) -> bool:
    return trainer.state.fn == TrainerFn.FITTING and not trainer.sanity_checking


class EpochTimer(Callback):
    """Wall time of each training epoch, as rank 0 sees it (ranks move in lock-step).

    Validation during fit runs inside the epoch; its time is left out.
    """

    def __init__(self, progress: str | None = None) -> None:
        self.epoch_s: list[float] = []
        self.progress = progress  # a file for the epochs finished so far (rank 0 writes it)
        self._start = 0.0
        self._val_start = 0.0
        self._val_s = 0.0

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._start = time.perf_counter()
        self._val_s = 0.0

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if _validating_in_fit(trainer):
            self._val_s += time.perf_counter() - self._val_start

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.epoch_s.append(time.perf_counter() - self._start - self._val_s)
        if self.progress is not None and trainer.is_global_zero:
            Path(self.progress).write_text(f"{len(self.epoch_s)}\n")


class AccuracyCurve(Callback):
    """Validation results during fit against the training time so far, as rank 0 sees them.

    ``points`` holds one ``(train_s, val_acc, val_loss)`` per validation: ``train_s`` is the
    time since training started, validation left out. The validation clock starts at
    ``on_validation_epoch_start``, after the strategy's ``on_validation_start`` (async mode
    waits for every rank and pulls the server's model there; local mode merges the epoch's
    last mega-batches): that work counts as training. ``train_s``: the same measure at the
    end of training. ``setup_s``: the seconds from the start of ``fit`` (this callback's
    ``setup``) to the start of training (the strategy's set-up and first plan, time probes
    included), to add to both for the time since the start of ``fit``.
    """

    def __init__(self) -> None:
        self.points: list[tuple[float, float, float]] = []
        self.train_s = 0.0
        self.setup_s = 0.0
        self._fit_start: float | None = None
        self._train_start = 0.0
        self._val_start = 0.0
        self._val_s = 0.0

    def setup(self, trainer: pl.Trainer, pl_module: pl.LightningModule, stage: str) -> None:
        if stage == "fit":
            self._fit_start = time.perf_counter()

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._train_start = time.perf_counter()
        if self._fit_start is not None:
            self.setup_s = self._train_start - self._fit_start
        self._val_s = 0.0
        self.points = []

    def on_validation_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._val_start = time.perf_counter()

    def on_validation_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        if not _validating_in_fit(trainer):
            return
        trained = self._val_start - self._train_start - self._val_s
        self._val_s += time.perf_counter() - self._val_start
        metrics = trainer.callback_metrics
        acc, loss = (float(metrics.get(key, math.nan)) for key in ("val_acc", "val_loss"))
        self.points.append((trained, acc, loss))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.train_s = time.perf_counter() - self._train_start - self._val_s


class StepTimes(Callback):
    """Each rank's mean compute and wait time per step, per epoch, under plain DDP.

    The same meter as HeteroStrategy's ``history`` (``compute_times``, ``wait_times``):
    a ``HostStepTimer`` whose wait runs from the moment the
    local gradients are all accumulated (post-accumulate-grad hooks) to the end of the
    backward, all-reduce included. After fit, every rank's ``compute_times`` and
    ``wait_times`` hold one list per epoch with one value per rank.
    """

    def __init__(self) -> None:
        self.timer = HostStepTimer()
        self.compute_times: list[list[float]] = []
        self.wait_times: list[list[float]] = []
        self._epochs: list[tuple[float, float]] = []  # this rank's means per epoch
        self._handles: list[Any] = []

    def on_train_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self._handles = mark_grads_ready(pl_module, self.timer.grads_ready)

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.timer.break_cycle()

    def on_validation_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.timer.break_cycle()

    def on_train_batch_start(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, batch: Any, batch_idx: int
    ) -> None:
        self.timer.start(extract_batch_size(batch))

    def on_after_backward(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.timer.backward_done()

    def on_train_batch_end(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, *args: Any
    ) -> None:
        self.timer.step_done()

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        records = self.timer.collect()
        n = max(1, len(records))
        compute_s = sum(r.compute_s for r in records) / n if records else math.nan
        self._epochs.append((compute_s, sum(r.wait_s for r in records) / n))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        for handle in self._handles:
            handle.remove()
        if not self._epochs:  # every rank alike
            return
        mine = torch.tensor(self._epochs, dtype=torch.float64)
        every = trainer.strategy.all_gather(mine)  # (ranks, epochs, 2)
        every = every.reshape(-1, *mine.shape).cpu()
        self.compute_times = every[:, :, 0].T.tolist()
        self.wait_times = every[:, :, 1].T.tolist()


def _model_and_data(config: RunConfig) -> tuple[pl.LightningModule, pl.LightningDataModule]:
    if config.model == "boring":
        from lightning.pytorch.demos.boring_classes import BoringDataModule, BoringModel

        return BoringModel(), BoringDataModule()
    if config.model == "reverse":
        from lightning_hetero.bench.workload import ReverseDataModule, ReverseTransformer

        return ReverseTransformer(lr=config.lr), ReverseDataModule(config.batch_size, config.seed)
    from lightning_hetero.bench.workload import DigitsCNN, DigitsDataModule

    return DigitsCNN(lr=config.lr, dropout=config.dropout, width=config.width), DigitsDataModule(
        config.batch_size, config.num_workers, config.seed, config.resolution
    )


def _shared_gpu(config: RunConfig) -> dict[str, Any]:
    """Strategy options that put every worker on ``cuda:0`` (``{}`` on CPU).

    With ``mps_shares`` this process's share of the GPU's SMs is set here, before it
    creates its CUDA context; the launcher's child processes carry ``LOCAL_RANK``.
    """
    if config.accelerator not in ("cpu", "gpu"):
        raise ValueError(f"`accelerator` must be 'cpu' or 'gpu', got {config.accelerator!r}.")
    if config.accelerator == "cpu":
        if config.mps_shares is not None:
            raise ValueError("`mps_shares` needs accelerator='gpu'.")
        return {}
    if config.mps_shares is not None:
        shares = config.mps_shares
        if len(shares) != config.workers or not all(1 <= s <= 100 for s in shares):
            raise ValueError(
                f"`mps_shares` needs one percentage in [1, 100] per worker, got {shares}."
            )
        rank = int(os.environ.get("LOCAL_RANK", 0))
        os.environ["CUDA_MPS_ACTIVE_THREAD_PERCENTAGE"] = str(shares[rank])
    return {
        "parallel_devices": [torch.device("cuda", 0)] * config.workers,
        "process_group_backend": "gloo",
    }


def controller_of(config: RunConfig) -> Any:
    """The controller a run asks for: a name, or an instance with its options."""
    from lightning_hetero.planning import CONTROLLERS

    if config.controller_options:
        return CONTROLLERS[config.controller](**config.controller_options)
    return config.controller


def run(config: RunConfig) -> dict[str, Any]:
    """Train as configured; returns (and on rank 0 writes) the summary."""
    from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy
    from lightning_hetero.callback import HeteroCallback
    from lightning_hetero.emulate import Throttle

    torch.set_num_threads(1)  # several ranks share the machine's cores
    gpu = _shared_gpu(config)
    if gpu and config.strategy in ("hetero_fsdp", "fsdp"):
        raise ValueError("The sharded strategies run on CPU ranks in this benchmark.")
    if config.step_times and config.strategy != "ddp":
        raise ValueError(
            f"`step_times` times plain DDP; strategy={config.strategy!r} has its own history."
        )
    pl.seed_everything(config.seed, workers=True, verbose=False)
    if config.strategy == "hetero":
        strategy: Any = HeteroStrategy(
            controller=controller_of(config),
            batch_sizes=config.batch_sizes,
            adjust_every=config.adjust_every,
            weighted=config.weighted,
            deadband=config.deadband,
            **gpu,
            **config.extra,
        )
    elif config.strategy == "hetero_fsdp":
        strategy = HeteroFSDPStrategy(
            controller=controller_of(config),
            batch_sizes=config.batch_sizes,
            adjust_every=config.adjust_every,
            deadband=config.deadband,
            **config.extra,
        )
    elif config.strategy == "ddp":
        strategy = DDPStrategy(**gpu)
    elif config.strategy == "fsdp":
        strategy = ModelParallelStrategy(data_parallel_size=config.workers, tensor_parallel_size=1)
    else:
        raise ValueError(
            f"Unknown strategy {config.strategy!r}; expected 'hetero', 'ddp', 'hetero_fsdp' or"
            " 'fsdp'."
        )
    timer, curve = EpochTimer(config.progress), AccuracyCurve()
    callbacks: list[Callback] = [timer]
    # the strategy's own callback, passed in so that its end-of-fit summary outlives the fit
    hetero = HeteroCallback() if config.strategy in ("hetero", "hetero_fsdp") else None
    if hetero is not None:
        callbacks.append(hetero)
    step_times = StepTimes()
    if config.step_times:
        callbacks.append(step_times)
    if config.val_every_epoch:
        callbacks.append(curve)
    per_rank = (config.load_cost, config.step_cost, config.floor)
    if (
        config.sample_cost is not None
        or config.noise != 0
        or config.stalls != [0.0, 0.0]
        or any(isinstance(value, list) or value != 0 for value in per_rank)
    ):
        cost: Any = config.sample_cost
        if cost is None:  # only the other costs: no per-sample device time
            cost = [0.0] * config.workers
        elif isinstance(cost, dict):
            cost = {int(epoch): costs for epoch, costs in cost.items()}
        throttle = Throttle(
            cost,
            unit=config.throttle_unit,  # type: ignore[arg-type]
            load_cost=config.load_cost,
            step_cost=config.step_cost,
            floor=config.floor,
            noise=config.noise,
            stalls=config.stalls,
            seed=config.seed,
        )
        callbacks.append(throttle)
    if config.progressive is not None:
        from lightning_hetero.progressive import ProgressiveSchedule, Stage, SubStage

        stages = [
            Stage(lr=stage["lr"], substages=[SubStage(**sub) for sub in stage["substages"]])
            for stage in config.progressive
        ]
        callbacks.append(ProgressiveSchedule(stages))
    if config.checkpoint_dir:
        callbacks.append(
            ModelCheckpoint(dirpath=config.checkpoint_dir, save_last=True, save_top_k=0)
        )
    loggers: list[Any] = []
    if config.log_dir:
        loggers = [
            CSVLogger(config.log_dir, name=config.strategy, version="csv"),
            TensorBoardLogger(config.log_dir, name=config.strategy, version="tensorboard"),
        ]
    trainer = pl.Trainer(
        accelerator=config.accelerator,
        devices=1 if gpu else config.workers,  # with a shared GPU the strategy has the list
        strategy=strategy,
        max_epochs=config.epochs,
        callbacks=callbacks,
        logger=loggers or False,
        enable_checkpointing=bool(config.checkpoint_dir),
        enable_progress_bar=config.progress_bar,
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=1.0 if config.val_every_epoch else 0,
        log_every_n_steps=1,
        accumulate_grad_batches=config.accumulate_grad_batches,
    )
    model, data = _model_and_data(config)
    started = time.perf_counter()
    trainer.fit(model, data, ckpt_path=config.resume_from)
    fit_s = time.perf_counter() - started
    metrics: dict[str, float] = {}
    if config.validate and config.model == "cnn":
        trainer.limit_val_batches = 1.0
        (metrics,) = trainer.validate(model, data, verbose=False)
    summary: dict[str, Any] = {
        "config": asdict(config),
        "epoch_s": timer.epoch_s,
        "fit_s": fit_s,
        "metrics": {k: float(v) for k, v in metrics.items()},
        "world_size": trainer.world_size,
    }
    if config.step_times:
        summary["step_times"] = {
            "compute_times": step_times.compute_times,
            "wait_times": step_times.wait_times,
        }
    if config.val_every_epoch:
        summary["accuracy_curve"] = curve.points
        summary["train_s"] = curve.train_s
        summary["setup_s"] = curve.setup_s
    if hetero is not None:
        summary["fit_summary"] = hetero.summary  # lightning_hetero.summary.fit_summary
    if hasattr(strategy, "replanner"):
        summary["batch_sizes"] = strategy.batch_sizes
        summary["history"] = strategy.history
        summary["memory_probe"] = strategy.memory_probe
        summary["merges"] = strategy.merges
        if strategy.dual_plan is not None:
            plan = strategy.dual_plan
            summary["dual_plan"] = {
                "batch_sizes": plan.batch_sizes,
                "samples": plan.samples,
                "update_factors": plan.update_factors,
                "time_model": [plan.time_model.a, plan.time_model.b],
                "relative_error": plan.time_model.relative_error,
                "small_ranks": list(plan.small_ranks),
                "predicted_epoch_s": max(plan.predicted_epoch_times),
                "ddp_epoch_s": plan.ddp_epoch_time,
            }
    if trainer.global_rank == 0 and config.result:
        Path(config.result).write_text(json.dumps(summary, indent=1))
    release_process_group()
    return summary


def release_process_group() -> None:
    """Destroy the default process group, if any, before the process exits: gloo's threads
    left to interpreter shutdown can abort a rank after training ("terminate called without
    an active exception"), failing a run that finished."""
    if torch.distributed.is_initialized():
        torch.distributed.destroy_process_group()


# Set by a launcher (Lightning's, torchrun, SLURM) for the ranks it starts. A fresh job
# started from inside another (a test process that ran an in-process DDP fit, a rank) must
# not inherit them, or it joins the old job's rendezvous or port.
_LAUNCHER_VARIABLES = (
    "MASTER_ADDR",
    "MASTER_PORT",
    "NODE_RANK",
    "GROUP_RANK",
    "RANK",
    "LOCAL_RANK",
    "WORLD_SIZE",
    "LOCAL_WORLD_SIZE",
    "GROUP_WORLD_SIZE",
    "ROLE_RANK",
    "ROLE_WORLD_SIZE",
    "PL_GLOBAL_SEED",
    "PL_TRAINER_GPUS",
)


def child_env(warnings: bool = False, **extra: str) -> dict[str, str]:
    """The environment for a fresh job: this one without any launcher's rank variables.

    One thread per process (the workers share the cores); warnings are silenced unless
    ``warnings`` (tests that read them ask for them). ``extra`` is added last.
    """
    env = {
        key: value
        for key, value in os.environ.items()
        if key not in _LAUNCHER_VARIABLES and not key.startswith(("TORCHELASTIC_", "SLURM_"))
    }
    env["OMP_NUM_THREADS"] = "1"
    if warnings:
        env.pop("PYTHONWARNINGS", None)
    else:
        env["PYTHONWARNINGS"] = "ignore"
    env.update(extra)
    return env


def launch(
    config: dict[str, Any],
    workdir: Path,
    timeout: float | None = None,
    module: str = "lightning_hetero.bench.run",
    on_epoch: Callable[[int], None] | None = None,
) -> dict[str, Any]:
    """Run ``config`` as a fresh multi-process job in ``workdir``; returns rank 0's summary.

    ``module`` is run with ``python -m module CONFIG_JSON``; it writes its summary as JSON to
    ``config["result"]``. ``on_epoch`` is called with the number of training epochs
    finished, as the run goes (e.g. to move a progress bar).
    """
    result = workdir / "result.json"
    result.unlink(missing_ok=True)
    config = {**config, "result": str(result)}
    progress = workdir / "progress.txt"
    if on_epoch is not None:
        progress.unlink(missing_ok=True)
        config["progress"] = str(progress)
    with subprocess.Popen(
        [sys.executable, "-m", module, json.dumps(config)],
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=child_env(),
        cwd=workdir,
    ) as child:
        stdout, stderr = _follow(child, timeout, progress, on_epoch)
    if child.returncode != 0:
        raise RuntimeError(f"The run {config} failed:\n{stdout[-2000:]}\n{stderr[-6000:]}")
    return json.loads(result.read_text())


def _follow(
    child: subprocess.Popen,
    timeout: float | None,
    progress: Path,
    on_epoch: Callable[[int], None] | None,
) -> tuple[str, str]:
    """Wait for ``child`` (killed after ``timeout`` s), reporting ``progress``'s epoch count
    to ``on_epoch`` (if given) when it changes; returns its stdout and stderr."""
    deadline = None if timeout is None else time.monotonic() + timeout
    seen = 0

    def report() -> None:
        nonlocal seen
        if on_epoch is None:
            return
        try:
            done = int(progress.read_text() or 0)
        except (OSError, ValueError):  # not written yet, or being written
            return
        if done != seen:
            seen = done
            on_epoch(done)

    while True:
        try:
            outputs = child.communicate(timeout=0.5)
        except subprocess.TimeoutExpired:
            if deadline is not None and time.monotonic() > deadline:
                child.kill()
                child.communicate()
                raise
            report()
        else:
            report()  # the last epochs, written just before the run ended
            return outputs


def run_pair(
    config: dict[str, Any],
    repeat: int,
    workdir: Path,
    hetero_options: dict[str, Any] | None = None,
    progress: Any = None,
    label: str = "",
    timeout: float | None = 900.0,
    sharded: bool = False,
) -> dict[str, dict[str, Any]]:
    """Uniform DDP and HeteroStrategy on ``config``, back to back, seeded with ``repeat``.

    Which goes first alternates with ``repeat``. ``hetero_options`` are added to the
    HeteroStrategy run's config; ``progress`` (a tqdm bar) is advanced per run. A run
    that takes longer than ``timeout`` seconds fails (a hung rank does not hang the
    benchmark). ``sharded``: the pair is ``ModelParallelStrategy`` (FSDP2, uniform) and
    ``HeteroFSDPStrategy``, still keyed ``"ddp"`` and ``"hetero"``.
    """
    strategies = {"ddp": "fsdp", "hetero": "hetero_fsdp"} if sharded else {}
    pair: dict[str, dict[str, Any]] = {}
    for name in ("ddp", "hetero") if repeat % 2 == 0 else ("hetero", "ddp"):
        if progress is not None:
            progress.set_postfix_str(f"{label}{name} #{repeat + 1}")
        strategy = strategies.get(name, name)
        run_config = {**config, "strategy": strategy, "seed": repeat, "progress_bar": False}
        if name == "hetero":
            run_config.update(hetero_options or {})
        pair[name] = launch(run_config, workdir, timeout=timeout)
        if progress is not None:
            progress.update()
    return pair


def main(argv: list[str] | None = None) -> None:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1:
        raise SystemExit("usage: python -m lightning_hetero.bench.run '<json config>'")
    run(RunConfig(**json.loads(args[0])))


if __name__ == "__main__":
    main()
