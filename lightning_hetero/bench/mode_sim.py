"""Convergence of the modes' update rules in one process, without Lightning or RPC.

``K`` emulated ranks of equal speed take turns: each computes its gradient on the parameters
it last received, so every push is ``K - 1`` server versions stale, as with equal ranks in
async mode. The server is the real ``ParameterServer``;
local SGD steps ``K`` replicas with the real learning-rate rule and averages them every
``merge_every`` steps. The task is the benchmark's digit-reversing transformer (Adam,
warm-up and cosine over the data seen). Much cheaper than ``python -m
lightning_hetero.bench.modes`` (one process, one thread), for the rules' effect alone:

    python -m lightning_hetero.bench.mode_sim --workers 2 4 --seeds 0 1 --lr-factors 1 2

``--digits COST ...`` runs the digits task with SGD and momentum instead (``simulate_digits``),
one rank per cost, ranks of different speeds included:

    python -m lightning_hetero.bench.mode_sim --digits 1 3 --seeds 0 1 2 3 4 5 6 7 8 9
"""

import argparse
import copy
import heapq
import math
from collections.abc import Sequence

import torch
from torch import nn

from lightning_hetero._optim import lr_rule, replica_factor, scaled_lr
from lightning_hetero.bench.workload import ReverseTransformer, reverse_tensors
from lightning_hetero.paramserver import ParameterServer
from lightning_hetero.planning.dual import TimeModel, plan_dual_batch

__all__ = ["DIGITS_RULES", "RULES", "simulate", "simulate_digits"]

#: The compared update rules: ``ddp``; ``async`` with ``lr_scaling`` ``"auto"`` (the
#: measured-noise rule for Adam), ``"sqrt"`` or ``"linear"`` (paper 002's rule); ``local``
#: with ``"auto"`` (square root: ``sqrt(K)`` times ``lr`` per replica at an even split),
#: ``"linear"`` (``lr``) or the square-root rule before issue 32's measurements (``lr``,
#: ``local-lr``); dual batch (``controller="dual"``) with ``"auto"`` (the measured-noise
#: rule for Adam, as async), ``"sqrt"``, ``"linear"`` (``"auto"``'s choice before) or paper
#: 003's rule (``update_factor="ratio"``).
RULES = (
    "ddp", "async", "async-sqrt", "async-linear", "local", "local-linear", "local-lr",
    "dual", "dual-sqrt", "dual-linear", "dual-paper",
)  # fmt: skip
#: The scaling rule of each (``ddp`` and ``dual-paper`` take none).
SCALING = {
    "async": "auto", "async-sqrt": "sqrt", "async-linear": "linear", "local": "auto",
    "local-linear": "linear", "local-lr": "auto", "dual": "auto", "dual-sqrt": "sqrt",
    "dual-linear": "linear",
}  # fmt: skip


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
    train_size: int = 8192,
    val_size: int = 1024,
) -> list[float]:
    """Validation accuracy after each epoch of ``rule`` on ``workers`` emulated ranks
    (``train_size`` and ``val_size`` sequences; the benchmark's task by default)."""
    torch.manual_seed(seed)
    train, val = reverse_tensors(seed, train_size, val_size)
    x, y = train.tensors
    model = ReverseTransformer(lr=lr)
    if rule.startswith("dual"):
        return _simulate_dual(rule, workers, lr, epochs, global_batch, model, train, val)
    steps = len(x) // global_batch  # DDP's steps per epoch
    warmup = model.hparams.warmup  # fraction of training: 50 of DDP's 128 steps by default
    local = global_batch // workers
    if rule == "ddp":
        optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    elif rule.startswith("async"):
        server = ParameterServer(
            [torch.optim.Adam(model.parameters(), lr=lr)], workers, SCALING[rule]
        )
        replicas = [copy.deepcopy(model) for _ in range(workers)]
    else:
        replicas = [copy.deepcopy(model) for _ in range(workers)]
        optimizers = [torch.optim.Adam(r.parameters(), lr=lr) for r in replicas]
        # local-lr: the square-root rule before issue 32's measurements, sqrt(K) times less
        boost = 1 / math.sqrt(workers) if rule == "local-lr" else 1.0
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
                    _load(replica, result.params)
                else:
                    opt = optimizers[k]
                    for group in opt.param_groups:
                        group["lr"] = lr * factor
                    rule_k = lr_rule(SCALING.get(rule, "auto"), opt)
                    share = replica_factor(rule_k, local, global_batch, workers) * boost
                    with scaled_lr(opt, share):
                        opt.step()
            if rule.startswith("local") and ((step + 1) % merge_every == 0 or step == steps - 1):
                with torch.no_grad():
                    for params in zip(*(r.parameters() for r in replicas)):
                        mean = torch.stack([p.data for p in params]).mean(0)
                        for p in params:
                            p.copy_(mean)
        evaluated = model
        if rule != "ddp":
            evaluated = replicas[0]
            if rule.startswith("async"):
                _load(evaluated, server.pull(0).params)
        curve.append(_accuracy(evaluated, *val.tensors))
    return curve


