"""Train on Ray Train with RayHeteroStrategy: copy it and swap in your model.

    pip install 'lightning_hetero[ray]'
    python examples/ray_train.py                       # a local Ray cluster, 2 CPU workers
    python examples/ray_train.py --address auto --workers 8 --epochs 10   # a running cluster
    # workers on two node types (labels your nodes carry, e.g. `ray start --labels=...`):
    python examples/ray_train.py --address auto --workers 4 \\
        --node-labels node-type=a100,node-type=a100,node-type=t4,node-type=t4

Every worker gets a batch sized to its speed; the plan follows measured step times, is saved
in the checkpoints Ray keeps, and a restart with another number of workers (elastic
``--workers MIN-MAX``, or ``--name`` of an earlier run in the same ``--storage``) plans again
from the saved throughputs. Each run gets a new name unless ``--name`` is given: a run
continued by name goes on from its latest checkpoint, and one that already reached
``--epochs`` trains no further (raise ``--epochs`` to train on). ``--throttle`` makes worker 1
slower on one machine (emulation only).

At the end it prints the last boundary's balance ``E = T*/max_k t_k`` (``T* = B / sum_k X_k``,
the step time if every worker's time were proportional to its samples) and why it is below
1 here: this model is tiny, so most of a worker's step is a fixed cost per step (the loop,
the optimizer, gloo, workers sharing CPU cores) that moving samples does not remove. Worker 1
keeps that cost however few samples it gets; only its throttle (1 ms per sample) shrinks
with its batch. A model whose step time grows with its batch balances near 1.
"""

import argparse
import os
import tempfile
import time
from typing import Any

import lightning.pytorch as pl
import ray
import torch
from ray.train import FailureConfig, RunConfig, ScalingConfig
from ray.train.lightning import RayTrainReportCallback
from ray.train.torch import TorchTrainer
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero.emulate import Throttle
from lightning_hetero.integrations.ray import RayHeteroStrategy, checkpoint_path, prepare_trainer


def blobs(n: int, seed: int) -> TensorDataset:
    """``n`` points of 4 Gaussian classes in 16 dimensions (generated: no download)."""
    generator = torch.Generator().manual_seed(seed)
    labels = torch.randint(0, 4, (n,), generator=generator)
    centers = torch.randn(4, 16, generator=torch.Generator().manual_seed(0)) * 0.5
    return TensorDataset(centers[labels] + torch.randn(n, 16, generator=generator), labels)


class Classifier(pl.LightningModule):
    def __init__(self, lr: float = 0.05) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.body = torch.nn.Sequential(torch.nn.Linear(16, 64), torch.nn.ReLU())
        self.head = torch.nn.Linear(64, 4)

    def training_step(self, batch: Any, batch_idx: int) -> torch.Tensor:
        x, y = batch
        loss = torch.nn.functional.cross_entropy(self.head(self.body(x)), y)
        self.log("train_loss", loss, on_epoch=True, sync_dist=True, batch_size=len(x))
        return loss

    def validation_step(self, batch: Any, batch_idx: int) -> None:
        x, y = batch
        accuracy = (self.head(self.body(x)).argmax(1) == y).float().mean()
        self.log("val_acc", accuracy, sync_dist=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)

    def train_dataloader(self) -> DataLoader:
        return DataLoader(blobs(2048, seed=1), batch_size=32, shuffle=True)  # per worker

    def val_dataloader(self) -> DataLoader:
        return DataLoader(blobs(512, seed=2), batch_size=64)


def throttle_costs(world_size: int) -> list[float]:
    """Seconds per sample that ``--throttle`` adds to each worker: 1 ms on worker 1."""
    return [0.001 if k == 1 else 0.0 for k in range(world_size)]


def train_loop(config: dict[str, Any]) -> None:
    """What every Ray worker runs: a plain Lightning program with the Ray strategy."""
    world_size = ray.train.get_context().get_world_size()
    callbacks: list[pl.Callback] = [RayTrainReportCallback()]  # checkpoints -> train.report
    if config["throttle"]:  # worker 1 pays 1 ms per sample: a slower node, emulated
        callbacks.append(Throttle(sample_cost=throttle_costs(world_size)))
    trainer = pl.Trainer(
        max_epochs=config["epochs"],
        accelerator="auto",
        devices="auto",  # Ray gives each worker its device
        # the global batch stays 64 whatever the number of workers (elastic restarts too)
        strategy=RayHeteroStrategy(batch_sizes="uniform", global_batch_size=64),
        callbacks=callbacks,
        enable_checkpointing=False,  # Ray keeps the checkpoints
        logger=False,
    )
    trainer = prepare_trainer(trainer)
    with checkpoint_path() as ckpt_path:  # None on a first start, else Ray's latest
        trainer.fit(Classifier(), ckpt_path=ckpt_path)


