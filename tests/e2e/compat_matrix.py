"""The compatibility matrix's cells (``compat_cases.py``), run in one 2-rank gloo launch: each
cell a short fit of a tiny model; the DDP reference runs (``strategy="ddp"`` with the same
feature and accumulation) in the same launch, each once, when a cell first needs it.

usage: python compat_matrix.py OUT_JSON CELL_ID [CELL_ID ...]

Rank 0 rewrites OUT_JSON after every cell (a launch that dies keeps what it finished).
After each cell the ranks compare which cell they are at and how it ended; when they
disagree, or that exchange fails (a cell desynchronised the process group), the launch exits
with code 3 and the harness starts another for the cells left.

Each cell has a watchdog: a cell still running after ``COMPAT_CELL_LIMIT_S`` (default 150)
prints every thread's Python stack and ends the launch, so a hang names its cell and where it
waits instead of using up the matrix's time.

Environment: ``COMPAT_TIMEOUT_S`` (default 30), the seconds a collective waits before it fails
its cell; ``COMPAT_DEBUG=1`` adds each cell's sample ids and logged rows, and its DDP run's.
"""

import faulthandler
import json
import math
import os
import sys
import time
import traceback
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
import torch.distributed as dist
import torchmetrics
from lightning.pytorch.callbacks import (
    EarlyStopping,
    GradientAccumulationScheduler,
    ModelCheckpoint,
    StochasticWeightAveraging,
)
from lightning.pytorch.loggers import Logger
from lightning.pytorch.strategies import DDPStrategy
from torch.utils.data import DataLoader, DistributedSampler, IterableDataset, TensorDataset

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy

sys.path.insert(0, str(Path(__file__).parent))
from compat_cases import CASES, OPTION_SETS  # noqa: E402

SAMPLES, BATCH = 32, 4
#: the process group's timeout: a collective that waits longer fails its cell
TIMEOUT = timedelta(seconds=float(os.environ.get("COMPAT_TIMEOUT_S", "30")))
#: a cell still running after this many seconds dumps every thread's stack and ends the launch
CELL_LIMIT_S = float(os.environ.get("COMPAT_CELL_LIMIT_S", "150"))


def strategy(name: str):
    common = {"timeout": TIMEOUT, "shuffle": False}
    if name == "ddp":
        return DDPStrategy(timeout=TIMEOUT)
    plan = {"controller": "static", "batch_sizes": [6, 2]}
    return {
        "bsp": lambda: HeteroStrategy(**plan, **common),
        "accumulate": lambda: HeteroStrategy(max_batch_size=[12, 4], **common),
        "global_micro": lambda: HeteroStrategy(
            **plan, global_batch_size=8, micro_batch_size=2, **common
        ),
        "micro_auto": lambda: HeteroStrategy(**plan, micro_batch_size="auto", **common),
        "async": lambda: HeteroStrategy(mode="async", **plan, **common),
        "local": lambda: HeteroStrategy(mode="local", **plan, **common),
        "dual": lambda: HeteroStrategy(mode="async", controller="dual", **common),
        "dual_bsp": lambda: HeteroStrategy(controller="dual", **common),
        "fsdp": lambda: HeteroFSDPStrategy(**plan, **common),
        "fsdp_micro": lambda: HeteroFSDPStrategy(**plan, micro_batch_size=2, **common),
    }[name]()


def data(samples: int = SAMPLES) -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(samples, 5, generator=generator)
    return TensorDataset(x, x.sum(1, keepdim=True), torch.arange(samples))


class Sharded(IterableDataset):
    """The samples of this rank: ``i % world == rank`` (a user's own sharding)."""

    def __iter__(self):
        rank, world = dist.get_rank(), dist.get_world_size()
        for i, sample in enumerate(zip(*data().tensors)):
            if i % world == rank:
                yield sample