def _load(model: nn.Module, values: Sequence[torch.Tensor]) -> None:
    with torch.no_grad():
        for p, value in zip(model.parameters(), values):
            p.copy_(value)


def _simulate_dual(
    rule: str,
    workers: int,
    lr: float,
    epochs: int,
    global_batch: int,
    model: ReverseTransformer,
    train: torch.utils.data.TensorDataset,
    val: torch.utils.data.TensorDataset,
) -> list[float]:
    """Dual batch size learning on the real plan: the first half of the ranks push batches of
    ``B_L = global_batch / workers``, the others of ``B_L / 2`` (a step costs ``b + 0.12
    B_L`` time units, for which paper 003's planner gives ``B_S = B_L / 2`` at ``k = 1.05``),
    each on its share of every epoch's permutation, in the order their steps end."""
    x, y = train.tensors
    large = global_batch // workers
    time_model = TimeModel(a=1.0, b=0.12 * large)
    factor_rule = "ratio" if rule == "dual-paper" else "share"
    plan = plan_dual_batch(time_model, len(x), workers, workers // 2, large, 1.05, factor_rule)
    optimizer = torch.optim.Adam(model.parameters(), lr=lr)
    # as the strategy does: batch shares of n * B_L under the server's rule, or paper 003's
    # factors alone
    shares = factor_rule == "share"
    server = ParameterServer([optimizer], workers, SCALING[rule] if shares else "none")
    replicas = [copy.deepcopy(model) for _ in range(workers)]
    warmup = model.hparams.warmup
    starts = [sum(plan.samples[:k]) for k in range(workers)]
    curve = []
    for epoch in range(epochs):
        order = torch.randperm(len(x))
        for replica in replicas:  # epoch ends: every rank loads the server's parameters
            _load(replica, server.pull(0).params)
        done = [0] * workers
        events = [(time_model.a * b + time_model.b, k) for k, b in enumerate(plan.batch_sizes)]
        heapq.heapify(events)
        while events:
            now, k = heapq.heappop(events)
            size, share = plan.batch_sizes[k], plan.samples[k]
            begin = starts[k] + done[k]
            part = order[begin : begin + min(size, share - done[k])]
            factor = _schedule((epoch + done[k] / share) / epochs, warmup)
            replica = replicas[k]
            replica.zero_grad()
            out = replica(x[part]).reshape(-1, 10)
            nn.functional.cross_entropy(out, y[part].reshape(-1)).backward()
            grads = [p.grad for p in replica.parameters()]
            if shares:
                result = server.push(k, 0, grads, len(part), workers * large, [lr * factor], 0)
            else:
                result = server.push(
                    k, 0, grads, len(part), len(part), [lr * factor], 0, plan.update_factors[k]
                )
            _load(replica, result.params)
            done[k] += len(part)
            if done[k] < share:
                heapq.heappush(events, (now + time_model.a * size + time_model.b, k))
        _load(model, server.pull(0).params)
        curve.append(_accuracy(model, *val.tensors))
    return curve


#: The digits task's rules: ``ddp``; ``async`` with its defaults (the linear rule for SGD, and
#: ``lookahead="auto"``: on, the optimizer has momentum) and ``async-plain`` (no lookahead);
#: ``local`` with ``local_steps="equal"`` (paper 004: batch sizes follow speed, equal updates)
#: and ``local-prop`` (``"proportional"``: even batches, updates in proportion to speed), each
#: also with the outer optimizer (``-outer``: Nesterov at ``outer_lr``).
DIGITS_RULES = (
    "ddp", "async", "async-plain", "local", "local-outer", "local-prop", "local-prop-outer",
)  # fmt: skip


def simulate_digits(
    rule: str,
    costs: Sequence[float],
    seed: int,
    lr: float = 0.05,
    epochs: int = 6,
    global_batch: int = 128,
    outer_lr: float = 0.7,
) -> list[float]:
    """Validation accuracy (macro average over the 10 classes) after each epoch of ``rule``
    on the benchmark's digits task (the digits CNN, SGD with momentum 0.9) with one emulated
    rank per entry of ``costs``, its time per sample.

    Ranks run in the order their steps end: the first epoch on the uniform plan, the others
    on the speed-proportional one (what the controller converges to), each on its share of
    the epoch's permutation, every gradient on the parameters its last push returned, so
    staleness follows from the speeds. The server is the real ``ParameterServer``.

    The ``local`` rules run local mode's shared pool of mega-batches (ten global batches):
    ranks claim their next batch when their last step ends, until the mega-batch is used up,
    then the replicas merge with the real weights (``merge_weights`` or ``sample_weights``)
    and, for ``-outer``, the real outer step at ``outer_lr``."""
    from lightning_hetero.bench.workload import DigitsCNN, load_digits_tensors
    from lightning_hetero.planning.split import proportional_split

    if rule not in DIGITS_RULES:
        raise ValueError(f"unknown digits rule {rule!r}; expected one of {DIGITS_RULES}.")
    if not costs or not all(math.isfinite(c) and c > 0 for c in costs):
        raise ValueError(f"each rank's time per sample must be a positive number, got {costs}.")
    torch.manual_seed(seed)
    train, val = load_digits_tensors(seed)
    x, y = train.tensors
    model = DigitsCNN(lr=lr)
    workers, size = len(costs), len(x)
    curve = []
    if rule == "ddp":
        optimizer = model.configure_optimizers()
        for _ in range(epochs):
            order = torch.randperm(size)
            for start in range(0, size, global_batch):
                batch = order[start : start + global_batch]
                optimizer.zero_grad()
                nn.functional.cross_entropy(model(x[batch]), y[batch]).backward()
                optimizer.step()
            curve.append(_macro_accuracy(model, *val.tensors))
        return curve
    if rule.startswith("local"):
        return _digits_local(rule, costs, model, train, val, lr, epochs, global_batch, outer_lr)
    lookahead = "auto" if rule == "async" else False
    server = ParameterServer([model.configure_optimizers()], workers, "auto", lookahead)
    replicas = [copy.deepcopy(model) for _ in range(workers)]
    seen = [0] * workers
    plan = [global_batch // workers] * workers
    for epoch in range(epochs):
        if epoch:  # the controller's plan: samples per second of each rank
            plan = proportional_split([1 / c for c in costs], global_batch, [1] * workers)
        order = torch.randperm(size)
        shares = [size * b // global_batch for b in plan]
        shares[-1] = size - sum(shares[:-1])
        starts = [sum(shares[:k]) for k in range(workers)]
        pulled = server.pull(0)  # every rank starts the epoch from the server
        for k, replica in enumerate(replicas):
            _load(replica, pulled.params)
            seen[k] = pulled.version
        done = [0] * workers
        events = [(costs[k] * plan[k], k) for k in range(workers)]
        heapq.heapify(events)
        while events:
            now, k = heapq.heappop(events)
            part = order[starts[k] + done[k] : starts[k] + min(done[k] + plan[k], shares[k])]
            replica = replicas[k]
            replica.zero_grad()
            nn.functional.cross_entropy(replica(x[part]), y[part]).backward()
            grads = [p.grad for p in replica.parameters()]
            # an epoch's last, smaller step: the rank's part of a smaller global batch
            total = max(len(part), round(len(part) * global_batch / plan[k]))
            result = server.push(k, 0, grads, len(part), total, [lr], seen[k])
            _load(replica, result.params)
            seen[k] = result.version
            done[k] += len(part)
            if done[k] < shares[k]:
                heapq.heappush(events, (now + costs[k] * min(plan[k], shares[k] - done[k]), k))
        evaluated = replicas[0]  # rank 0's BatchNorm statistics, the server's parameters
        _load(evaluated, server.pull(0).params)
        curve.append(_macro_accuracy(evaluated, *val.tensors))
    return curve


def _digits_local(
    rule: str,
    costs: Sequence[float],
    model: nn.Module,
    train: torch.utils.data.TensorDataset,
    val: torch.utils.data.TensorDataset,
    lr: float,
    epochs: int,
    global_batch: int,
    outer_lr: float,
) -> list[float]:
    """``simulate_digits`` for the ``local`` rules (see there)."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from lightning_hetero.planning.merge import (
        claim_order,
        merge_weights,
        outer_step,
        sample_weights,
    )
    from lightning_hetero.planning.split import proportional_split

    x, y = train.tensors
    workers, size = len(costs), len(x)
    proportional = rule.startswith("local-prop")
    replicas = [copy.deepcopy(model) for _ in range(workers)]
    optimizers = [r.configure_optimizers() for r in replicas]  # type: ignore[operator]
    params = [[p for p in r.parameters()] for r in replicas]
    buffers = [[b for b in r.buffers() if b.dtype.is_floating_point] for r in replicas]
    anchor = parameters_to_vector(params[0]).detach().clone()
    velocity: torch.Tensor | None = None
    plan = [global_batch // workers] * workers
    megabatch = 10 * global_batch  # local mode's default
    curve = []
    for epoch in range(epochs):
        if epoch and not proportional:  # what the updates controller converges to
            plan = proportional_split([1 / c for c in costs], global_batch, [1] * workers)
        order = torch.randperm(size)
        for start in range(0, size, megabatch):
            pool = order[start : start + megabatch]
            claimed, updates, samples = 0, [0] * workers, [0] * workers
            for k, taken in claim_order(costs, plan, len(pool)):  # the merge lines ranks up
                part = pool[claimed : claimed + taken]
                claimed += taken
                optimizer = optimizers[k]
                factor = replica_factor(lr_rule("auto", optimizer), len(part), sum(plan), workers)
                optimizer.zero_grad()
                nn.functional.cross_entropy(replicas[k](x[part]), y[part]).backward()
                with scaled_lr(optimizer, factor):
                    optimizer.step()
                updates[k] += 1
                samples[k] += len(part)
            with torch.no_grad():
                flats = [parameters_to_vector(p) for p in params]
                if proportional:
                    weights = sample_weights(samples, plan).weights
                else:
                    norms = [float(f.norm()) / f.numel() for f in flats]
                    weights = merge_weights(plan, updates, norms).weights
                merged = sum(w * f for w, f in zip(weights, flats))
                assert isinstance(merged, torch.Tensor)
                if rule.endswith("-outer"):
                    merged, velocity = outer_step(anchor, merged, velocity, outer_lr)
                anchor = merged.clone()
                total = sum(weights)
                averaged = [
                    sum(w * b for w, b in zip(weights, group)) / total for group in zip(*buffers)
                ]
                for k in range(workers):
                    vector_to_parameters(merged.clone(), params[k])
                    for b, value in zip(buffers[k], averaged):
                        b.copy_(value)
        curve.append(_macro_accuracy(replicas[0], *val.tensors))
    return curve


def _macro_accuracy(model: nn.Module, images: torch.Tensor, labels: torch.Tensor) -> float:
    """The real benchmark's ``val_acc`` (torchmetrics' macro-averaged multiclass accuracy)."""
    from torchmetrics.functional.classification import multiclass_accuracy

    model.eval()
    with torch.no_grad():
        predicted = model(images).argmax(-1)
    model.train()
    return float(multiclass_accuracy(predicted, labels, num_classes=10, average="macro"))


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rules", nargs="+", choices=list(dict.fromkeys(RULES + DIGITS_RULES)))
    parser.add_argument("--workers", type=int, nargs="+", default=[2, 4])
    parser.add_argument("--seeds", type=int, nargs="+", default=[0, 1, 2])
    parser.add_argument("--lr-factors", type=float, nargs="+", default=[1.0, 2.0])
    parser.add_argument(
        "--digits",
        type=float,
        nargs="+",
        metavar="COST",
        help="run the digits task (SGD with momentum; rules: ddp, async, async-plain, local,"
        " local-outer, local-prop, local-prop-outer) with one rank per COST, its time per"
        " sample (e.g. 1 3: the second rank 3x slower) instead",
    )
    parser.add_argument(
        "--outer-lr", type=float, default=0.7, help="the digits local rules' -outer lr"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.digits:
        rules = args.rules or list(DIGITS_RULES)
        if set(rules) - set(DIGITS_RULES):
            parser.error(f"the digits task runs the rules {', '.join(DIGITS_RULES)}")
        _digits_table(rules, args.digits, args.seeds, args.outer_lr)
        return
    rules = args.rules or list(RULES)
    if set(rules) - set(RULES):
        parser.error(f"the transformer task runs the rules {', '.join(RULES)}")
    print("| lr | K | rule | seed | val acc per epoch |\n|---|---|---|---|---|", flush=True)
    for lr_x in args.lr_factors:
        for workers in args.workers:
            for rule in rules:
                if rule == "ddp" and workers != args.workers[0]:
                    continue  # DDP does not depend on K
                for seed in args.seeds:
                    curve = simulate(rule, workers, seed, lr=5e-4 * lr_x)
                    accs = " / ".join(f"{a:.3f}" for a in curve)
                    k = "-" if rule == "ddp" else workers
                    print(f"| {5e-4 * lr_x:g} | {k} | `{rule}` | {seed} | {accs} |", flush=True)


def _digits_table(
    rules: Sequence[str], costs: Sequence[float], seeds: Sequence[int], outer_lr: float = 0.7
) -> None:
    print(f"costs per sample {list(costs)}\n| rule | seed | val acc per epoch |\n|---|---|---|")
    for rule in rules:
        finals = []
        for seed in seeds:
            curve = simulate_digits(rule, costs, seed, outer_lr=outer_lr)
            finals.append(curve[-1])
            print(f"| `{rule}` | {seed} | {' / '.join(f'{a:.3f}' for a in curve)} |", flush=True)
        print(f"| `{rule}` | mean | {sum(finals) / len(finals):.3f} (min {min(finals):.3f}) |")


if __name__ == "__main__":
    main()
