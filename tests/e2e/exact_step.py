"""One SGD step on 3 gloo ranks with uneven batches; rank 0 saves the parameters.

usage: python exact_step.py WEIGHTED(0|1) OUT_PATH
"""

import sys

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy

PLAN = [2, 3, 5]


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(10, 5, generator=generator), torch.randn(10, 1, generator=generator)
    )


def initial_layer() -> torch.nn.Linear:
    torch.manual_seed(0)
    return torch.nn.Linear(5, 1)


class Regression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = initial_layer()

    def training_step(self, batch, batch_idx):
        x, y = batch
        assert len(x) == PLAN[self.global_rank]
        return torch.nn.functional.mse_loss(self.layer(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=4, shuffle=False)


if __name__ == "__main__":
    weighted, out = sys.argv[1] == "1", sys.argv[2]
    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=3,
        # the expected gradients slice the data in order
        strategy=HeteroStrategy(
            batch_sizes=PLAN, controller="static", weighted=weighted, shuffle=False
        ),
        max_steps=1,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    model = Regression()
    trainer.fit(model)
    if trainer.global_rank == 0:
        torch.save(model.layer.state_dict(), out)
    torch.distributed.destroy_process_group()