class Memory(Logger):
    def __init__(self) -> None:
        super().__init__()
        self.rows: list[tuple[int, dict[str, float]]] = []

    name = "memory"
    version = 0

    def log_hyperparams(self, *args, **kwargs) -> None:
        pass

    def log_metrics(self, metrics, step=None) -> None:
        self.rows.append((step, {k: float(v) for k, v in metrics.items()}))


class Model(pl.LightningModule):
    def __init__(self, feature: str, ordered: bool) -> None:
        super().__init__()
        self.feature, self.ordered = feature, ordered
        torch.manual_seed(0)
        norm = [torch.nn.BatchNorm1d(5)] if feature == "batchnorm" else []
        self.net = torch.nn.Sequential(
            *norm, torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1)
        )
        self.seen: list[tuple[int, list[int]]] = []
        self.validated: list[int] = []
        self.counting = False  # in an epoch (the memory probe's steps before it train nothing)
        if feature == "metric_sync":
            self.metric = torchmetrics.MeanMetric()
        elif feature == "metric_step_sync":
            self.metric = torchmetrics.MeanMetric(dist_sync_on_step=True)
        if feature in ("manual", "two_optimizers"):
            self.automatic_optimization = False

    def loss(self, batch):
        x, y, index = batch
        if self.counting:
            self.seen.append((self.current_epoch, index.tolist()))
        return torch.nn.functional.mse_loss(self.net(x), y)

    def training_step(self, batch, batch_idx):
        f = self.feature
        loss = self.loss(batch)
        if f in ("log_step", "log_every_n_steps", "checkpoint"):
            self.log("local_loss", loss)  # each rank's own: not compared with DDP's
        elif f == "log_step_sync":
            self.log("train_loss", loss, sync_dist=True)
        elif f == "log_epoch":
            self.log("train_loss", loss, on_step=False, on_epoch=True, sync_dist=True)
        elif f in ("metric_sync", "metric_step_sync"):
            self.metric(batch[1].flatten())  # a mean over samples, whatever the batches
            on_step = f == "metric_step_sync"
            self.log("metric", self.metric, on_step=on_step, on_epoch=not on_step)
        elif f == "all_reduce":
            total = torch.tensor([float(len(batch[0]))])
            dist.all_reduce(total)
            self.log("total", total, reduce_fx="sum")
        if not self.automatic_optimization:
            optimizers = self.optimizers()
            optimizers = optimizers if isinstance(optimizers, list) else [optimizers]
            for optimizer in optimizers:
                optimizer.zero_grad()
            self.manual_backward(loss)
            for optimizer in optimizers:
                optimizer.step()
            return None
        return loss

    def optimizer_step(self, epoch, batch_idx, optimizer, optimizer_closure=None):
        if self.feature != "optimizer_step":
            return super().optimizer_step(epoch, batch_idx, optimizer, optimizer_closure)
        optimizer_closure()
        optimizer.step()

    def validation_step(self, batch, batch_idx):
        x, y, _ = batch
        self.log("val_loss", torch.nn.functional.mse_loss(self.net(x), y), sync_dist=True)

    def on_train_epoch_start(self):
        self.counting = True

    def on_train_epoch_end(self):
        self.counting = False

    def on_validation_start(self):
        if not self.trainer.sanity_checking:
            self.validated.append(self.trainer.global_step)

    def configure_optimizers(self):
        if self.feature == "two_optimizers":
            return [
                torch.optim.SGD(self.net[:1].parameters(), lr=0.05),
                torch.optim.SGD(self.net[1:].parameters(), lr=0.05),
            ]
        optimizer = torch.optim.SGD(self.parameters(), lr=0.05)
        if self.feature == "scheduler_step":
            scheduler = torch.optim.lr_scheduler.StepLR(optimizer, step_size=1, gamma=0.7)
            return {
                "optimizer": optimizer,
                "lr_scheduler": {"scheduler": scheduler, "interval": "step"},
            }
        return optimizer

    def train_dataloader(self):
        if self.feature == "iterable":
            return DataLoader(Sharded(), batch_size=BATCH)
        # the DDP reference: rank k takes samples k, k + 2, ...: each step trains on the same
        # consecutive samples as the hetero run's global batch (shuffle=False)
        sampler = DistributedSampler(data(), shuffle=False) if self.ordered else None
        return DataLoader(data(), batch_size=BATCH, sampler=sampler)

    def val_dataloader(self):
        return DataLoader(data(16), batch_size=4)


