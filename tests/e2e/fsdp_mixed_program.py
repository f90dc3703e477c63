"""An HF-style transformer under HeteroFSDPStrategy in bf16 mixed precision, 2 gloo ranks,
rank 1 throttled: does the timing see the slow rank?

usage: python fsdp_mixed_program.py OUT_JSON {autocast,policy}

``autocast``: Lightning's ``precision="bf16-mixed"``, the LightningModule sharded as one
unit by the strategy. ``policy``: the user's ``configure_model`` shards it as one unit
with FSDP2's ``MixedPrecisionPolicy(param_dtype=bfloat16)``. The model takes token ids (no
input requires a gradient, as in a Hugging Face model), so FSDP reduces the gradients from
its final backward callback; the step calls ``self(...)``, the sharded root's own forward.
Rank 0 writes the strategy's history and final plan.
"""

import json
import sys
from datetime import timedelta

import lightning.pytorch as pl
import torch
from torch import nn
from torch.utils.data import DataLoader, Dataset

from lightning_hetero import HeteroFSDPStrategy
from lightning_hetero.emulate import Throttle

VOCAB, LENGTH, DIM, SAMPLES, BATCH = 1000, 16, 64, 384, 16
COSTS = [0.0, 0.1]  # seconds per sample: rank 1 is much slower than the noise of a step


class Tokens(Dataset):
    def __len__(self) -> int:
        return SAMPLES

    def __getitem__(self, index: int) -> dict:
        ids = torch.randint(0, VOCAB, (LENGTH,), generator=torch.Generator().manual_seed(index))
        return {"input_ids": ids, "labels": index % 2}


class Classifier(nn.Module):
    """Embedding, transformer encoder, a head on the first token: called with keywords."""

    def __init__(self) -> None:
        super().__init__()
        self.embeddings = nn.Embedding(VOCAB, DIM)
        layer = nn.TransformerEncoderLayer(DIM, 4, 4 * DIM, dropout=0.0, batch_first=True)
        self.encoder = nn.TransformerEncoder(layer, 2, enable_nested_tensor=False)
        self.head = nn.Linear(DIM, 2)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict:
        logits = self.head(self.encoder(self.embeddings(input_ids))[:, 0])
        return {"loss": nn.functional.cross_entropy(logits.float(), labels), "logits": logits}


class FineTune(pl.LightningModule):
    def __init__(self, policy: bool) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.model = Classifier()
        self.policy = policy

    def configure_model(self) -> None:
        if self.policy:
            from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

            mixed = MixedPrecisionPolicy(param_dtype=torch.bfloat16)
            fully_shard(self, mesh=self.device_mesh["data_parallel"], mp_policy=mixed)

    def forward(self, input_ids: torch.Tensor, labels: torch.Tensor) -> dict:
        return self.model(input_ids=input_ids, labels=labels)

    def training_step(self, batch, batch_idx):
        outputs = self(**batch)  # the sharded root's forward, inside the step (as HF fine-tunes do)
        self.log("train_loss", outputs["loss"])
        return outputs["loss"]

    def configure_optimizers(self):
        return torch.optim.AdamW(self.parameters(), lr=1e-4)

    def train_dataloader(self):
        return DataLoader(Tokens(), batch_size=BATCH)


if __name__ == "__main__":
    out, variant = sys.argv[1], sys.argv[2]
    torch.set_num_threads(1)
    strategy = HeteroFSDPStrategy(
        adjust_every=4, revert_slower=False, timeout=timedelta(seconds=120)
    )
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=2,
        strategy=strategy,
        precision="32-true" if variant == "policy" else "bf16-mixed",
        max_epochs=1,
        logger=False,
        enable_model_summary=False,
        enable_checkpointing=False,
        callbacks=[Throttle(sample_cost=COSTS)],
    )
    trainer.fit(FineTune(policy=variant == "policy"))
    if trainer.global_rank == 0:
        keys = ("batch_sizes", "next_batch_sizes", "compute_times", "wait_times")
        history = [{k: entry[k] for k in keys} for entry in strategy.history]
        with open(out, "w") as f:
            json.dump({"history": history, "batch_sizes": strategy.batch_sizes}, f)
    torch.distributed.destroy_process_group()
