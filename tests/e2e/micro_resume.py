"""Train one epoch with micro-batches and a checkpoint, then resume it for a second.

usage: python micro_resume.py DIR PLAN BOUNDS
The first run starts from the explicit plan PLAN; the resumed one is given only the bounds
and the global batch (``batch_sizes="uniform"``): the plan comes from the checkpoint. Rank 0
saves what the resumed run did in DIR/resumed.pt.
"""

import json
import sys
from pathlib import Path

import lightning.pytorch as pl
import torch
from lightning.pytorch.callbacks import ModelCheckpoint

from lightning_hetero import HeteroStrategy

try:  # imported by pytest's doctest collection, as part of the tests package
    from tests.e2e.micro_step import Regression
except ModuleNotFoundError:  # run as a script from this folder (launch.run_script)
    from micro_step import Regression


def trainer(folder: Path, epochs: int, batch_sizes, bounds) -> pl.Trainer:
    return pl.Trainer(
        accelerator="cpu",
        devices=len(bounds),
        strategy=HeteroStrategy(
            batch_sizes=batch_sizes,
            global_batch_size=10,
            controller="static",
            shuffle=False,
            micro_batch_size=bounds,
        ),
        max_epochs=epochs,
        callbacks=[ModelCheckpoint(dirpath=folder, save_last=True)],
        logger=False,
        enable_model_summary=False,
    )


if __name__ == "__main__":
    folder, plan, bounds = Path(sys.argv[1]), json.loads(sys.argv[2]), json.loads(sys.argv[3])
    torch.set_num_threads(1)
    first = trainer(folder, 1, plan, bounds)
    first.fit(Regression(sum(plan)))
    resumed = trainer(folder / "resumed", 2, "uniform", bounds)
    model = Regression(sum(plan))
    resumed.fit(model, ckpt_path=folder / "last.ckpt")
    seen = resumed.strategy.gather_objects(model.seen)
    if resumed.global_rank == 0:
        state = {k: v.clone() for k, v in model.layer.state_dict().items()}
        result = {"state": state, "seen": seen, "plan": resumed.strategy.batch_sizes}
        torch.save(result, folder / "resumed.pt")
    torch.distributed.destroy_process_group()
