"""Demo: plain DDP vs HeteroStrategy on an emulated heterogeneous 4-worker CPU cluster.

    make demo            # or: python examples/demo.py [--epochs 6] [--logs demo_logs]

Trains a small CNN on scikit-learn's handwritten digits with 4 gloo ranks whose speeds
follow OmniLearn's HL4 (9:9:6:24 cores, emulated by the Throttle callback): first with
plain uniform DDPStrategy, then with HeteroStrategy. Prints epoch times, balance and
accuracy, leaves CSV and TensorBoard logs (``tensorboard --logdir demo_logs``) and draws
the HeteroStrategy run against DDP in ``demo_logs/demo.png`` (with matplotlib).
"""

import argparse
import statistics
import tempfile
from pathlib import Path

from tqdm import tqdm

from lightning_hetero.bench.run import launch
from lightning_hetero.planning import HETEROGENEITY_LEVELS, ideal_speedup, proportional_split
from lightning_hetero.plots import plot_history
from lightning_hetero.summary import summary_line as fit_summary_line

SKIP = 2  # epochs left out of the steady state (the first re-plans)
# why the two runs' accuracy differs although the gradient is exact
ACCURACY_NOTE = (
    "val acc: the runs differ although the gradient is exact (other batches, other rounding):"
    " docs/faq.md, 'Why does the validation accuracy differ from DDP's?'"
)


def compress(plans: list[list[int]]) -> str:
    """Consecutive equal plans as one, with a count: ``[1, 2] x5, [2, 1]``."""
    runs: list[tuple[list[int], int]] = []
    for plan in plans:
        if runs and runs[-1][0] == plan:
            runs[-1] = (plan, runs[-1][1] + 1)
        else:
            runs.append((plan, 1))
    return ", ".join(f"{plan} x{count}" if count > 1 else str(plan) for plan, count in runs)


def summary_line(speedup: float, ideal: float, split: list[int]) -> str:
    """The demo's result in one line."""
    return (
        f"speedup {speedup:.2f}x per epoch (ideal {ideal:.2f}x, with the speed-proportional"
        f" split {split})"
    )


def ddp_baseline(summary: dict, epoch_s: float, ideal: float) -> dict:
    """The DDP run as :func:`~lightning_hetero.plots.plot_history`'s ``baseline``."""
    times = summary["step_times"]
    steady = slice(SKIP, None) if len(times["compute_times"]) > SKIP else slice(None)

    def per_rank(key: str) -> list[float]:
        return [statistics.median(ranks) for ranks in zip(*times[key][steady])]

    return {
        "label": "DDP",
        "compute_times": per_rank("compute_times"),
        "wait_times": per_rank("wait_times"),
        "epoch_s": epoch_s,
        "ideal_speedup": ideal,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--epochs", type=int, default=6)
    parser.add_argument("--level", default="HL4", choices=list(HETEROGENEITY_LEVELS))
    parser.add_argument("--logs", type=Path, default=Path("demo_logs"))
    parser.add_argument("--plot", type=Path, help="the chart (PNG); default: LOGS/demo.png")
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
    total = 2 * args.epochs
    with tempfile.TemporaryDirectory() as tmp, tqdm(total=total, unit="epoch") as bar:
        for run, name in enumerate(("ddp", "hetero")):
            bar.set_description(f"{name} ({run + 1}/2)")
            extra = {"step_times": True} if name == "ddp" else {}  # per-rank times for the chart

            def advance(done: int, start: int = run * args.epochs) -> None:
                bar.update(start + done - bar.n)  # epochs finished in this run, so far

            # the runs' output is captured, never shown: this bar shows their progress
            config = {**common, "strategy": name, "progress_bar": False, **extra}
            results[name] = launch(config, Path(tmp), on_epoch=advance)
            bar.update((run + 1) * args.epochs - bar.n)

    print(f"\n{args.level}: speeds {list(cores)}, global batch {4 * 32}")
    print(
        f"{'strategy':<10}{'epoch time (s)':>16}{'balance':>10}{'val acc':>10}  final batch sizes"
    )
    for name, summary in results.items():
        epoch_s = statistics.median(summary["epoch_s"][SKIP:])
        history = summary.get("history")
        balance = f"{history[-1]['balance']:.3f}" if history else "-"
        plan = summary.get("batch_sizes", [32] * 4)
        acc = summary["metrics"].get("val_acc", float("nan"))
        print(f"{name:<10}{epoch_s:>16.3f}{balance:>10}{acc:>10.3f}  {plan}")
    ddp_s = statistics.median(results["ddp"]["epoch_s"][SKIP:])
    hetero_s = statistics.median(results["hetero"]["epoch_s"][SKIP:])
    ideal = ideal_speedup(cores)
    print(f"\n{summary_line(ddp_s / hetero_s, ideal, proportional_split(cores, 128))}")
    plans = [h["next_batch_sizes"] for h in results["hetero"]["history"]]
    print(f"plan per boundary: {compress(plans)}")
    if results["hetero"].get("fit_summary"):  # the strategy's own end-of-fit line
        print(fit_summary_line(results["hetero"]["fit_summary"]))
    print(ACCURACY_NOTE)
    print(f"logs: tensorboard --logdir {args.logs}")
    chart = args.plot or args.logs / "demo.png"
    chart.parent.mkdir(parents=True, exist_ok=True)
    try:
        plot_history(
            results["hetero"]["history"],
            chart,
            baseline=ddp_baseline(results["ddp"], ddp_s, ideal),
            epoch_s=hetero_s,
            title=f"{args.level} on 4 emulated workers (speeds {list(cores)}): HeteroStrategy"
            f" {ddp_s / hetero_s:.2f}\u00d7 faster than DDP per epoch (ideal {ideal:.2f}\u00d7)",
        )
    except ModuleNotFoundError as err:  # matplotlib: the plot extra
        print(f"chart: not drawn: {err}")
    else:
        print(f"chart: {chart}")


if __name__ == "__main__":
    main()
