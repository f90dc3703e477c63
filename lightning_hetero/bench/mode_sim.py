"""Convergence of the modes' update rules in one process, without Lightning or RPC.

``K`` emulated ranks of equal speed take turns: each computes its gradient on the parameters
it last received, so every push is ``K - 1`` server versions stale, as with equal ranks in
async mode. The server is the real ``ParameterServer``;
local SGD steps ``K`` replicas with the real learning-rate rule and averages them every
``merge_every`` steps. The task is the benchmark's digit-reversing transformer (Adam,
warm-up and cosine over the data seen). Much cheaper than ``python -m
lightning_hetero.bench.modes`` (one process, one thread), for the rules' effect alone:

    python -m lightning_hetero.bench.mode_sim --workers 2 4 --seeds 0 1 --lr-factors 1 2
"""

import argparse
import copy
import math
from collections.abc import Sequence

import torch
from torch import nn

from lightning_hetero._optim import lr_factor, lr_rule, scaled_lr
from lightning_hetero.bench.workload import ReverseTransformer, reverse_tensors
from lightning_hetero.paramserver import ParameterServer

__all__ = ["RULES", "simulate"]

#: The compared update rules: ``ddp``; ``async`` with ``lr_scaling`` ``"auto"`` (the
#: measured-noise rule for Adam), ``"sqrt"`` or ``"linear"`` (paper 002's rule); ``local``
#: with ``"auto"`` (square root) or ``"linear"``.
RULES = ("ddp", "async", "async-sqrt", "async-linear", "local", "local-linear")


def _schedule(done: float, warmup: float) -> float:
    if done < warmup:
        return done / warmup
    return 0.5 * (1 + math.cos(math.pi * min((done - warmup) / (1 - warmup), 1.0)))


def _accuracy(model: ReverseTransformer, data: torch.Tensor, targets: torch.Tensor) -> float:
    with torch.no_grad():
        return float((model(data).argmax(-1) == targets).float().mean())


def simulate(
    rule: str,
    workers: int,
    seed: int,
    lr: float = 5e-4,
    epochs: int = 2,
    global_batch: int = 128,
    merge_every: int = 10,
) -> list[float]:
    """Validation accuracy after each epoch of ``rule`` on ``workers`` emulated ranks."""
    torch.manual_seed(seed)
    train, val = reverse_tensors(seed)
    x, y = train.tensors
    model = ReverseTransformer(lr=lr)
    steps = len(x) // global_batch  # DDP's steps per epoch
    warmup = 50 / (epochs * steps)
    local = global_batch // workers
    if rule == "ddp":
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    elif rule.startswith("async"):
        server = ParameterServer(
            [torch.optim.Adam(model.parameters(), lr=lr)],
            workers,
            {"async-linear": "linear", "async-sqrt": "sqrt"}.get(rule, "auto"),
        )
        replicas = [copy.deepcopy(model) for _ in range(workers)]
    else:
        replicas = [copy.deepcopy(model) for _ in range(workers)]
        optimizers = [torch.optim.Adam(r.parameters(), lr=lr) for r in replicas]
        scaling = "linear" if rule == "local-linear" else "auto"
    curve = []
    for epoch in range(epochs):
        order = torch.randperm(len(x))
        for step in range(steps):
            factor = _schedule((epoch + step / steps) / epochs, warmup)
            batch = order[step * global_batch : (step + 1) * global_batch]
            if rule == "ddp":
                for group in optimizer.param_groups:
                    group["lr"] = lr * factor
                loss = nn.functional.cross_entropy(
                    model(x[batch]).reshape(-1, 10), y[batch].reshape(-1)
                )
                optimizer.zero_grad()
                loss.backward()
                optimizer.step()
                continue
            for k in range(workers):
                part = batch[k * local : (k + 1) * local]
                replica = replicas[k]
                replica.zero_grad()
                out = replica(x[part]).reshape(-1, 10)
                nn.functional.cross_entropy(out, y[part].reshape(-1)).backward()
                if rule.startswith("async"):  # gradient on the parameters pulled last
                    grads = [p.grad for p in replica.parameters()]
                    result = server.push(k, 0, grads, local, global_batch, [lr * factor], 0)
                    with torch.no_grad():
                        for p, value in zip(replica.parameters(), result.params):
                            p.copy_(value)
                else:
                    opt = optimizers[k]
                    for group in opt.param_groups:
                        group["lr"] = lr * factor
                    share = lr_factor(lr_rule(scaling, opt), local * workers / global_batch)
                    with scaled_lr(opt, share):
                        opt.step()
            if (
                rule.startswith("local")
                and (step + 1) % merge_every == 0
                or (rule.startswith("local") and step == steps - 1)
            ):
                with torch.no_grad():
                    for params in zip(*(r.parameters() for r in replicas)):
                        mean = torch.stack([p.data for p in params]).mean(0)
                        for p in params:
                            p.copy_(mean)
        evaluated = model
        if rule != "ddp":
            evaluated = replicas[0]
            if rule.startswith("async"):
                with torch.no_grad():
                    for p, value in zip(evaluated.parameters(), server.pull(0).params):
                        p.copy_(value)
        curve.append(_accuracy(evaluated, *val.tensors))
    return curve


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", choices=RULES, default=list(RULES))
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr-factors", type=float, nargs="+", default=[1.0, 2.0])
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    print("| lr | K | rule | seed | val acc per epoch |\n|---|---|---|---|---|", flush=True)
    for lr_x in args.lr_factors:
        for workers in args.workers:
            for rule in args.rules:
                if rule == "ddp" and workers != args.workers[0]:
                    continue  # DDP does not depend on K
                for seed in args.seeds:
                    curve = simulate(rule, workers, seed, lr=5e-4 * lr_x)
                    accs = " / ".join(f"{a:.3f}" for a in curve)
                    k = "-" if rule == "ddp" else workers
                    print(f"| {5e-4 * lr_x:g} | {k} | `{rule}` | {seed} | {accs} |", flush=True)


if __name__ == "__main__":
    main()
