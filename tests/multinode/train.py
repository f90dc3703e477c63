"""A HeteroStrategy (BSP) job for torchrun: heterogeneous through Throttle.

Each rank writes ``<out>/rank<global>.json``: its host, local and global rank, the batch
sizes and dataset indices it trained on per epoch; rank 0 adds the plan history.
"""

import json
import socket
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroStrategy
from lightning_hetero.emulate import Throttle

# 8 steps an epoch; a global batch of 128 puts the slowest rank's share of the split at 16
# samples, where 20% is 3 samples (at a global batch of 64 it was 8, where one sample is 12%)
SAMPLES, PER_RANK_BATCH, EPOCHS = 1024, 32, 4
SPEEDS = [9, 9, 6, 24]  # OmniLearn's HL4 proportions
# seconds per sample: rank 3's 32 samples sleep 96 ms, beside which the real compute that
# every rank pays alike (about 35 ms a step on a loaded 2-core machine) is small
COSTS = [0.072 / s for s in SPEEDS]


class IndexedRegression(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        self.layer = torch.nn.Linear(8, 1)
        self.drawn: dict[int, list[int]] = {}
        self.sizes: dict[int, list[int]] = {}

    def training_step(self, batch, batch_idx):
        x, y, index = batch
        epoch = self.current_epoch
        self.drawn.setdefault(epoch, []).extend(index.tolist())
        self.sizes.setdefault(epoch, []).append(len(index))
        return torch.nn.functional.mse_loss(self.layer(x).squeeze(-1), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


def main(out: Path, nodes: int, per_node: int) -> None:
    torch.set_num_threads(1)
    pl.seed_everything(0, verbose=False)
    generator = torch.Generator().manual_seed(0)
    x = torch.randn(SAMPLES, 8, generator=generator)
    data = TensorDataset(x, x.sum(dim=1), torch.arange(SAMPLES))
    model = IndexedRegression()
    strategy = HeteroStrategy()
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=per_node,
        num_nodes=nodes,
        strategy=strategy,
        max_epochs=EPOCHS,
        callbacks=[Throttle(COSTS)],
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    trainer.fit(model, DataLoader(data, batch_size=PER_RANK_BATCH, shuffle=True))
    record = {
        "host": socket.gethostname(),
        "local_rank": trainer.local_rank,
        "node_rank": trainer.node_rank,
        "global_rank": trainer.global_rank,
        "world_size": trainer.world_size,
        "drawn": model.drawn,
        "sizes": model.sizes,
        "batch_sizes": strategy.batch_sizes,
    }
    if trainer.global_rank == 0:
        record["history"] = strategy.history
    (out / f"rank{trainer.global_rank}.json").write_text(json.dumps(record))
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main(Path(sys.argv[1]), int(sys.argv[2]), int(sys.argv[3]))
