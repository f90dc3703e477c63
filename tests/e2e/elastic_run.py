"""The digits workload in BSP mode, one process per rank as torchrun starts it.

usage: python -m torch.distributed.run --nproc-per-node=N ... elastic_run.py CONFIG_JSON

Keys: out (rank 0 writes OUT.json and the final parameters to OUT.pt), epochs, ckpt_dir
(ModelCheckpoint every epoch, ``last.ckpt`` too), resume (a checkpoint path, or "last":
``ckpt_dir/last.ckpt`` if it exists), sample_cost (Throttle, per rank), global_batch_size,
deadband, min_batch_size, timeout_s (the strategy's collective timeout), kill
({rank, epoch, step}: that rank SIGKILLs itself at that batch, on torchrun's first attempt
only), hang ({rank, epoch, step, seconds}: that rank sleeps before its backward pass).
"""

import json
import os
import signal
import sys
import time
from datetime import timedelta
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint

from lightning_hetero import HeteroStrategy
from lightning_hetero.bench.workload import DigitsCNN, DigitsDataModule
from lightning_hetero.emulate import Throttle

ATTEMPT = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def _at(spec: dict | None, trainer: pl.Trainer, batch_idx: int) -> bool:
    return bool(spec) and (trainer.global_rank, trainer.current_epoch, batch_idx) == (
        spec["rank"],
        spec["epoch"],
        spec["step"],
    )


class Faults(Callback):
    """Kills or stalls a rank on cue; records what the strategy restored."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.restored: dict = {}
        self._batch_idx = -1

    def on_train_start(self, trainer, pl_module):
        strategy = trainer.strategy
        self.restored = {
            "batch_sizes": strategy.batch_sizes,
            "controller": strategy.controller.state_dict(),
            "history_length": len(strategy.history),
            "epoch": trainer.current_epoch,
        }

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self._batch_idx = batch_idx
        if ATTEMPT == 0 and _at(self.config.get("kill"), trainer, batch_idx):
            os.kill(os.getpid(), signal.SIGKILL)

    def on_before_backward(self, trainer, pl_module, loss):
        hang = self.config.get("hang")
        if _at(hang, trainer, self._batch_idx):
            time.sleep(hang["seconds"])


def main() -> None:
    config = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    pl.seed_everything(0, workers=True, verbose=False)
    options = {
        k: config[k] for k in ("global_batch_size", "deadband", "min_batch_size") if k in config
    }
    if "timeout_s" in config:
        options["timeout"] = timedelta(seconds=config["timeout_s"])
    strategy = HeteroStrategy(**options)
    faults = Faults(config)
    callbacks: list[Callback] = [faults]
    if config.get("sample_cost"):
        callbacks.append(Throttle(config["sample_cost"]))
    ckpt_dir = config.get("ckpt_dir")
    if ckpt_dir:
        callbacks.append(ModelCheckpoint(dirpath=ckpt_dir, save_last=True, save_top_k=-1))
    resume = config.get("resume")
    if resume == "last":
        last = Path(ckpt_dir) / "last.ckpt"
        resume = str(last) if last.exists() else None
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=int(os.environ["LOCAL_WORLD_SIZE"]),
        num_nodes=1,
        strategy=strategy,
        max_epochs=config["epochs"],
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=bool(ckpt_dir),
        enable_model_summary=False,
        num_sanity_val_steps=0,
        limit_val_batches=0,
        deterministic=True,
    )
    model = DigitsCNN(lr=0.05)
    trainer.fit(model, DigitsDataModule(batch_size=16), ckpt_path=resume)
    if trainer.global_rank == 0:
        out = Path(config["out"])
        torch.save({k: v.detach().clone() for k, v in model.state_dict().items()}, f"{out}.pt")
        report = {
            "attempt": ATTEMPT,
            "resumed_from": resume,
            "world_size": trainer.world_size,
            "restored": faults.restored,
            "history": strategy.history,
            "batch_sizes": strategy.batch_sizes,
        }
        Path(f"{out}.json").write_text(json.dumps(report))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
