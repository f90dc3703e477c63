"""One optimizer step of HeteroFSDPStrategy on 3 gloo ranks with the plan [1, 4, 11].

usage: python fsdp_step.py VARIANT OUT_PATH, VARIANT one of plain, clip, accumulate, bf16,
user_sharded. Rank 0 saves the full parameters after the step.
"""

import sys

import lightning.pytorch as pl
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.fsdp import fully_shard
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroFSDPStrategy

PLAN = [1, 4, 11]
STEPS = {"accumulate": 2}  # micro-batches per optimizer step
CLIP = 0.05


def dataset() -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(64, 6, generator=generator), torch.randn(64, 1, generator=generator)
    )


def initial_model() -> torch.nn.Sequential:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(6, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1))


class Regression(pl.LightningModule):
    def __init__(self, shard_itself: bool = False) -> None:
        super().__init__()
        self.net = initial_model()
        self.shard_itself = shard_itself

    def configure_model(self) -> None:
        if self.shard_itself:  # the user's own sharding, which the strategy keeps
            for layer in self.net:
                if isinstance(layer, torch.nn.Linear):
                    fully_shard(layer, mesh=self.device_mesh["data_parallel"])
            fully_shard(self.net, mesh=self.device_mesh["data_parallel"])

    def training_step(self, batch, batch_idx):
        x, y = batch
        assert len(x) == PLAN[self.global_rank], (len(x), self.global_rank)
        return torch.nn.functional.mse_loss(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.1)

    def train_dataloader(self):
        return DataLoader(dataset(), batch_size=4, shuffle=False)


if __name__ == "__main__":
    variant, out = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=3,
        strategy=HeteroFSDPStrategy(
            batch_sizes=PLAN,
            controller="static",
            shuffle=False,
            shard_modules=None if variant == "user_sharded" else ["Linear"],
        ),
        max_steps=1,
        accumulate_grad_batches=STEPS.get(variant, 1),
        gradient_clip_val=CLIP if variant == "clip" else None,
        precision="bf16-mixed" if variant == "bf16" else "32-true",
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    model = Regression(shard_itself=variant == "user_sharded")
    trainer.fit(model)
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    if trainer.global_rank == 0:
        torch.save({k: v.detach().cpu() for k, v in full.items()}, out)
    torch.distributed.destroy_process_group()
