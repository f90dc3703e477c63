"""Least squares on 3 gloo ranks in a chosen mode; rank 0 writes a JSON report.

usage: python async_run.py CONFIG_JSON

Keys: mode, epochs, out, batch_sizes, lr, momentum, ckpt_dir, resume, kill_rank,
kill_step (global step at which `kill_rank` exits hard), check_server (path of a saved
server state to compare with at the first step after a resume), lr_scaling,
megabatch_size, gamma, delta.
"""

import json
import os
import socket
import sys

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import Callback, ModelCheckpoint
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy
from lightning_hetero.emulate import Throttle

WORLD = 3
TRUE_W = torch.tensor([[1.0, -2.0, 0.5, 3.0, -1.0]])
TRUE_B = 0.25


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(3)
    x = torch.randn(384, 5, generator=generator)
    return TensorDataset(x, x @ TRUE_W.T + TRUE_B)


class Regression(pl.LightningModule):
    def __init__(self, lr: float, momentum: float) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(5, 1)
        self.lr, self.momentum = lr, momentum

    def training_step(self, batch, batch_idx):
        x, y = batch
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)

    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=16, shuffle=True)


class Probe(Callback):
    """Kills a rank on cue; after a resume, compares the server with a saved state."""

    def __init__(self, config: dict) -> None:
        self.config = config
        self.checked = None
        self.server_updates = None
        self.samples = 0
        self.samples_per_epoch = []  # rank 0: all ranks' samples trained in each epoch

    def on_train_epoch_start(self, trainer, pl_module):
        self.samples = 0

    def on_train_epoch_end(self, trainer, pl_module):
        rows = trainer.strategy.gather_rows([self.samples])
        self.samples_per_epoch.append([int(row[0]) for row in rows])

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        self.samples += len(batch[0])
        config = self.config
        if trainer.global_rank == config.get("kill_rank") and trainer.global_step == config.get(
            "kill_step"
        ):
            os._exit(17)
        if not config.get("check_server") or self.checked is not None:
            return
        server = trainer.strategy.server
        if server is not None:
            saved = torch.load(config["check_server"])
            params = server.pull(0).params
            state = server.optimizer_state(0)
            self.checked = {
                "params_equal": all(torch.equal(a, b) for a, b in zip(params, saved["params"])),
                "momentum_equal": all(
                    torch.equal(state["state"][i]["momentum_buffer"], b)
                    for i, b in enumerate(saved["momentum"])
                ),
            }
        self.checked = self.checked or {}
        torch.distributed.barrier()  # no rank pushes before rank 0 has looked

    def on_train_end(self, trainer, pl_module):
        server = trainer.strategy.server
        if server is not None:
            self.server_updates = server.updates
        if server is not None and self.config.get("save_server"):
            state = server.optimizer_state(0)
            torch.save(
                {
                    "params": server.pull(0).params,
                    "momentum": [state["state"][i]["momentum_buffer"] for i in range(2)],
                },
                self.config["save_server"],
            )


def main() -> None:
    config = json.loads(sys.argv[1])
    if config.get("kill_rank") is not None:
        # Lightning's launcher kills every rank within 5 s of a child's death (its zombie guard,
        # `_ChildProcessObserver`), which races rank 0's report of the dead rank that the fault
        # test reads: give rank 0 the time to find it (every rank still ends, on the closed
        # connections)
        from lightning.fabric.strategies.launchers import subprocess_script

        subprocess_script._ChildProcessObserver.__init__.__defaults__ = (60,)
    busy = None
    if config.get("occupy_rpc_port") and "LOCAL_RANK" not in os.environ:
        # rank 0's process holds MASTER_PORT + 1, the RPC rendezvous's default port, as
        # another program on the main node might (the launching process is rank 0)
        busy = socket.socket()
        busy.bind(("", int(os.environ["MASTER_PORT"]) + 1))
        busy.listen()
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    options = {
        key: config[key]
        for key in (
            "lr_scaling",
            "megabatch_size",
            "gamma",
            "delta",
            "rpc_timeout",
            "controller",
            "local_steps",
        )
        if key in config
    }
    strategy = HeteroStrategy(
        mode=config["mode"], batch_sizes=config.get("batch_sizes", [8, 16, 24]), **options
    )
    probe = Probe(config)
    callbacks = [probe]
    if config.get("sample_cost"):
        callbacks.append(Throttle(config["sample_cost"]))
    if config.get("ckpt_dir"):
        callbacks.append(ModelCheckpoint(dirpath=config["ckpt_dir"], save_last=True, save_top_k=-1))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=WORLD,
        strategy=strategy,
        max_epochs=config["epochs"],
        callbacks=callbacks,
        logger=False,
        enable_checkpointing=bool(config.get("ckpt_dir")),
        enable_model_summary=False,
    )
    model = Regression(config.get("lr", 0.05), config.get("momentum", 0.0))
    trainer.fit(model, ckpt_path=config.get("resume"))
    pushes = strategy.gather_rows([getattr(strategy.training_mode, "pushes", 0)])
    if trainer.global_rank == 0:
        report = {
            "weight": model.layer.weight.detach().flatten().tolist(),
            "bias": float(model.layer.bias.detach()),
            "pushes": [int(row[0]) for row in pushes],
            "history": strategy.history,
            "merges": strategy.merges,
            "checked": probe.checked,
            "server_updates": probe.server_updates,
            "samples_per_epoch": probe.samples_per_epoch,
            "batch_sizes": strategy.batch_sizes,
        }
        with open(config["out"], "w") as handle:
            json.dump(report, handle)
    torch.distributed.destroy_process_group()
    if busy is not None:
        busy.close()


if __name__ == "__main__":
    main()
