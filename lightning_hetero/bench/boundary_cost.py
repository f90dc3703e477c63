"""What one re-planning boundary costs, as a function of the number of ranks K.

    python -m lightning_hetero.bench --boundary [--repeats 7]

A boundary is one all-gather of each rank's report (a row of a few floats), then, on
every rank, reading the rows, the controller's decision, applying the plan and recording
the history entry. The all-gather is timed for real on gloo with K processes on this
machine (small K only: the processes share its cores); the rest is timed for large K with
the real ``Replanner`` around a stand-in for the collective,
fed rows of OmniLearn's HL2 mix of speeds.
"""

import time
from collections.abc import Sequence
from typing import Any

import torch

from lightning_hetero.bench._format import spread
from lightning_hetero.collectives import Collectives
from lightning_hetero.context import RunContext
from lightning_hetero.plan_state import PlanState
from lightning_hetero.planning import (
    HETEROGENEITY_LEVELS,
    BatchLimits,
    Controller,
    make_controller,
)
from lightning_hetero.replan import RankReport, Replanner, plan_checksum

__all__ = ["boundary_table", "gather_s", "replan_s"]

_PER_RANK = 32


class _Gathered(Collectives):
    """One rank's collectives whose all-gather returns prepared rows."""

    rows: list[list[float]] = []

    def gather_rows(self, values: Sequence[float]) -> list[list[float]]:
        return self.rows

    def broadcast_ints(self, values: Sequence[int]) -> list[int]:
        return list(values)


class _Mode:
    """The mode's side of a boundary: a plan change takes effect at once."""

    fixed_plan = False
    steps_together = True  # a BSP boundary's
    sampler = object()

    def __init__(self, controller: Controller) -> None:
        self.controller = controller

    def bind(self, context: RunContext, replan: Any) -> None:
        pass

    def drawn_steps(self) -> int:
        return 1

    def boundary_stats(self) -> dict[str, Any]:
        return {}

    def apply_plan(self, plan: list[int], from_step: int | None) -> None:
        pass


def _replanner(controller: str, world_size: int) -> Replanner:
    """A re-planner bound to one rank of ``world_size`` whose gather returns prepared rows."""
    plan = [_PER_RANK] * world_size
    speeds = HETEROGENEITY_LEVELS["HL2"]
    comm = _Gathered(0, world_size, torch.device("cpu"))
    check = plan_checksum(plan)
    comm.rows = [
        RankReport(_PER_RANK, 0.01 * _PER_RANK / speeds[k % 4], 0.0, 5, 1, 0.5, 0.5, 0.5, check)
        .row()
        for k in range(world_size)
    ]  # fmt: skip
    state = PlanState(plan=plan, limits=BatchLimits.build(world_size, sum(plan)))
    replanner = Replanner(_Mode(make_controller(controller)), smoothing=0.0, adjust_every=1)
    replanner.bind(RunContext.single(state, world_size=world_size, comm=comm))
    return replanner


def replan_s(controller: str, world_size: int, repeats: int = 7) -> list[float]:
    """Seconds of one boundary without its collective (read, decide, apply, record), from a
    uniform plan that the controller changes; one figure per repeat."""
    times = []
    for _ in range(repeats):
        replanner = _replanner(controller, world_size)
        replanner.ctx.timer._pending.append((_PER_RANK, 0.0, 0.01, (), 0.0, True, 0))
        start = time.perf_counter()
        replanner.boundary(0, 1)
        times.append(time.perf_counter() - start)
    return times


def _gather_worker(rank: int, world_size: int, port: int, calls: int, out: Any) -> None:
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size
    )
    comm = Collectives(rank, world_size, torch.device("cpu"))
    row = RankReport(_PER_RANK, 0.01, 0.0, 5, 1, 0.5, 0.5, 0.5, 7).row()
    times = []
    for _ in range(calls):
        dist.barrier()
        start = time.perf_counter()
        comm.gather_rows(row)
        times.append(time.perf_counter() - start)
    if rank == 0:
        out.put(times)
    dist.destroy_process_group()


def gather_s(world_size: int, calls: int = 200) -> list[float]:
    """Seconds of each of ``calls`` boundary all-gathers on gloo, ``world_size`` processes
    on this machine, as rank 0 sees them (each after a barrier, so skew is not counted)."""
    import socket

    import torch.multiprocessing as mp

    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    context = mp.get_context("spawn")
    out = context.SimpleQueue()
    workers = [
        context.Process(target=_gather_worker, args=(rank, world_size, port, calls, out))
        for rank in range(world_size)
    ]
    for worker in workers:
        worker.start()
    times = out.get()
    for worker in workers:
        worker.join()
    return times[calls // 10 :]  # the first calls set up connections


def boundary_table(
    controllers: Sequence[str] = ("proportional", "static"),
    sizes: Sequence[int] = (2, 4, 8, 64, 1024, 4096),
    gather_sizes: Sequence[int] = (2, 4, 8),
    repeats: int = 7,
) -> str:
    """Markdown: per K, the all-gather (measured where K processes fit this machine) and the
    rest of a boundary per controller, min / median / max microseconds."""
    header = ["K", "all-gather (us, gloo, this machine)"]
    header += [f"read + decide + apply + record, {name} (us)" for name in controllers]
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    for world_size in sizes:
        gather = spread(gather_s(world_size), ".0f", 1e6) if world_size in gather_sizes else "-"
        cells = [spread(replan_s(name, world_size, repeats), ".0f", 1e6) for name in controllers]
        lines.append("| " + " | ".join([str(world_size), gather, *cells]) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(boundary_table())
