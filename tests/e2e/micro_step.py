"""SGD steps on gloo ranks that run their shares as micro-batches; rank 0 saves the result.

usage: python micro_step.py OUT_PATH PLAN BOUNDS CLIP PRECISION STEPS
(PLAN, BOUNDS: JSON lists, one entry per rank; CLIP: 0 for none)
"""

import json
import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy


def dataset(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(samples, 5, generator=generator), torch.randn(samples, 1, generator=generator)
    )


def initial_layer() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(5, 1)


class Regression(pl.LightningModule):
    def __init__(self, samples: int) -> None:
        super().__init__()
        self.layer = initial_layer()
        self.samples = samples
        self.seen: list[int] = []

    def training_step(self, batch, batch_idx):
        x, y = batch
        self.seen.append(len(x))
        # an epoch mean of a per-sample quantity: the mean of every sample's target when
        # each micro-batch's value weighs its own samples
        self.log("target_mean", y.mean(), on_step=False, on_epoch=True, sync_dist=True)
        return torch.nn.functional.mse_loss(self.layer(x).float(), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(dataset(self.samples), batch_size=4, shuffle=False)


if __name__ == "__main__":
    out, plan, bounds = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    clip, precision, steps = float(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=len(plan),
        # the expected gradients slice the data in order
        strategy=HeteroStrategy(
            batch_sizes=plan, controller="static", shuffle=False, micro_batch_size=bounds
        ),
        precision=precision,
        gradient_clip_val=clip or None,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    model = Regression(sum(plan))
    trainer.fit(model)
    seen = trainer.strategy.gather_objects(model.seen)
    if trainer.global_rank == 0:
        state = {k: v.clone() for k, v in model.layer.state_dict().items()}
        metric = float(trainer.callback_metrics["target_mean"])
        torch.save({"state": state, "seen": seen, "target_mean": metric}, out)
    torch.distributed.destroy_process_group()
