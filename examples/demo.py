"""Demo: plain DDP vs HeteroStrategy on an emulated heterogeneous 4-worker CPU cluster.

    make demo            # or: python examples/demo.py [--epochs 6] [--logs demo_logs]

Trains a small CNN on scikit-learn's handwritten digits with 4 gloo ranks whose speeds
follow OmniLearn's HL4 (9:9:6:24 cores, emulated by the Throttle callback): first with
plain uniform DDPStrategy, then with HeteroStrategy. Prints epoch times, balance and
accuracy, and leaves CSV and TensorBoard logs (``tensorboard --logdir demo_logs``).
"""

import argparse
import statistics
import tempfile
from pathlib import Path

from tqdm import tqdm

from lightning_hetero.bench.run import launch
from lightning_hetero.planning import HETEROGENEITY_LEVELS, ideal_speedup, proportional_split


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--level", default="HL4", choices=list(HETEROGENEITY_LEVELS))
    parser.add_argument("--logs", type=Path, default=Path("demo_logs"))
    args = parser.parse_args()

    cores = HETEROGENEITY_LEVELS[args.level]
    common = {
        "workers": 4,
        "batch_size": 32,
        "epochs": args.epochs,
        "sample_cost": [0.072 / c for c in cores],  # 72 ms per sample on one core
        "log_dir": str(args.logs.resolve()),
    }
    results = {}
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=2, desc="training", unit="run") as bar:
        for name in ("ddp", "hetero"):
            bar.set_postfix_str(name)
            results[name] = launch({**common, "strategy": name}, Path(tmp))
            bar.update()

    print(f"\n{args.level}: speeds {list(cores)}, global batch {4 * 32}")
    print(
        f"{'strategy':<10}{'epoch time (s)':>16}{'balance':>10}{'val acc':>10}  final batch sizes"
    )
    for name, summary in results.items():
        epoch_s = statistics.median(summary["epoch_s"][2:])
        history = summary.get("history")
        balance = f"{history[-1]['balance']:.3f}" if history else "-"
        plan = summary.get("batch_sizes", [32] * 4)
        acc = summary["metrics"].get("val_acc", float("nan"))
        print(f"{name:<10}{epoch_s:>16.3f}{balance:>10}{acc:>10.3f}  {plan}")
    ddp_s = statistics.median(results["ddp"]["epoch_s"][2:])
    hetero_s = statistics.median(results["hetero"]["epoch_s"][2:])
    ideal = ideal_speedup(cores)
    print(f"\nspeedup {ddp_s / hetero_s:.2f}x (ideal {ideal:.2f}x);")
    print(f"speed-proportional split: {proportional_split(cores, 128)}")
    print(f"plan per boundary: {[h['next_batch_sizes'] for h in results['hetero']['history']]}")
    print(f"logs: tensorboard --logdir {args.logs}")


if __name__ == "__main__":
    main()
