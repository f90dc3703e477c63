"""A small DistilBERT-like fine-tune under HeteroFSDPStrategy on 2 equal gloo ranks: does
the plan stay uniform? (issue 42: rank 0 was charged more compute and got [58, 70])

usage: python fsdp_equal_program.py OUT_JSON [--shape LENGTH,DIM,LAYERS,BATCH,STEPS]
       [--precision P] [--slow SECONDS] [--adjust-every N]

The defaults are the slow test's small model. Issue 42's DistilBERT size, one rank slowed by
0.256 s a step: ``--shape 128,256,3,64,16 --slow 0.256 --adjust-every 4`` (BENCHMARKS.md).

Token ids in (no input needs a gradient), an embedding, transformer layers each sharded on
their own (``shard_modules``), gradient clipping (DTensor's norm: a functional all-reduce in
the step) and Lightning's thread count per rank left to the strategy (no
``torch.set_num_threads``). Rank 0 writes the history, the final plan and every rank's
number of CPU threads.
"""

import argparse
import json
import os
from datetime import timedelta

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroFSDPStrategy
from lightning_hetero.emulate import Throttle

VOCAB, LENGTH, DIM, LAYERS, BATCH, STEPS = 1000, 32, 64, 2, 16, 24


class FineTune(pl.LightningModule):
    def __init__(self) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.embeddings = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, LAYERS, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, 2)

    def training_step(self, batch, batch_idx):
        ids, labels = batch
        logits = self.head(self.encoder(self.embeddings(ids))[:, 0])
        return nn.functional.cross_entropy(logits, labels)

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)

    def train_dataloader(self):
        generator = torch.Generator().manual_seed(0)
        ids = torch.randint(0, VOCAB, (2 * BATCH * STEPS, LENGTH), generator=generator)
        labels = torch.randint(0, 2, (2 * BATCH * STEPS,), generator=generator)
        return DataLoader(TensorDataset(ids, labels), batch_size=BATCH)


if __name__ == "__main__":
    parser = argparse.ArgumentParser()
    parser.add_argument("out")
    parser.add_argument("--shape", default=f"{LENGTH},{DIM},{LAYERS},{BATCH},{STEPS}")
    parser.add_argument("--precision", default="32-true")
    parser.add_argument("--slow", type=float, default=0.0, help="seconds a step on rank 1")
    parser.add_argument("--adjust-every", type=int, default=4)
    args = parser.parse_args()
    LENGTH, DIM, LAYERS, BATCH, STEPS = (int(v) for v in args.shape.split(","))
    # as in a user's shell: Lightning chooses each rank's threads (the tests' runner sets 1)
    os.environ.pop("OMP_NUM_THREADS", None)
    strategy = HeteroFSDPStrategy(
        shard_modules=["TransformerEncoderLayer"],
        adjust_every=args.adjust_every,
        timeout=timedelta(seconds=600),
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        max_epochs=1,
        precision=args.precision,
        callbacks=[Throttle([0.0, 0.0], step_cost=[0.0, args.slow])] if args.slow else [],
        gradient_clip_val=1.0,
        logger=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
    )
    trainer.fit(FineTune())
    threads = [None, None]
    torch.distributed.all_gather_object(threads, torch.get_num_threads())
    if trainer.global_rank == 0:
        keys = ("batch_sizes", "compute_times", "wait_times", "step_time")
        history = [{k: entry[k] for k in keys} for entry in strategy.history]
        with open(args.out, "w") as f:
            json.dump({"history": history, "plan": strategy.batch_sizes, "threads": threads}, f)
    torch.distributed.destroy_process_group()
