"""Memory-bound ranks: per-rank micro-batches against DDP with gradient accumulation.

Two emulated ranks with speeds 3:1 (``sample_cost`` 1 and 3 units per sample), each able
to hold 4 samples at once, a fixed cost of 1 unit per micro-batch (``Throttle``'s
``step_cost``, charged at every backward) and 32 samples per optimizer step:

- DDP: loader batch 4, ``accumulate_grad_batches=4`` (each rank 16 samples per step in four
  micro-batches; a step takes ``48 + 4`` units, the slow rank's);
- ``HeteroStrategy(global_batch_size=32, micro_batch_size=4)``: the plan moves samples to
  the fast rank, which runs them as more micro-batches (``24 + 6`` units at 24/8);
  with ``--unchanged``, DDP's program as it is (``accumulate_grad_batches=4``, loader batch
  4) under ``HeteroStrategy``, which plans the same global batch of micro-batches itself.

Ideal ratio ``52 / 30 = 1.73`` (emulated costs only). The unit is 1 ms as the issue states
it; on a loaded machine the real compute and the CPU contention of a micro-batch (a few ms)
swamp that, so ``--unit`` scales every emulated cost. Both run back to back in each
repeat:

    python -m lightning_hetero.bench.micro --repeats 3 --unit 0.005

``--fsdp``: the same under FSDP2, Lightning's ``ModelParallelStrategy`` with the same
accumulation against ``HeteroFSDPStrategy`` with the same options (CPU ranks, gloo).
"""

import argparse
import statistics
import tempfile
from pathlib import Path
from typing import Any

from lightning_hetero.bench.run import run_pair

__all__ = ["IDEAL", "configs", "main", "ratio"]

SAMPLE_COST = [0.001, 0.003]
MICRO_COST = 0.001
MICRO, GLOBAL = 4, 32
#: DDP's step over the best hetero step, emulated costs only: (48 + 4) / (24 + 6).
IDEAL = (3 * 16 + 4) / (24 + 6)


def configs(
    epochs: int = 5, unit: float = 0.001, unchanged: bool = False
) -> tuple[dict[str, Any], dict[str, Any]]:
    """The pair's shared run config (DDP's) and the hetero run's additions; ``unit``: seconds
    per emulated unit (1 ms as stated); ``unchanged``: none (DDP's accumulation as it is)."""
    ranks = len(SAMPLE_COST)
    scale = unit / 0.001
    shared = {
        "workers": ranks,
        "sample_cost": [c * scale for c in SAMPLE_COST],
        "step_cost": MICRO_COST * scale,
        "epochs": epochs,
        "batch_size": MICRO,
        "resolution": 8,
        "validate": False,
        "accumulate_grad_batches": GLOBAL // (MICRO * ranks),
    }
    hetero = {
        "accumulate_grad_batches": 1,
        "extra": {"global_batch_size": GLOBAL, "micro_batch_size": MICRO},
    }
    return shared, {} if unchanged else hetero


def ratio(pair: dict[str, dict[str, Any]], skip: int = 2) -> float:
    """DDP's steady epoch time over the hetero run's (epochs after the first ``skip``)."""
    ddp, hetero = (statistics.median(pair[k]["epoch_s"][skip:]) for k in ("ddp", "hetero"))
    return ddp / hetero


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=5)
    parser.add_argument("--unit", type=float, default=0.001, help="seconds per cost unit")
    parser.add_argument(
        "--fsdp", action="store_true", help="FSDP2: ModelParallelStrategy vs HeteroFSDPStrategy"
    )
    parser.add_argument(
        "--unchanged",
        action="store_true",
        help="hetero runs DDP's program unchanged (accumulate_grad_batches=4, no options)",
    )
    args = parser.parse_args(argv)
    if args.unchanged and args.fsdp:  # HeteroFSDPStrategy does not take accumulation over
        parser.error("--unchanged runs under HeteroStrategy only, not with --fsdp")
    shared, hetero = configs(args.epochs, args.unit, args.unchanged)
    ratios, plans = [], []
    with tempfile.TemporaryDirectory() as folder:
        for repeat in range(args.repeats):
            pair = run_pair(shared, repeat, Path(folder), hetero_options=hetero, sharded=args.fsdp)
            ratios.append(ratio(pair))
            plans.append(pair["hetero"]["batch_sizes"])
    low, mid, high = min(ratios), statistics.median(ratios), max(ratios)
    base, arm = ("FSDP2", "HeteroFSDPStrategy micro-batches") if args.fsdp else ("DDP", "")
    if not args.fsdp:
        arm = "the same program under hetero" if args.unchanged else "hetero micro-batches"
    print(f"{base} + accumulation / {arm}, steady epoch time (ideal {IDEAL:.2f}x):")
    print(f"  min {low:.2f}x  median {mid:.2f}x  max {high:.2f}x  ({mid / IDEAL:.0%} of ideal)")
    print(f"  ratios {[round(r, 3) for r in ratios]}; last plans {plans}")


if __name__ == "__main__":
    main()
