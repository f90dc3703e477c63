"""What the Ray tests run on Ray Train's workers (sent by value: workers need not import it).

Each training function takes Ray's ``train_loop_config`` and leaves its findings, from rank 0,
as files in ``config["out"]`` (Ray's workers run on this machine).
"""

import json
import os
from typing import Any

import lightning.pytorch as pl
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, TensorDataset

#: The uneven split of the exactness steps: 3 + 5 samples of a global batch of 8.
PLAN = [3, 5]


def regression_data() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(8, 5, generator=generator), torch.randn(8, 1, generator=generator)
    )


def initial_net() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


def blobs(n: int, seed: int) -> TensorDataset:
    """``n`` points of 4 well separated Gaussian classes in 16 dimensions."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=generator)
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 2
    return TensorDataset(centers[labels] + torch.randn(n, 16, generator=generator), labels)


class Regression(pl.LightningModule):
    """One SGD step on :func:`regression_data`, in order, each rank checking its share."""

    def __init__(self) -> None:
        super().__init__()
        self.net = initial_net()

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        assert len(x) == PLAN[self.global_rank], (len(x), self.global_rank)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(regression_data(), batch_size=4)


class Classifier(pl.LightningModule):
    """A small classifier; logs each epoch's mean training loss."""

    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.net = torch.nn.Sequential(
            torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 4)
        )

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.net(x), y)
        self.log("loss", loss, on_step=False, on_epoch=True, sync_dist=True, batch_size=len(x))
        return loss

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(blobs(512, seed=1), batch_size=16)


