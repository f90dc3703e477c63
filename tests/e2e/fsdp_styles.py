"""LightningModules written as users write them, trained by HeteroFSDPStrategy on 2 gloo ranks.

usage: python fsdp_styles.py OUT_DIR. Runs one short fit per style in :data:`STYLES` (one
process group for all), each on the plan :data:`PLAN`, and saves what rank 0 sees in
``OUT_DIR/<style>.pt``: the full parameters after the step(s) and, for ``direct``, the
logged validation and test losses and each rank's predictions. ``test_fsdp_styles.py``
compares them with a single process on the union batch.

Most modules call submodules directly in their step (``self.head(self.inp(x))``) rather
than ``self(x)``; the root is sharded as a whole unless ``shard_modules`` says otherwise.
"""

import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.utils.data import DataLoader, TensorDataset

from lightning_hetero import HeteroFSDPStrategy

PLAN = [3, 13]
LR = 0.1
CLIP = 0.05
#: style -> (Trainer options, HeteroFSDPStrategy options)
STYLES: dict[str, tuple[dict, dict]] = {
    "self": ({}, {}),  # `self(x)`: the root's forward
    "direct": ({}, {}),  # submodules called directly, then validate, test and predict
    "nested": ({}, {}),  # a grandchild called directly
    "twice": ({}, {"shard_modules": ["Linear"]}),  # one sharded module used twice
    "root_param": ({}, {}),  # a parameter of the LightningModule itself
    "manual": ({}, {}),  # manual optimization, one optimizer
    "two_optimizers": ({}, {}),  # manual, two optimizers, a forward after a step (GAN)
    "accumulate": ({"accumulate_grad_batches": 2}, {}),
    "clip": ({"gradient_clip_val": CLIP}, {}),
    "bf16": ({"precision": "bf16-mixed"}, {}),
    # the memory probe's steps (undone afterwards) go through the root's forward too
    "probed": ({}, {"max_batch_size": "auto", "probe_batch_sizes": [2, 4, 8]}),
    "batch_norm": ({}, {}),  # each rank's BatchNorm statistics, averaged at the epoch's end
}
STEPS = {"accumulate": 2}  # micro-batches of the fit


def dataset(n: int = 64) -> TensorDataset:
    generator = torch.Generator().manual_seed(1)
    return TensorDataset(
        torch.randn(n, 6, generator=generator), torch.randn(n, 1, generator=generator)
    )


class Styled(pl.LightningModule):
    """A small regression net whose step is written in the given ``style``."""

    def __init__(self, style: str) -> None:
        super().__init__()
        torch.manual_seed(0)
        self.style = style
        self.inp = torch.nn.Linear(6, 8)
        self.body = torch.nn.Sequential(torch.nn.Sequential(torch.nn.Linear(8, 8)))
        self.head = torch.nn.Linear(8, 1)
        self.scale = torch.nn.Parameter(torch.tensor([1.5]))  # FSDP2 shards no 0-d tensor
        self.norm = torch.nn.BatchNorm1d(8) if style == "batch_norm" else torch.nn.Identity()
        self.automatic_optimization = style not in ("manual", "two_optimizers")

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.head(torch.tanh(self.body(self.norm(self.inp(x)))))

    def net(self, x: torch.Tensor) -> torch.Tensor:
        """The same function as ``forward``, written as each style calls it."""
        if self.style == "self":
            return self(x)
        if self.style == "nested":
            return self.head(torch.tanh(self.body[0][0](self.inp(x))))
        if self.style == "twice":
            hidden = self.body[0][0](self.inp(x))
            return self.head(torch.tanh(self.body[0][0](torch.tanh(hidden))))
        if self.style == "root_param":
            return self.scale * self.head(torch.tanh(self.body(self.inp(x))))
        return self.head(torch.tanh(self.body(self.norm(self.inp(x)))))

    def loss(self, batch: list[torch.Tensor]) -> torch.Tensor:
        x, y = batch
        return torch.nn.functional.mse_loss(self.net(x), y)

    def on_train_batch_start(self, batch, batch_idx):  # the probe's steps are not the loop's
        assert len(batch[0]) == PLAN[self.global_rank], (len(batch[0]), self.global_rank)

    def training_step(self, batch, batch_idx):
        if self.automatic_optimization:
            return self.loss(batch)
        optimizers = self.optimizers()
        first, second = optimizers if isinstance(optimizers, list) else (optimizers, None)
        first.zero_grad()
        self.manual_backward(self.loss(batch))
        first.step()
        if second is not None:  # the head's step sees the input layer after its step
            second.zero_grad()
            self.manual_backward(self.loss(batch))
            second.step()
        return None

    def validation_step(self, batch, batch_idx):
        self.log("val_loss", self.loss(batch), sync_dist=True)

    def test_step(self, batch, batch_idx):
        self.log("test_loss", self.loss(batch), sync_dist=True)

    def predict_step(self, batch, batch_idx):
        return self.net(batch[0])

    def configure_optimizers(self):
        if self.style == "two_optimizers":
            first = [*self.inp.parameters(), *self.body.parameters()]
            second = [*self.head.parameters(), self.scale]
            return torch.optim.SGD(first, lr=LR), torch.optim.SGD(second, lr=LR)
        return torch.optim.SGD(self.parameters(), lr=LR)


def fit(style: str, out_dir: Path) -> None:
    trainer_options, strategy_options = STYLES[style]
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=len(PLAN),
        strategy=HeteroFSDPStrategy(
            batch_sizes=PLAN, controller="static", shuffle=False, **strategy_options
        ),
        max_epochs=1,
        limit_train_batches=STEPS.get(style, 1),
        logger=False,
        enable_checkpointing=False,
        enable_model_summary=False,
        **trainer_options,
    )
    model = Styled(style)
    trainer.fit(model, DataLoader(dataset(), batch_size=8))
    result: dict = {}
    if style == "direct":
        loader = DataLoader(dataset(48), batch_size=4)
        result["val_loss"] = trainer.validate(model, loader, verbose=False)[0]["val_loss"]
        result["test_loss"] = trainer.test(model, loader, verbose=False)[0]["test_loss"]
        predictions = torch.cat(trainer.predict(model, loader))
        result["predictions"] = trainer.strategy.comm.gather_objects(predictions)
    result["memory_probe"] = trainer.strategy.memory_probe
    full = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True))
    result["state"] = {k: v.detach().float().cpu() for k, v in full.items()}
    if style == "batch_norm":
        result["rank_buffers"] = trainer.strategy.comm.gather_objects(
            [model.norm.running_mean.clone(), model.norm.running_var.clone()]
        )
    if trainer.global_rank == 0:
        torch.save(result, out_dir / f"{style}.pt")


if __name__ == "__main__":
    out_dir = Path(sys.argv[1])
    torch.set_num_threads(1)
    for style in sys.argv[2:] or STYLES:
        fit(style, out_dir)
    torch.distributed.destroy_process_group()
