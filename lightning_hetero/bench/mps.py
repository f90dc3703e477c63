"""Real heterogeneous GPU workers on one GPU: MPS gives each rank its own share of the SMs.

    python -m lightning_hetero.bench.mps --shares 100 50 25 25 --repeats 3

NVIDIA's Multi-Process Service runs the ranks' kernels side by side on one GPU; a client's
``CUDA_MPS_ACTIVE_THREAD_PERCENTAGE`` caps the share of the streaming multiprocessors its
kernels may use, so ranks with shares 100/50/25/25 behave like GPUs of different sizes.
Every repeat trains the digits CNN (upsampled, widened so the GPU has work) with uniform
DDP and with [`HeteroStrategy`][lightning_hetero.HeteroStrategy], back to back, alternating which
goes first; all ranks sit on ``cuda:0`` and talk over gloo (NCCL refuses two ranks on one
GPU). Needs a CUDA GPU and ``nvidia-cuda-mps-control`` (run as the GPU's owner or root);
the MPS daemon is started for the run and stopped after it.
"""

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
from collections.abc import Iterator, Sequence
from contextlib import contextmanager
from pathlib import Path
from typing import Any

from lightning_hetero.bench._extra import exit_without_extra

if __name__ == "__main__":  # a core install: say what to install, before importing it
    exit_without_extra("python -m lightning_hetero.bench.mps")

from tqdm import tqdm  # noqa: E402

from lightning_hetero.bench._format import spread  # noqa: E402
from lightning_hetero.bench.run import child_env, run_pair  # noqa: E402
from lightning_hetero.planning import ideal_speedup  # noqa: E402

__all__ = ["device_readings", "measure", "mps_daemon", "report"]

_READ = """
import json, torch
from lightning_hetero.resources import flops_or_nan
device = torch.device("cuda", 0)
props = torch.cuda.get_device_properties(device)
print(json.dumps({"sms": props.multi_processor_count, "flops": flops_or_nan(device)}))
"""


@contextmanager
def mps_daemon() -> Iterator[Path]:
    """Start an MPS control daemon in a private pipe directory; stop it on exit.

    The directory goes into ``os.environ`` (``CUDA_MPS_PIPE_DIRECTORY``), which the runs
    started inside the block inherit, so their CUDA contexts become this daemon's clients.
    """
    control = shutil.which("nvidia-cuda-mps-control")
    if control is None:
        raise RuntimeError("nvidia-cuda-mps-control is not on PATH: MPS is not installed here.")
    with tempfile.TemporaryDirectory(prefix="lh-mps-") as root:
        pipes, logs = Path(root, "pipe"), Path(root, "log")
        pipes.mkdir()
        logs.mkdir()
        saved = {
            k: os.environ.get(k) for k in ("CUDA_MPS_PIPE_DIRECTORY", "CUDA_MPS_LOG_DIRECTORY")
        }
        os.environ["CUDA_MPS_PIPE_DIRECTORY"], os.environ["CUDA_MPS_LOG_DIRECTORY"] = (
            str(pipes),
            str(logs),
        )
        started = False
        try:
            start = subprocess.run([control, "-d"], capture_output=True, text=True)
            if start.returncode != 0:
                raise RuntimeError(
                    f"nvidia-cuda-mps-control -d failed ({start.returncode}):"
                    f" {start.stderr.strip() or start.stdout.strip()}"
                )
            started = True
            yield logs
        finally:
            if started:
                subprocess.run([control], input="quit\n", text=True, env=os.environ.copy())
            for key, value in saved.items():
                if value is None:
                    os.environ.pop(key, None)
                else:
                    os.environ[key] = value


def device_readings(shares: Sequence[int]) -> list[dict[str, float]]:
    """What a fresh CUDA context with each share sees: SM count and ``flops_or_nan``."""
    readings = []
    for share in shares:
        env = child_env(CUDA_MPS_ACTIVE_THREAD_PERCENTAGE=str(share))
        out = subprocess.run(
            [sys.executable, "-c", _READ], env=env, capture_output=True, text=True, check=True
        ).stdout
        readings.append(json.loads(out.strip().splitlines()[-1]))
    return readings


def measure(
    shares: Sequence[int],
    repeats: int,
    workdir: Path,
    common: dict[str, Any],
    hetero_options: dict[str, Any] | None = None,
) -> list[dict[str, Any]]:
    """``repeats`` pairs of runs (uniform DDP, HeteroStrategy) with one MPS share per rank."""
    base = {**common, "accelerator": "gpu", "mps_shares": list(shares), "workers": len(shares)}
    with tqdm(total=2 * repeats, desc="MPS runs", unit="run") as progress:
        return [
            run_pair(base, repeat, workdir, hetero_options, progress) for repeat in range(repeats)
        ]