class Record(pl.Callback):
    """Rank 0 writes to ``path`` (JSON) each epoch's loss and the plan it started with, and
    the plan at the end of training (after the last boundary)."""

    def __init__(self, path: str) -> None:
        self.path = path
        self.rows: dict[str, Any] = {"losses": [], "plans": []}

    def on_train_epoch_start(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.rows["plans"].append(list(trainer.strategy.batch_sizes))

    def on_train_epoch_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.rows["losses"].append(float(trainer.callback_metrics["loss"]))

    def on_train_end(self, trainer: pl.Trainer, pl_module: pl.LightningModule) -> None:
        self.rows["final_plan"] = list(trainer.strategy.batch_sizes)
        self.rows["world_size"] = trainer.world_size
        self.rows["device"] = str(trainer.strategy.root_device)
        if trainer.global_rank == 0:
            with open(self.path, "w") as file:
                json.dump(self.rows, file)


class Grads(pl.Callback):
    """Keeps the gradients the optimizer steps with."""

    def __init__(self) -> None:
        self.grads: dict[str, torch.Tensor] = {}

    def on_before_optimizer_step(
        self, trainer: pl.Trainer, pl_module: pl.LightningModule, optimizer: Any
    ) -> None:
        self.grads = {n: p.grad.detach().clone() for n, p in pl_module.named_parameters()}


def _trainer(strategy: pl.strategies.Strategy, **kwargs: Any) -> pl.Trainer:
    from lightning_hetero.integrations.ray import prepare_trainer

    options = {"logger": False, "enable_checkpointing": False, "enable_model_summary": False}
    options.update(kwargs)
    return prepare_trainer(
        pl.Trainer(accelerator="cpu", devices="auto", strategy=strategy, **options)
    )


def _throttle(world_size: int) -> pl.Callback:
    from lightning_hetero.emulate import Throttle

    # rank 1 pays 5 ms per sample: it is the slow worker the plan must move work away from.
    # At the uniform 16 that is 80 ms a step, so the first boundary moves the plan even when
    # the real compute that every rank pays alike (a Ray worker's step on a busy 2-core
    # machine) is as long: at 1 ms per sample, 16 ms against it, the auto dead-band that
    # follows the timing noise could hold the uniform plan through every boundary
    return Throttle(sample_cost=[0.005 if rank == 1 else 0.0 for rank in range(world_size)])


def exact_and_train(config: dict[str, Any]) -> None:
    """One uneven step under both strategies (rank 0 saves what it needs), then a few epochs
    of BSP (:func:`train_bsp`)."""
    import ray.train

    from lightning_hetero.integrations.ray import RayHeteroFSDPStrategy, RayHeteroStrategy

    torch.set_num_threads(1)
    out = config["out"]
    rank = ray.train.get_context().get_world_rank()
    exact = {"batch_sizes": PLAN, "controller": "static", "shuffle": False}

    # DDP: the weighted, all-reduced gradient as the optimizer sees it
    grads = Grads()
    _trainer(RayHeteroStrategy(**exact), max_steps=1, callbacks=[grads]).fit(Regression())
    if rank == 0:
        torch.save(grads.grads, os.path.join(out, "ddp_grads.pt"))

    # FSDP2: the full parameters after one SGD step
    model = Regression()
    _trainer(RayHeteroFSDPStrategy(**exact), max_steps=1).fit(model)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if rank == 0:
        torch.save({k: v.detach().cpu() for k, v in full.items()}, os.path.join(out, "fsdp.pt"))

    train_bsp(config)


def train_bsp(config: dict[str, Any]) -> None:
    """BSP epochs with rank 1 throttled, reporting a checkpoint to Ray at each epoch end and
    resuming from Ray's latest checkpoint, if any; rank 0 records into ``config["record"]``."""
    import ray.train
    from ray.train.lightning import RayTrainReportCallback

    from lightning_hetero.integrations.ray import RayHeteroStrategy, checkpoint_path

    torch.set_num_threads(1)
    world = ray.train.get_context().get_world_size()
    record = Record(os.path.join(config["out"], config["record"]))
    trainer = _trainer(
        RayHeteroStrategy(global_batch_size=32),
        max_epochs=config["epochs"],
        enable_progress_bar=True,  # its lazy metric syncs must not meet the boundary's
        callbacks=[_throttle(world), record, RayTrainReportCallback()],
    )
    with checkpoint_path() as path:
        trainer.fit(Classifier(), ckpt_path=path)


def train_modes(config: dict[str, Any]) -> None:
    """A few epochs of each asynchronous mode, one after the other in the same workers."""
    from lightning_hetero.integrations.ray import RayHeteroStrategy

    torch.set_num_threads(1)
    world = int(os.environ.get("WORLD_SIZE", "2"))
    for mode in config["modes"]:
        strategy = RayHeteroStrategy(mode=mode, global_batch_size=32)
        path = os.path.join(config["out"], f"{mode}.json")
        trainer = _trainer(
            strategy, max_epochs=config["epochs"], callbacks=[_throttle(world), Record(path)]
        )
        trainer.fit(Classifier())


def guide_program(config: dict[str, Any]) -> None:
    """Ray Train's Lightning guide (``train_func`` of "Get Started with Distributed Training
    using PyTorch Lightning") with ``RayDDPStrategy()`` swapped for ``RayHeteroStrategy()`` and
    nothing else: the environment in ``plugins``, Ray's report callback and Ray's
    ``prepare_trainer``. The guide's FashionMNIST and CNN need torchvision and a download:
    :func:`blobs` and :class:`Classifier` stand in. Then the same line without ``plugins``."""
    import ray.train.lightning

    from lightning_hetero.integrations.ray import RayHeteroStrategy

    torch.set_num_threads(1)
    environments = []
    for plugins in ([ray.train.lightning.RayLightningEnvironment()], []):
        train_dataloader = DataLoader(blobs(256, seed=1), batch_size=16, shuffle=True)
        model = Classifier()
        trainer = pl.Trainer(
            max_epochs=config["epochs"],
            devices="auto",
            accelerator="auto",
            strategy=RayHeteroStrategy(),  # the guide: ray.train.lightning.RayDDPStrategy()
            plugins=plugins,
            callbacks=[ray.train.lightning.RayTrainReportCallback()],
            enable_checkpointing=False,
        )
        trainer = ray.train.lightning.prepare_trainer(trainer)
        trainer.fit(model, train_dataloaders=train_dataloader)
        environment = trainer.strategy.cluster_environment
        environments.append(
            {
                "type": type(environment).__name__,
                "given": bool(plugins) and environment is plugins[0],
                "world_size": trainer.world_size,
                "global_step": trainer.global_step,
                "batch_sizes": list(trainer.strategy.batch_sizes),
                "loss": float(trainer.callback_metrics["loss"]),
            }
        )
    if trainer.global_rank == 0:
        with open(os.path.join(config["out"], "guide.json"), "w") as file:
            json.dump(environments, file)
