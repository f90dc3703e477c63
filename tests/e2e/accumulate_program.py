"""A program written for DDP with gradient accumulation, run on 2 gloo ranks; rank 0 saves
the parameters after its optimizer steps, the steps counted and the strategy's plans.

usage: python accumulate_program.py OUT_PATH STRATEGY [SLOW_COST]
STRATEGY: ``ddp`` (the data in order: ``DistributedSampler(shuffle=False)``, where Lightning's
own would shuffle), ``hetero`` (uniform static plan, the data in order: the exactness run)
or ``adaptive`` (``strategy="hetero"`` re-planning every 2 steps, rank 1 slowed by SLOW_COST
seconds per sample with ``Throttle``); ``adaptive_workers``: the same with 2 persistent
DataLoader workers, which draw batches ahead of training.
"""

import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, DistributedSampler

from lightning_hetero import HeteroStrategy
from lightning_hetero.emulate import Throttle

#: Loader batch, accumulation, ranks: 32 samples per optimizer step.
BATCH, ACCUMULATE, RANKS = 4, 4, 2


class Regression(pl.LightningModule):
    def __init__(self, ordered_ranks: bool, workers: int = 0) -> None:
        super().__init__()
        self.ordered_ranks, self.workers = ordered_ranks, workers
        torch.manual_seed(0)
        self.layer = torch.nn.Linear(5, 1)
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        x, y = batch[..., :5], batch[..., 5:]
        self.seen.append(len(x))
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        # with workers, 32 optimizer steps an epoch: plans change while the workers' batches
        # drawn ahead are inside the epoch, not past its end
        samples = 1024 if self.workers else 256
        data = torch.randn(samples, 6, generator=torch.Generator().manual_seed(1))
        # DDP's rank k takes samples k, k + 2, ...: each optimizer step trains on the same 32
        # consecutive samples as the hetero run's global batch
        sampler = DistributedSampler(data, shuffle=False) if self.ordered_ranks else None
        return DataLoader(
            data, batch_size=BATCH, shuffle=False, sampler=sampler, num_workers=self.workers,
            persistent_workers=self.workers > 0,
        )  # fmt: skip


if __name__ == "__main__":
    out, kind = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    callbacks = []
    if kind == "ddp":
        strategy = "ddp"
    elif kind == "hetero":
        strategy = HeteroStrategy(controller="static", shuffle=False)
    else:
        strategy = HeteroStrategy(adjust_every=2)
        callbacks.append(Throttle(sample_cost=[0.0, float(sys.argv[3])]))
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=RANKS,
        strategy=strategy,
        accumulate_grad_batches=ACCUMULATE,
        max_steps=6 if not kind.startswith("adaptive") else 16,
        callbacks=callbacks,
        use_distributed_sampler=kind != "ddp",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    model = Regression(ordered_ranks=kind == "ddp", workers=2 if kind.endswith("workers") else 0)
    trainer.fit(model)
    seen = trainer.strategy.all_gather(torch.tensor(len(model.seen)))
    if trainer.global_rank == 0:
        history = getattr(trainer.strategy, "history", [])
        torch.save(
            {
                "state": {k: v.clone() for k, v in model.layer.state_dict().items()},
                "global_step": trainer.global_step,
                "micro_batches": seen.tolist(),
                "plans": [record["batch_sizes"] for record in history],
                "accumulate": trainer.accumulate_grad_batches,
            },
            out,
        )
    torch.distributed.destroy_process_group()