TRAINER = {
    "val_float": {"val_check_interval": 0.5},
    "val_int": {"val_check_interval": 2},
    "val_every_n_epoch": {"check_val_every_n_epoch": 2, "max_epochs": 2},
    "limit_float": {"limit_train_batches": 0.5, "limit_val_batches": 0.5},
    "limit_int": {"limit_train_batches": 3, "limit_val_batches": 1},
    "max_steps": {"max_steps": 3},
    "log_every_n_steps": {"log_every_n_steps": 2},
    "early_stopping": {"max_epochs": 3},
    "clipping": {"gradient_clip_val": 0.5},
    "swa": {"max_epochs": 2},
    "bf16": {"precision": "bf16-mixed"},
}


def run(chosen, feature: str, folder: Path, accumulate: int) -> dict:
    model = Model(feature, ordered=type(chosen) is DDPStrategy)
    logger = Memory()
    callbacks = []
    kwargs = {
        "max_epochs": 1,
        "limit_val_batches": 2,
        "log_every_n_steps": 1,
        **TRAINER.get(feature, {}),
    }
    if feature == "checkpoint":
        callbacks.append(ModelCheckpoint(dirpath=folder, every_n_train_steps=2, save_last=True))
    if feature == "early_stopping":
        callbacks.append(EarlyStopping(monitor="val_loss", patience=0, min_delta=1.0))
    if feature == "accumulation_scheduler":
        callbacks.append(GradientAccumulationScheduler({0: 2}))
    if feature == "swa":
        callbacks.append(StochasticWeightAveraging(swa_lrs=0.05, swa_epoch_start=1))
    if accumulate > 1:
        kwargs["accumulate_grad_batches"] = accumulate
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=chosen,
        logger=logger,
        callbacks=callbacks,
        enable_checkpointing=feature == "checkpoint",
        enable_model_summary=False,
        enable_progress_bar=True,
        num_sanity_val_steps=0,
        **kwargs,
    )
    trainer.fit(model)
    seen = [None] * dist.get_world_size()
    dist.all_gather_object(seen, model.seen)
    state = {
        k: (v.full_tensor() if hasattr(v, "full_tensor") else v).detach().float()  # FSDP2: DTensor
        for k, v in model.state_dict().items()
        if "num_batches_tracked" not in k  # counts forward passes (micro-batches)
    }
    record = {
        "seen": seen,
        "params": {k: v.flatten().tolist() for k, v in state.items()},
        "logged": [[step, metrics] for step, metrics in logger.rows if step is not None],
        "validated": model.validated,
        "global_step": trainer.global_step,
        "epoch": trainer.current_epoch,
    }
    if feature == "checkpoint":
        record["saved"] = sorted(p.name for p in folder.glob("*.ckpt"))
        if (folder / "last.ckpt").is_file():  # FSDP2's is a folder of shards
            last = torch.load(folder / "last.ckpt", weights_only=False, map_location="cpu")
            record["last_step"] = last["global_step"]
    return record


def epochs(seen: list[list[tuple[int, list[int]]]]) -> dict[int, list[int]]:
    """The sample ids trained in each epoch, all ranks together, sorted."""
    out: dict[int, list[int]] = {}
    for rank in seen:
        for epoch, ids in rank:
            out.setdefault(epoch, []).extend(ids)
    return {e: sorted(ids) for e, ids in sorted(out.items())}


def max_difference(a, b) -> float:
    if a.keys() != b.keys():
        return math.inf
    return max((abs(x - y) for k in a for x, y in zip(a[k], b[k], strict=True)), default=0.0)


