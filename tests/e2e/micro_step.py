"""SGD steps on gloo ranks that run their shares as micro-batches; rank 0 saves the result.

usage: python micro_step.py OUT_PATH PLAN BOUNDS CLIP PRECISION STEPS [STRATEGY]
(PLAN, BOUNDS: JSON lists, one entry per rank, BOUNDS also ``"auto"``: the memory probe's, at
the sizes ``PROBE_SIZES``; CLIP: 0 for none; STRATEGY: ``ddp``, the
default, or ``fsdp`` (``HeteroFSDPStrategy``, the deep model: each Linear a unit) or
``fsdp_root`` (the deep model sharded as one root unit))
"""

import json
import sys

import lightning.pytorch as pl
import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroFSDPStrategy, HeteroStrategy

PROBE_SIZES = [2, 4]  # with BOUNDS "auto"


def dataset(samples: int) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(samples, 5, generator=generator), torch.randn(samples, 1, generator=generator)
    )


def initial_layer(deep: bool = False) -> torch.nn.Module:
    """One linear layer, or (``deep``) two with a nonlinearity between them (FSDP's units)."""
    torch.manual_seed(0)
    if deep:
        return torch.nn.Sequential(torch.nn.Linear(5, 4), torch.nn.Tanh(), torch.nn.Linear(4, 1))
    return torch.nn.Linear(5, 1)


class Regression(pl.LightningModule):
    def __init__(self, samples: int, deep: bool = False) -> None:
        super().__init__()
        self.layer = initial_layer(deep)
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


def record_collectives(log: list[str]) -> None:
    """Append each of FSDP2's collectives (its all-gathers and reduce-scatters go through
    these two functions of ``torch.distributed``) to ``log`` as it is issued: its name and
    the elements of its output. The plugin's own rows (``Collectives.gather_rows``, float64,
    at set-up and boundaries) go through the all-gather too and are left out."""

    def counted(name, original):
        def collective(output, *args, **kwargs):
            if output.dtype != torch.float64:  # the model's parameters and gradients
                log.append(f"{name} {output.numel()}")
            return original(output, *args, **kwargs)

        return collective

    for name in ("all_gather_single", "reduce_scatter_single"):
        setattr(dist, name, counted(name, getattr(dist, name)))


if __name__ == "__main__":
    out, plan, bounds = sys.argv[1], json.loads(sys.argv[2]), json.loads(sys.argv[3])
    clip, precision, steps = float(sys.argv[4]), sys.argv[5], int(sys.argv[6])
    kind = sys.argv[7] if len(sys.argv) > 7 else "ddp"
    torch.set_num_threads(1)
    # the expected gradients slice the data in order
    options = dict(batch_sizes=plan, controller="static", shuffle=False, micro_batch_size=bounds)
    if bounds == "auto":
        options["probe_batch_sizes"] = PROBE_SIZES
    if kind == "ddp":
        strategy = HeteroStrategy(**options)
    else:
        units = ["Linear"] if kind == "fsdp" else None
        strategy = HeteroFSDPStrategy(shard_modules=units, **options)
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=len(plan),
        strategy=strategy,
        precision=precision,
        gradient_clip_val=clip or None,
        max_steps=steps,
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
    )
    model = Regression(sum(plan), deep=kind != "ddp")
    collectives: list[str] = []  # FSDP's, on this rank, in order
    if kind != "ddp":
        record_collectives(collectives)
    trainer.fit(model)
    seen = trainer.strategy.gather_objects(model.seen)
    collectives = trainer.strategy.gather_objects(collectives)
    if kind == "ddp":
        state = {k: v.clone() for k, v in model.layer.state_dict().items()}
    else:  # the full parameters, gathered from the shards (a collective: every rank)
        full = get_model_state_dict(model.layer, options=StateDictOptions(full_state_dict=True))
        state = {k: v.detach().clone() for k, v in full.items()}
    if trainer.global_rank == 0:
        metric = float(trainer.callback_metrics["target_mean"])
        result = {"state": state, "seen": seen, "target_mean": metric}
        result["probe"], result["micro_bounds"] = strategy.memory_probe, strategy.micro_bounds
        torch.save({**result, "collectives": collectives}, out)
    torch.distributed.destroy_process_group()