def scaling(args: argparse.Namespace) -> ScalingConfig:
    """``--workers N`` or elastic ``MIN-MAX``; one worker per CPU (or GPU), on labelled nodes."""
    low, _, high = args.workers.partition("-")
    workers: int | tuple[int, int] = (int(low), int(high)) if high else int(low)
    labels = None
    if args.node_labels:  # one selector per worker: worker k runs on a node with label k
        labels = [dict([item.split("=", 1)]) for item in args.node_labels.split(",")]
    return ScalingConfig(
        num_workers=workers,
        use_gpu=args.gpu,
        resources_per_worker={"GPU": 1} if args.gpu else {"CPU": 1},
        label_selector=labels,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--address", default=None, help="a running Ray cluster (or `auto`)")
    parser.add_argument("--workers", default="2", help="N, or MIN-MAX for elastic training")
    parser.add_argument("--epochs", type=int, default=3)
    parser.add_argument("--gpu", action="store_true", help="one GPU per worker")
    parser.add_argument("--node-labels", default="", help="key=value per worker, comma-separated")
    parser.add_argument("--storage", default=None, help="where Ray keeps the run's checkpoints")
    parser.add_argument(
        "--name",
        default=None,
        help="the run's name in --storage: an earlier run's name continues it (default: new)",
    )
    parser.add_argument("--throttle", action=argparse.BooleanOptionalAction, default=True)
    args = parser.parse_args()
    if args.address is not None:
        ray.init(address=args.address)
    else:  # a local cluster on this machine: one logical CPU per worker
        ray.init(num_cpus=max(int(args.workers.split("-")[-1]), os.cpu_count() or 1))
    storage = args.storage or os.path.join(tempfile.gettempdir(), "ray_results")
    name = args.name or time.strftime("hetero-%Y%m%d-%H%M%S")
    continued = os.path.isdir(os.path.join(storage, name))
    print(
        f"run {name} in {storage}: {'continued from its latest checkpoint' if continued else 'new'}"
        f" (continue it with --name {name})"
    )
    trainer = TorchTrainer(
        train_loop,
        train_loop_config={"epochs": args.epochs, "throttle": args.throttle},
        scaling_config=scaling(args),
        run_config=RunConfig(
            storage_path=storage,
            name=name,
            failure_config=FailureConfig(max_failures=2),  # restarts resume from a checkpoint
        ),
    )
    result = trainer.fit()
    report(result.metrics, args.throttle)


def report(metrics: dict[str, Any], throttled: bool) -> None:
    """The last boundary's plan and balance, and what keeps the balance below 1."""
    workers = sum(name.startswith("hetero/batch_size/") for name in metrics)
    sizes = [int(metrics[f"hetero/batch_size/rank{k}"]) for k in range(workers)]
    compute_s = [float(metrics[f"hetero/compute_time/rank{k}"]) for k in range(workers)]
    print(f"balance {metrics['hetero/balance']:.3f}, val_acc {metrics['val_acc']:.3f}")
    print(f"final batch sizes {sizes}")
    costs = throttle_costs(workers) if throttled else [0.0] * workers
    for k, (b, t, cost) in enumerate(zip(sizes, compute_s, costs)):
        print(
            f"  worker {k}: {b} samples in {1e3 * t:.1f} ms per step, of which"
            f" {1e3 * cost * b:.1f} ms throttle and {1e3 * (t - cost * b):.1f} ms the rest"
        )
    print(
        "  balance = T*/max t_k, T* = B / sum of throughputs: below 1 where a step has a fixed"
        " cost (the rest above, hardly smaller for fewer samples) that moving samples does not"
        f" remove; {int(metrics['hetero/adjustments'])} plan change(s) so far"
    )


if __name__ == "__main__":
    main()