def logged_difference(a: list, b: list) -> float:
    """The largest difference of the logged values (step and name must match)."""
    user = {k for _, m in b for k in m if k != "epoch" and not k.startswith("local_")}
    flat_a = {(s, k): v for s, m in a for k, v in m.items() if k in user}
    flat_b = {(s, k): v for s, m in b for k, v in m.items() if k in user}
    if flat_a.keys() != flat_b.keys():
        return math.inf
    return max((abs(flat_a[k] - flat_b[k]) for k in flat_a), default=0.0)


def judge(case, record: dict, reference: dict) -> dict:
    """What the cell shows against its DDP reference run."""
    got, want = epochs(record["seen"]), epochs(reference["seen"])
    once = all(len(ids) == len(set(ids)) for ids in got.values())
    counts = {e: len(ids) for e, ids in got.items()} == {e: len(ids) for e, ids in want.items()}
    out = {
        "samples_once": once and counts,
        "per_epoch": {e: len(i) for e, i in got.items()},
        "ddp_per_epoch": {e: len(i) for e, i in want.items()},
    }
    # recorded for every cell (the report shows them), asserted where ``case.compare`` says
    out["same_samples"] = got == want
    out["params_difference"] = max_difference(record["params"], reference["params"])
    out["logged_difference"] = logged_difference(record["logged"], reference["logged"])
    if os.environ.get("COMPAT_DEBUG"):
        out["seen"], out["ddp_seen"] = record["seen"], reference["seen"]
        out["logged"], out["ddp_logged"] = record["logged"], reference["logged"]
    for key in ("validated", "global_step", "last_step", "saved"):
        if key in record:
            out[key] = [record[key], reference.get(key)]
    return out


def agree(token: object) -> bool:
    """Whether every rank holds ``token`` (False when the exchange itself fails)."""
    try:
        tokens = [None] * dist.get_world_size()
        dist.all_gather_object(tokens, token)
        return all(t == token for t in tokens)
    except Exception:  # noqa: BLE001 - a poisoned group: the launch ends
        return False


def main(out: Path, cells: list[str]) -> None:
    torch.set_num_threads(1)
    folder = out.parent / f"{out.stem}-work"
    cases = {c.id: c for c in CASES}
    references: dict[tuple[str, int], dict] = {}
    results: dict[str, dict] = {}
    # the first fit launches rank 1 and creates the process group with the 30 s timeout
    faulthandler.dump_traceback_later(CELL_LIMIT_S, exit=True)
    references[("log_step", 1)] = run(strategy("ddp"), "log_step", folder / "ref-log_step-1", 1)
    for cell in cells:
        case = cases[cell]
        start = time.perf_counter()
        print(f"compat_matrix: rank {dist.get_rank()} starts {cell}", flush=True)
        faulthandler.dump_traceback_later(CELL_LIMIT_S, exit=True)
        result: dict = {}
        try:
            chosen = strategy(case.options)
        except Exception as error:  # noqa: BLE001 - the refusals are the data
            result = {"status": "refused", "when": "construction", "message": str(error)}
        else:
            try:
                accumulate = OPTION_SETS[case.options].accumulate
                record = run(chosen, case.feature, folder / cell, accumulate)
                key = (case.feature, accumulate)
                if key not in references:
                    references[key] = run(
                        strategy("ddp"),
                        case.feature,
                        folder / f"ref-{case.feature}-{accumulate}",
                        accumulate,
                    )
                result = {"status": "finished", **judge(case, record, references[key])}
            except Exception as error:  # noqa: BLE001
                result = {
                    "status": "raised",
                    "message": f"{type(error).__name__}: {error}",
                    "traceback": traceback.format_exc()[-3000:],
                }
        result["seconds"] = round(time.perf_counter() - start, 2)
        ok = agree((cell, result["status"]))
        faulthandler.cancel_dump_traceback_later()
        if dist.get_rank() == 0:
            results[cell] = result
            out.write_text(json.dumps(results, indent=1, default=str))
        if not ok:
            print(f"compat_matrix: ranks disagree after {cell}; ending this launch", flush=True)
            os._exit(3)
    dist.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), sys.argv[2:])