def _cell(values: list[float], digits: int = 3) -> str:
    return spread(values, f".{digits}g")


def report(
    shares: Sequence[int],
    pairs: list[dict[str, Any]],
    readings: list[dict[str, float]] | None = None,
    skip: int = 2,
) -> str:
    """Markdown: steady epoch times, speedup and accuracy (min / median / max over repeats)."""
    epoch = {
        name: [statistics.median(p[name]["epoch_s"][skip:]) for p in pairs] for name in pairs[0]
    }
    speedups = [d / h for d, h in zip(epoch["ddp"], epoch["hetero"])]
    lines = [
        f"MPS shares {list(shares)}; ideal speedup from the shares"
        f" {ideal_speedup([float(s) for s in shares]):.2f}",
        "",
        "| | uniform DDP | HeteroStrategy |",
        "|---|---|---|",
        f"| steady epoch s | {_cell(epoch['ddp'])} | {_cell(epoch['hetero'])} |",
        f"| speedup vs DDP | 1 | {_cell(speedups)} |",
    ]
    accuracy = {
        name: [p[name]["metrics"].get("val_acc", float("nan")) for p in pairs] for name in pairs[0]
    }
    if not any(v != v for vs in accuracy.values() for v in vs):  # no NaN: validation ran
        lines.append(f"| final val acc | {_cell(accuracy['ddp'])} | {_cell(accuracy['hetero'])} |")
    plans = [p["hetero"]["batch_sizes"] for p in pairs]
    lines += ["", f"Final plans (per rank): {plans}"]
    first = pairs[0]["hetero"]["history"]
    if first:
        lines.append(f"Initial plan (first repeat): {first[0]['batch_sizes']}")
    if readings is not None:
        lines.append(
            "Per-share readings (SMs, flops proxy): "
            + ", ".join(f"{s}%: {r['sms']} SMs, {r['flops']:.3g}" for s, r in zip(shares, readings))
        )
    lines.append(
        f"\nEach cell: min / median / max over {len(pairs)} repeats; epochs after the first {skip}."
    )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> None:
    parser = argparse.ArgumentParser(
        prog="python -m lightning_hetero.bench.mps", description=__doc__.split("\n\n")[0]
    )
    parser.add_argument("--shares", type=int, nargs="+", default=[100, 50, 25, 25])
    parser.add_argument("--repeats", type=int, default=3)
    parser.add_argument("--epochs", type=int, default=12)
    parser.add_argument("--batch-size", type=int, default=64, help="per rank under uniform DDP")
    parser.add_argument("--resolution", type=int, default=64)
    parser.add_argument("--width", type=int, default=16, help="channel multiplier of the CNN")
    parser.add_argument(
        "--batch-sizes",
        default="uniform",
        choices=("uniform", "flops"),
        help="HeteroStrategy's initial plan (default: uniform)",
    )
    parser.add_argument("--out", type=Path, help="write the raw run summaries here (JSON)")
    args = parser.parse_args(argv)
    if args.repeats < 1 or args.epochs < 3 or any(not 1 <= s <= 100 for s in args.shares):
        parser.error("needs --repeats >= 1, --epochs >= 3 and shares in [1, 100]")
    if len(args.shares) < 2:
        parser.error("needs at least two --shares (one per rank)")
    common = {
        "epochs": args.epochs,
        "batch_size": args.batch_size,
        "resolution": args.resolution,
        "width": args.width,
    }
    import torch

    if not torch.cuda.is_available():
        raise SystemExit("The MPS benchmark needs a CUDA GPU; none is visible here.")
    try:
        with mps_daemon(), tempfile.TemporaryDirectory() as workdir:
            readings = device_readings(args.shares)
            pairs = measure(
                args.shares, args.repeats, Path(workdir), common, {"batch_sizes": args.batch_sizes}
            )
    except RuntimeError as err:  # no MPS here, or its daemon would not start
        raise SystemExit(f"The MPS benchmark cannot run: {err}") from err
    if args.out:
        args.out.write_text(json.dumps({"readings": readings, "pairs": pairs}, indent=1))
    print(report(args.shares, pairs, readings))


if __name__ == "__main__":
    main()
