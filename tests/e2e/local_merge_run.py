"""Local mode on 2 gloo ranks with Lightning's defaults; rank 0 writes a JSON report.

usage: python local_merge_run.py CONFIG_JSON

Keys: out (path of the report), task (``"lstsq"``: least squares on generated data;
``"digits"``: a small classifier on sklearn's digits), epochs, lr, batch_size (per rank,
the loader's), momentum (SGD's; default 0), and the strategy's megabatch_size, gamma,
delta, lr_scaling and merge_optimizer_state (each left out: the strategy's default).

SGD, plain unless ``momentum`` is given. The report holds the final training loss over the
whole set (rank 0, after fit), ``momentum_spread``: the largest difference between the two
ranks' momentum buffers at the end of training, for ``lstsq`` the closed-form
least-squares optimum's loss and the largest distance of a learned parameter to it, for
``digits`` the training accuracy, the strategy's merge records, and ``trace``: the whole
set's loss after each merge.
"""

import json
import sys
from datetime import timedelta

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy

FEATURES = 10


def lstsq_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(512, FEATURES, generator=generator)
    true_w = torch.randn(FEATURES, 1, generator=generator)
    y = x @ true_w + 1.5 + 0.1 * torch.randn(512, 1, generator=generator)
    return TensorDataset(x, y)


def digits_data() -> TensorDataset:
    from sklearn.datasets import load_digits

    x, y = load_digits(return_X_y=True)
    x = torch.tensor(x, dtype=torch.float32) / 16.0
    return TensorDataset(x, torch.tensor(y))


def lstsq_optimum(data: TensorDataset) -> tuple[torch.Tensor, float]:
    """The least-squares solution (weights then bias) and its mean squared error."""
    x, y = (t.double() for t in data.tensors)
    design = torch.cat([x, torch.ones(len(x), 1, dtype=x.dtype)], dim=1)
    solution = torch.linalg.lstsq(design, y).solution
    return solution.flatten(), float(((design @ solution - y) ** 2).mean())


class Model(pl.LightningModule):
    def __init__(self, task: str, lr: float, batch_size: int, momentum: float = 0.0) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.task, self.lr, self.batch_size = task, lr, batch_size
        self.momentum = momentum
        self.momentum_spread: float | None = None
        if task == "lstsq":
            self.net = torch.nn.Linear(FEATURES, 1)
        else:
            self.net = torch.nn.Sequential(
                torch.nn.Linear(64, 64), torch.nn.ReLU(), torch.nn.Linear(64, 10)
            )
        self.data = lstsq_data() if task == "lstsq" else digits_data()
        self.trace: list[float] = []  # rank 0: the full-set loss after each merge

    def loss(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        if self.task == "lstsq":
            return torch.nn.functional.mse_loss(self.net(x), y)
        return torch.nn.functional.cross_entropy(self.net(x), y)

    def on_train_batch_start(self, batch, batch_idx):
        merges = len(self.trainer.strategy.merges)
        if self.global_rank == 0 and merges > len(self.trace):
            with torch.no_grad():
                self.trace.append(float(self.loss(*self.data.tensors)))

    def training_step(self, batch, batch_idx):
        loss = self.loss(*batch)
        self.log("train_loss", loss, prog_bar=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=self.lr, momentum=self.momentum)

    def on_train_end(self):  # after the last merge, while the process group is up
        optimizer = self.trainer.optimizers[0]
        buffers = [optimizer.state[p].get("momentum_buffer") for p in self.parameters()]
        if any(b is None for b in buffers):
            return
        mine = torch.cat([b.flatten() for b in buffers])
        both = [torch.zeros_like(mine) for _ in range(2)]
        torch.distributed.all_gather(both, mine)
        self.momentum_spread = float((both[0] - both[1]).abs().max())

    def train_dataloader(self):
        return DataLoader(self.data, batch_size=self.batch_size, shuffle=True)


def main() -> None:
    config = json.loads(sys.argv[1])
    torch.set_num_threads(1)
    options = {"gamma": config["gamma"]} if "gamma" in config else {}
    if "megabatch_size" in config:
        options["megabatch_size"] = config["megabatch_size"]
    for key in ("lr_scaling", "delta", "merge_optimizer_state"):
        if key in config:
            options[key] = config[key]
    strategy = HeteroStrategy(mode="local", timeout=timedelta(seconds=60), **options)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=config.get("epochs", 10),
        logger=False,
        enable_checkpointing=False,
    )
    task = config.get("task", "lstsq")
    model = Model(
        task, config.get("lr", 0.05), config.get("batch_size", 16), config.get("momentum", 0.0)
    )
    trainer.fit(model)
    if trainer.global_rank == 0:
        with torch.no_grad():
            x, y = model.data.tensors
            report = {"gamma": strategy.gamma, "merges": strategy.merges, "trace": model.trace}
            report["momentum_spread"] = model.momentum_spread
            report["loss"] = float(model.loss(x, y))
            if task == "lstsq":
                solution, optimum = lstsq_optimum(model.data)
                learned = torch.cat([model.net.weight.flatten(), model.net.bias]).double()
                report["optimum"] = optimum
                report["distance"] = float((learned - solution).abs().max())
            else:
                report["accuracy"] = float((model.net(x).argmax(dim=1) == y).float().mean())
        with open(config["out"], "w") as file:
            json.dump(report, file)


if __name__ == "__main__":
    main()
