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

``--grid`` runs issue 41's time-to-accuracy grid (``run_grid``): every mode with its defaults
against DDP on both tasks, 2 and 4 ranks, equal speeds and one 3x slower rank, every seed,
in virtual time (a step of ``b`` samples takes ``cost * b + step_cost``, each all-reduce,
push or merge ``sync_cost`` more):

    python -m lightning_hetero.bench.mode_sim --grid --workers 2 4 --seeds 0 1 2
"""

import argparse
import copy
import heapq
import math
from collections.abc import Callable, Sequence
from dataclasses import dataclass

import torch
from torch import nn
from torch.utils.data import TensorDataset

from lightning_hetero._optim import lr_rule, replica_factor, scaled_lr
from lightning_hetero.bench.workload import ReverseTransformer, reverse_tensors
from lightning_hetero.paramserver import ParameterServer
from lightning_hetero.planning.dual import TimeModel, plan_dual_batch

__all__ = [
    "DIGITS_RULES",
    "GRID_MODES",
    "GRID_TASKS",
    "RULES",
    "run_cell",
    "run_grid",
    "simulate",
    "simulate_digits",
    "target_misses",
    "tta_figures",
]

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
    epoch_average: bool | str = "auto",
) -> list[float]:
    """Validation accuracy (macro average over the 10 classes) after each epoch of ``rule``
    on the benchmark's digits task (the digits CNN, SGD with momentum 0.9) with one emulated
    rank per entry of ``costs``, its time per sample.

    Ranks run in the order their steps end: the first epoch on the uniform plan, the others
    on the speed-proportional one (what the controller converges to), each on its share of
    the epoch's permutation, every gradient on the parameters its last push returned, so
    staleness follows from the speeds. The server is the real ``ParameterServer``, with
    ``epoch_average`` (its average at each epoch's end).

    The ``local`` rules run local mode's shared pool of mega-batches (ten global batches):
    ranks claim their next batch when their last step ends, until the mega-batch is used up,
    then the replicas merge with the real weights (``merge_weights`` or ``sample_weights``)
    and, for ``-outer``, the real outer step at ``outer_lr``."""
    if rule not in DIGITS_RULES:
        raise ValueError(f"unknown digits rule {rule!r}; expected one of {DIGITS_RULES}.")
    _check_costs(costs)
    task = _digits_task(seed, lr, epochs, global_batch)
    if rule == "ddp":
        return _train_ddp(task)
    if rule.startswith("local"):
        outer = outer_lr if rule.endswith("-outer") else None
        return _train_local(task, costs, 0.0, 0.0, rule.startswith("local-prop"), outer)[0]
    plans = _async_plans(costs, len(task.train), global_batch)
    lookahead = "auto" if rule == "async" else False
    return _train_server(task, costs, 0.0, lookahead, plans, epoch_average)[0]


def _check_costs(costs: Sequence[float]) -> None:
    if not costs or not all(math.isfinite(c) and c > 0 for c in costs):
        raise ValueError(f"each rank's time per sample must be a positive number, got {costs}.")


@dataclass
class _Task:
    """A seeded model and its data, the loss, the accuracy and the learning-rate schedule."""

    model: nn.Module
    train: TensorDataset
    val: TensorDataset
    lr: float
    epochs: int
    global_batch: int
    warmup: float | None = None  # the transformer's warm-up and cosine; None: a constant lr

    def loss(self, model: nn.Module, part: torch.Tensor) -> torch.Tensor:
        x, y = self.train.tensors
        out = model(x[part])
        return nn.functional.cross_entropy(out.reshape(-1, 10), y[part].reshape(-1))

    def accuracy(self, model: nn.Module) -> float:
        if self.warmup is None:
            return _macro_accuracy(model, *self.val.tensors)
        return _accuracy(model, *self.val.tensors)  # type: ignore[arg-type]

    def lr_at(self, epoch: int, within: float) -> float:
        """The learning rate ``within`` (a fraction) the way through ``epoch``."""
        if self.warmup is None:
            return self.lr
        return self.lr * _schedule((epoch + within) / self.epochs, self.warmup)


def _digits_task(seed: int, lr: float, epochs: int, global_batch: int) -> _Task:
    """The digits CNN with SGD and momentum 0.9 (``DigitsCNN``), seeded."""
    from lightning_hetero.bench.workload import DigitsCNN, load_digits_tensors

    torch.manual_seed(seed)
    train, val = load_digits_tensors(seed)
    return _Task(DigitsCNN(lr=lr), train, val, lr, epochs, global_batch)


def _reverse_task(
    seed: int,
    lr: float = 5e-4,
    epochs: int = 2,
    global_batch: int = 128,
    train_size: int = 8192,
    val_size: int = 1024,
) -> _Task:
    """The digit-reversing transformer with Adam, warm-up and cosine, seeded."""
    torch.manual_seed(seed)
    train, val = reverse_tensors(seed, train_size, val_size)
    model = ReverseTransformer(lr=lr, train_size=train_size)
    return _Task(model, train, val, lr, epochs, global_batch, model.hparams.warmup)


def _set_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    for group in optimizer.param_groups:
        group["lr"] = lr


def _train_ddp(task: _Task, nudge: float = 0.0, order_seed: int | None = None) -> list[float]:
    """Validation accuracy after each epoch of DDP (one process, the whole global batch);
    ``nudge``: first multiply every initial weight by ``1 + nudge * N(0, 1)`` (its own
    generator: the data order stays DDP's); ``order_seed``: draw each epoch's order from a
    generator seeded with it instead (the same initial weights, another data order)."""
    x = task.train.tensors[0]
    model, size = task.model, len(x)
    if nudge:
        noise = torch.Generator().manual_seed(0)
        with torch.no_grad():
            for param in model.parameters():
                param.mul_(1 + nudge * torch.randn(param.shape, generator=noise))
    orders = None if order_seed is None else torch.Generator().manual_seed(order_seed)
    optimizer = model.configure_optimizers()  # type: ignore[operator]
    curve = []
    for epoch in range(task.epochs):
        order = torch.randperm(size, generator=orders)
        for start in range(0, size, task.global_batch):
            _set_lr(optimizer, task.lr_at(epoch, start / size))
            optimizer.zero_grad()
            task.loss(model, order[start : start + task.global_batch]).backward()
            optimizer.step()
        curve.append(task.accuracy(model))
    return curve


def _sync_times(
    costs: Sequence[float],
    step_cost: float,
    sync_cost: float,
    size: int,
    global_batch: int,
    epochs: int,
    balanced: bool,
) -> list[float]:
    """Virtual time at the end of each epoch of synchronous data parallelism: a step waits
    for its slowest rank, rank ``k`` taking ``costs[k] * b_k + step_cost`` for its ``b_k``
    samples, then for its all-reduce, ``sync_cost``. ``balanced=False`` (DDP): even batches;
    ``True`` (BSP): the uniform plan until the first epoch's early boundary
    (``first_boundary="auto"``, the default; the whole first epoch where it has none), then the
    speed-proportional plan its controller converges to.
    """
    from lightning_hetero.planning.split import proportional_split
    from lightning_hetero.replan import early_boundary_batch

    workers = len(costs)
    uniform = [global_batch / workers] * workers
    proportional = proportional_split([1 / c for c in costs], global_batch, [1] * workers)
    steps = math.ceil(size / global_batch)
    measured_from = early_boundary_batch("auto", steps) or steps  # the first epoch's step
    now, times = 0.0, []
    for epoch in range(epochs):
        for step, start in enumerate(range(0, size, global_batch)):
            late = epoch or step >= measured_from
            plan = proportional if balanced and late else uniform
            part = min(global_batch, size - start) / global_batch  # the last step may be short
            now += max(c * b * part for c, b in zip(costs, plan)) + step_cost + sync_cost
        times.append(now)
    return times


#: A plan for one part of an epoch of the parameter server: each rank's batch size and
#: samples, and the global batch its pushes are a share of (``None``: ``global_batch``, the
#: part's last short step a share of a smaller one). An epoch is one part or several, with
#: every rank waiting for the others between two (a boundary inside the epoch).
_EpochPlan = tuple[list[int], list[int], int | None]


def _async_plans(
    costs: Sequence[float], size: int, global_batch: int
) -> Callable[[int], list[_EpochPlan]]:
    """Async mode's plans: the uniform plan until the first epoch's early boundary
    (``first_boundary="auto"``: 8 steps in, where the epoch has at least 16; the whole first
    epoch where it has none), then the plan in proportion to speed (what the controller
    converges to), each rank on its share of the part's samples."""
    from lightning_hetero.planning.split import proportional_split
    from lightning_hetero.replan import early_boundary_batch

    workers = len(costs)
    uniform = [global_batch // workers] * workers
    proportional = proportional_split([1 / c for c in costs], global_batch, [1] * workers)

    def part(sizes: list[int], samples: int) -> _EpochPlan:
        shares = [samples * b // global_batch for b in sizes]
        shares[-1] = samples - sum(shares[:-1])
        return sizes, shares, None

    def plan(epoch: int) -> list[_EpochPlan]:
        if epoch:
            return [part(proportional, size)]
        early = early_boundary_batch("auto", math.ceil(size / global_batch))
        if early is None:
            return [part(uniform, size)]
        first = early * global_batch
        return [part(uniform, first), part(proportional, size - first)]

    return plan


def _dual_plans(
    costs: Sequence[float], fixed_cost: float, size: int, global_batch: int
) -> Callable[[int], list[_EpochPlan]]:
    """Dual batch's plan from the first epoch (the strategy plans on probe timings before
    it): ``plan_dual_batch_by_speed`` on the cost model's time of each rank (``fixed_cost``
    per step), its defaults
    (half of the ranks small, at least one; ``k = 1.05``; batch shares of ``n * B_L``)."""
    from lightning_hetero.planning.dual import plan_dual_batch_by_speed

    workers = len(costs)
    large = global_batch // workers
    models = [TimeModel(a=c, b=fixed_cost) for c in costs]
    dual = plan_dual_batch_by_speed(models, size, max(workers // 2, 1), large, 1.05, "share")
    return lambda epoch: [(dual.batch_sizes, dual.samples, workers * large)]


def _train_server(
    task: _Task,
    costs: Sequence[float],
    fixed_cost: float,
    lookahead: bool | str,
    plans: Callable[[int], list[_EpochPlan]],
    epoch_average: bool | str = "auto",
) -> tuple[list[float], list[float]]:
    """Async mode (and dual batch, with its plans) on the real ``ParameterServer`` with its
    defaults: accuracy and virtual time at the end of each epoch.

    Ranks push in the order their steps end (a step of ``b`` samples on rank ``k`` takes
    ``costs[k] * b + fixed_cost``, its push included), each on its share of the epoch's
    permutation, every gradient on the parameters its last push returned, so staleness
    follows from the speeds. An epoch's part (``plans``) ends when its last rank's last
    step does (the early boundary waits for every rank); every rank starts the next epoch
    from the server's parameters."""
    x = task.train.tensors[0]
    workers, size = len(costs), len(x)
    optimizer = task.model.configure_optimizers()  # type: ignore[operator]
    server = ParameterServer([optimizer], workers, "auto", lookahead, epoch_average)
    replicas = [copy.deepcopy(task.model) for _ in range(workers)]
    seen = [0] * workers
    curve, times, clock = [], [], 0.0
    for epoch in range(task.epochs):
        order = torch.randperm(size)
        pulled = server.pull(0)  # every rank starts the epoch from the server
        for k, replica in enumerate(replicas):
            _load(replica, pulled.params)
            seen[k] = pulled.version
        begun = 0  # the samples the epoch's earlier parts trained
        for plan in plans(epoch):
            clock = _server_part(
                task, costs, fixed_cost, server, replicas, seen, epoch, order, begun, plan, clock
            )
            begun += sum(plan[1])  # the part's samples
        server.settle()  # the epoch's average (``epoch_average``), as the mode at the epoch end
        evaluated = replicas[0]  # rank 0's BatchNorm statistics, the server's parameters
        _load(evaluated, server.pull(0).params)
        curve.append(task.accuracy(evaluated))
        times.append(clock)
    return curve, times


def _server_part(
    task: _Task,
    costs: Sequence[float],
    fixed_cost: float,
    server: ParameterServer,
    replicas: list[nn.Module],
    seen: list[int],
    epoch: int,
    order: torch.Tensor,
    begun: int,
    plan: _EpochPlan,
    clock: float,
) -> float:
    """One part of an epoch (``_train_server``): the ranks push on the samples
    ``order[begun:]`` as ``plan`` shares them out; returns the virtual time its last step
    ends."""
    workers, size = len(costs), len(order)
    sizes, shares, fixed_total = plan
    starts = [begun + sum(shares[:k]) for k in range(workers)]
    part_size = sum(shares)
    done = [0] * workers
    events = [
        (clock + costs[k] * min(sizes[k], shares[k]) + fixed_cost, k)
        for k in range(workers)
        if shares[k]
    ]
    heapq.heapify(events)
    end = clock
    while events:
        now, k = heapq.heappop(events)
        end = max(end, now)
        part = order[starts[k] + done[k] : starts[k] + min(done[k] + sizes[k], shares[k])]
        replica = replicas[k]
        replica.zero_grad()
        task.loss(replica, part).backward()
        grads = [p.grad for p in replica.parameters()]
        # an epoch's last, smaller step: the rank's part of a smaller global batch
        total = fixed_total or max(len(part), round(len(part) * task.global_batch / sizes[k]))
        # the rank's progress through the part, placed within the epoch
        lr = task.lr_at(epoch, (begun + part_size * done[k] / shares[k]) / size)
        result = server.push(k, 0, grads, len(part), total, [lr], seen[k])
        _load(replica, result.params)
        seen[k] = result.version
        done[k] += len(part)
        if done[k] < shares[k]:
            step = costs[k] * min(sizes[k], shares[k] - done[k]) + fixed_cost
            heapq.heappush(events, (now + step, k))
    return end


def _train_local(
    task: _Task,
    costs: Sequence[float],
    step_cost: float,
    sync_cost: float,
    proportional: bool,
    outer_lr: float | None,
) -> tuple[list[float], list[float]]:
    """Local mode: accuracy and virtual time at the end of each epoch.

    It runs local mode's shared pool of mega-batches (ten global batches): ranks claim their
    next batch when their last step ends (``claim_order``; a step of ``b`` samples on rank
    ``k`` takes ``costs[k] * b + step_cost``), until the mega-batch is used up, then the
    replicas merge (an all-reduce, ``sync_cost``) with the real weights (``sample_weights`` for
    ``proportional``, the default ``local_steps``; else ``merge_weights``, paper 004's equal
    updates on the speed-proportional plan) and, with ``outer_lr``, the real outer step; the
    replicas' optimizer state (momentum) is averaged with the same weights, as the mode's
    default ``merge_optimizer_state=True``."""
    from torch.nn.utils import parameters_to_vector, vector_to_parameters

    from lightning_hetero.localsgd import optimizer_state_tensors
    from lightning_hetero.planning.merge import (
        claim_order,
        merge_weights,
        outer_step,
        sample_weights,
    )
    from lightning_hetero.planning.split import proportional_split

    model, global_batch = task.model, task.global_batch
    workers, size = len(costs), len(task.train)
    replicas = [copy.deepcopy(model) for _ in range(workers)]
    optimizers = [r.configure_optimizers() for r in replicas]  # type: ignore[operator]
    params = [[p for p in r.parameters()] for r in replicas]
    buffers = [[b for b in r.buffers() if b.dtype.is_floating_point] for r in replicas]
    anchor = parameters_to_vector(params[0]).detach().clone()
    velocity: torch.Tensor | None = None
    plan = [global_batch // workers] * workers
    megabatch = 10 * global_batch  # local mode's default
    curve, times, clock = [], [], 0.0
    for epoch in range(task.epochs):
        if epoch and not proportional:  # what the updates controller converges to
            plan = proportional_split([1 / c for c in costs], global_batch, [1] * workers)
        order = torch.randperm(size)
        per_sample = [c + step_cost / b for c, b in zip(costs, plan)]  # a full step's share
        for start in range(0, size, megabatch):
            pool = order[start : start + megabatch]
            claimed, updates, samples = 0, [0] * workers, [0] * workers
            busy = [0.0] * workers
            for k, taken in claim_order(per_sample, plan, len(pool)):  # the merge lines up
                part = pool[claimed : claimed + taken]
                optimizer = optimizers[k]
                _set_lr(optimizer, task.lr_at(epoch, (start + claimed) / size))
                claimed += taken
                factor = replica_factor(lr_rule("auto", optimizer), len(part), sum(plan), workers)
                optimizer.zero_grad()
                task.loss(replicas[k], part).backward()
                with scaled_lr(optimizer, factor):
                    optimizer.step()
                updates[k] += 1
                samples[k] += len(part)
                busy[k] += costs[k] * len(part) + step_cost
            clock += max(busy) + sync_cost
            with torch.no_grad():
                flats = [parameters_to_vector(p) for p in params]
                if proportional:
                    weights = sample_weights(samples, plan).weights
                else:
                    norms = [float(f.norm()) / f.numel() for f in flats]
                    weights = merge_weights(plan, updates, norms).weights
                merged = sum(w * f for w, f in zip(weights, flats))
                assert isinstance(merged, torch.Tensor)
                if outer_lr is not None:
                    merged, velocity = outer_step(anchor, merged, velocity, outer_lr)
                anchor = merged.clone()
                for k in range(workers):
                    vector_to_parameters(merged.clone(), params[k])
                _average_(buffers, weights)
                # the replicas' momentum, as `merge_optimizer_state=True` (the default)
                states = [optimizer_state_tensors([o]) for o in optimizers]
                if all(layout == states[0][1] for _, layout in states):
                    _average_([tensors for tensors, _ in states], weights)
        curve.append(task.accuracy(replicas[0]))
        times.append(clock)
    return curve, times


def _average_(per_replica: Sequence[Sequence[torch.Tensor]], weights: Sequence[float]) -> None:
    """Set each tensor of every replica (``per_replica[k]``, in the same order) to their
    mean weighted by ``weights``: the one-process stand-in for ``weighted_average_``."""
    total = sum(weights)
    for group in zip(*per_replica):
        mean = sum(w * t for w, t in zip(weights, group)) / total
        for t in group:
            t.copy_(mean)


# ------------------------------------------------------------------ time to accuracy grid
#: The grid's control row: DDP again, its initial weights nudged by one part in a million
#: (``RERUN_NUDGE``), judged as a mode that must be no slower than DDP: how far a
#: rounding-level difference moves DDP's own time to accuracy and final accuracy, the
#: spread every mode's single-seed verdict sits on.
CONTROL = "ddp-rerun"
RERUN_NUDGE = 1e-6
#: The second control: DDP from the same initial weights on another data order (each
#: epoch's permutation from a generator seeded ``REORDER_SEED + seed``), judged as
#: ``CONTROL``. Every mode but ``bsp`` consumes the data in an order of its own (the ranks'
#: claims, pushes and merges), so this is the spread their verdicts sit on.
REORDER = "ddp-reorder"
REORDER_SEED = 1000
#: The grid's modes with their defaults; ``ddp`` is the baseline.
GRID_MODES = ("ddp", "bsp", "async", "local", "dual", CONTROL, REORDER)
#: The grid's tasks: the transformer with Adam (2 epochs, global batch 128) and the digits
#: CNN with SGD and momentum 0.9 (8 epochs, global batch 64), as issue 41 measured them.
GRID_TASKS = {
    "transformer": {"lr": 5e-4, "epochs": 2, "global_batch": 128},
    "digits": {"lr": 0.05, "epochs": 8, "global_batch": 64},
}
#: Issue 41's targets with one 3x slower rank: the least DDP time / mode time, every seed
#: (with equal speeds: 1, none slower than DDP).
SLOW_TARGETS = {"bsp": 1.5, "async": 1.2, "local": 1.2, "dual": 1.2}
#: Issue 41's targets at equal epochs: final accuracy at most this many points below DDP's.
EPOCH_POINTS = {"transformer": 1.0, "digits": 2.0}

#: Accuracy and virtual time at the end of each epoch.
Run = tuple[list[float], list[float]]


def _make_task(name: str, seed: int, **overrides: float) -> _Task:
    options = {**GRID_TASKS[name], **overrides}
    if name == "digits":
        return _digits_task(seed, **options)  # type: ignore[arg-type]
    return _reverse_task(seed, **options)  # type: ignore[arg-type]


def run_cell(
    task: str,
    costs: Sequence[float],
    seed: int,
    step_cost: float = 2.0,
    sync_cost: float = 2.0,
    modes: Sequence[str] = GRID_MODES,
    ddp_curve: list[float] | None = None,
    progress: Callable[[], None] | None = None,
    **overrides: float,
) -> dict[str, Run]:
    """Train ``task`` (a key of ``GRID_TASKS``; ``overrides`` change its options) with every
    mode of ``modes`` on ranks whose time per sample is ``costs``; returns each mode's
    accuracy and virtual time at the end of each epoch.

    The cost model: a step of ``b`` samples on rank ``k`` takes ``costs[k] * b + step_cost``,
    and each communication ``sync_cost``: DDP's and BSP's all-reduce after every step (which
    waits for the slowest rank), every push of ``async`` and ``dual``, every merge of
    ``local`` (whose local steps communicate nothing). ``ddp``: even batches; ``bsp``: exact
    DDP (its accuracy), the uniform plan until the first epoch's early boundary (8 steps in)
    and in proportion to speed from there; ``async``, ``local`` and ``dual`` as
    ``_train_server`` and ``_train_local`` say, with their defaults; ``ddp-rerun``
    (``CONTROL``): DDP from nudged initial weights, and ``ddp-reorder`` (``REORDER``): DDP on
    another data order, both at DDP's times. ``ddp_curve``: DDP's
    accuracy, if already known (it depends on neither the ranks nor their speeds)."""
    _check_costs(costs)
    for name, value in (("step_cost", step_cost), ("sync_cost", sync_cost)):
        if not (math.isfinite(value) and value >= 0):
            raise ValueError(f"`{name}` must be a finite number >= 0, got {value}.")
    unknown = set(modes) - set(GRID_MODES)
    if unknown:
        raise ValueError(f"unknown modes {sorted(unknown)}; expected some of {GRID_MODES}.")
    tick = progress or (lambda: None)
    fixed = step_cost + sync_cost  # a push: a step and its round trip
    runs: dict[str, Run] = {}
    for mode in modes:
        spec = _make_task(task, seed, **overrides)
        size, batch, epochs = len(spec.train), spec.global_batch, spec.epochs
        if mode in ("ddp", "bsp", CONTROL, REORDER):
            times = _sync_times(costs, step_cost, sync_cost, size, batch, epochs, mode == "bsp")
            if mode in (CONTROL, REORDER):
                control = (
                    _train_ddp(spec, RERUN_NUDGE)
                    if mode == CONTROL
                    else _train_ddp(spec, order_seed=REORDER_SEED + seed)
                )
                runs[mode] = (control, times)
                tick()
                continue
            if ddp_curve is None:
                ddp_curve = _train_ddp(spec)
            runs[mode] = (list(ddp_curve), times)
        elif mode == "async":
            runs[mode] = _train_server(spec, costs, fixed, "auto", _async_plans(costs, size, batch))
        elif mode == "local":
            runs[mode] = _train_local(spec, costs, step_cost, sync_cost, True, None)
        else:
            plans = _dual_plans(costs, fixed, size, batch)
            runs[mode] = _train_server(spec, costs, fixed, "auto", plans)
        tick()
    return runs


def tta_figures(runs: dict[str, Run], baseline: str = "ddp") -> dict[str, dict[str, float]]:
    """Each run's ``speedup`` (``baseline``'s virtual time to its best accuracy less 1 point
    over this run's; 0: never reached), ``tta_s``, ``epochs_to_target``, ``final_acc`` and
    ``acc_delta`` (final accuracy less ``baseline``'s, in points), as
    ``lightning_hetero.bench.modes.figures`` computes them for real runs."""
    from lightning_hetero.bench._tta import figures

    summaries = {
        name: {"accuracy_curve": [(t, a, math.nan) for a, t in zip(*run)], "train_s": run[1][-1]}
        for name, run in runs.items()
    }
    base = runs[baseline][0]
    out = figures(summaries, max(base) - 0.01, baseline)
    for name, (curve, _) in runs.items():
        out[name]["acc_delta"] = 100 * (curve[-1] - base[-1])
    return out


def target_misses(task: str, mode: str, slow: bool, figures: dict[str, float]) -> list[str]:
    """Which of issue 41's targets one seed's ``figures`` (of ``tta_figures``) miss: the
    time to accuracy (``SLOW_TARGETS`` with a slow rank, else 1) and the final accuracy
    (``EPOCH_POINTS`` below DDP's at most)."""
    if mode == "ddp":
        return []
    misses = []
    least = SLOW_TARGETS.get(mode, 1.0) if slow else 1.0
    if figures["speedup"] < least - 1e-9:
        misses.append(f"time < {least:g}x")
    if figures["acc_delta"] < -EPOCH_POINTS[task]:
        misses.append(f"acc < DDP - {EPOCH_POINTS[task]:g}")
    return misses


def run_grid(
    tasks: Sequence[str] = tuple(GRID_TASKS),
    workers: Sequence[int] = (2, 4),
    seeds: Sequence[int] = (0, 1, 2),
    step_cost: float = 2.0,
    sync_cost: float = 2.0,
    slow_cost: float = 3.0,
    progress: bool = True,
    **overrides: float,
) -> str:
    """The time-to-accuracy grid as a Markdown table: every mode against DDP on ``tasks``,
    ``workers`` ranks, equal speeds (time 1 per sample) and the last rank ``slow_cost``
    times slower, every seed; ``overrides`` change every task's options."""
    from tqdm import tqdm

    settings = [("equal", 1.0), ("slow", slow_cost)]
    total = len(tasks) * len(workers) * len(settings) * len(seeds) * len(GRID_MODES)
    lines = [
        f"Virtual time: a step of b samples takes c * b + {step_cost:g} (c = 1, the slow"
        f" rank's {slow_cost:g}), each all-reduce, push or merge {sync_cost:g} more; the"
        " target is DDP's best accuracy less 1 point. `ddp-rerun`: DDP again from initial"
        f" weights nudged by {RERUN_NUDGE:g} (relative), and `ddp-reorder`: DDP on another"
        " data order, each judged as a mode no slower than DDP.",
        "",
        "| task | K | speeds | mode | DDP time / mode time, seeds "
        + " / ".join(map(str, seeds))
        + " | final acc - DDP's (points) | targets missed |",
        "|---|---|---|---|---|---|---|",
    ]
    ddp_curves: dict[tuple[str, int], list[float]] = {}
    with tqdm(total=total, desc="grid", unit="run", disable=not progress) as bar:
        for task in tasks:
            for k in workers:
                for speeds, cost in settings:
                    costs = [1.0] * (k - 1) + [cost]
                    per_seed = []
                    for seed in seeds:
                        runs = run_cell(
                            task, costs, seed, step_cost, sync_cost,
                            ddp_curve=ddp_curves.get((task, seed)),
                            progress=lambda: bar.update(), **overrides,
                        )  # fmt: skip
                        ddp_curves[task, seed] = runs["ddp"][0]
                        per_seed.append(tta_figures(runs))
                    lines += _grid_rows(task, k, speeds, per_seed)
    return "\n".join(lines) + "\n"


def _grid_rows(
    task: str, workers: int, speeds: str, per_seed: list[dict[str, dict[str, float]]]
) -> list[str]:
    rows = []
    for mode in GRID_MODES:
        figs = [f[mode] for f in per_seed]
        if mode == "ddp":
            reach = " / ".join(f"{f['tta_s']:.0f} (ep {f['epochs_to_target']:.0f})" for f in figs)
            accs = " / ".join(f"{100 * f['final_acc']:.1f}%" for f in figs)
            rows.append(f"| {task} | {workers} | {speeds} | `ddp` | time {reach} | {accs} | |")
            continue
        ratios = " / ".join("never" if f["speedup"] == 0 else f"{f['speedup']:.2f}x" for f in figs)
        deltas = " / ".join(f"{f['acc_delta']:+.1f}" for f in figs)
        misses = sorted({m for f in figs for m in target_misses(task, mode, speeds == "slow", f)})
        rows.append(
            f"| {task} | {workers} | {speeds} | `{mode}` | {ratios} | {deltas} |"
            f" {', '.join(misses) or 'none'} |"
        )
    return rows


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
    parser.add_argument(
        "--grid",
        action="store_true",
        help="the time-to-accuracy grid instead: every mode (ddp, bsp, async, local, dual, and"
        " the control ddp-rerun) with"
        " its defaults on --tasks, --workers ranks, equal speeds and the last rank"
        " --slow-cost times slower, --seeds, in virtual time (a Markdown table)",
    )
    parser.add_argument("--tasks", nargs="+", choices=list(GRID_TASKS), default=list(GRID_TASKS))
    parser.add_argument(
        "--step-cost", type=float, default=2.0, help="the grid's fixed time per step (default 2)"
    )
    parser.add_argument(
        "--sync-cost",
        type=float,
        default=2.0,
        help="the grid's time per all-reduce, push or merge (default 2)",
    )
    parser.add_argument(
        "--slow-cost", type=float, default=3.0, help="the grid's slow rank's time per sample"
    )
    args = parser.parse_args(argv)
    torch.set_num_threads(1)
    if args.grid:
        print(
            run_grid(
                args.tasks,
                args.workers,
                args.seeds,
                args.step_cost,
                args.sync_cost,
                args.slow_cost,
            )  # fmt: skip
        )
        return
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
