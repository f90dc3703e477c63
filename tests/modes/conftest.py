"""A real run context for a mode's unit tests: the mode built from its registry and bound to a
:class:`~lightning_hetero.context.RunContext` as the engine binds it, and, where a test
communicates, a gloo process group of one rank as torchrun would make it."""

import socket
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import pytest
import torch.distributed as dist

from lightning_hetero._comm import HostStepTimer
from lightning_hetero.context import RunContext
from lightning_hetero.modes import Mode, ModeOptions, build_mode
from lightning_hetero.plan_state import PlanState

ADDRESS = "127.0.0.1"


def bound(
    name: str,
    plan: list[int],
    *,
    world_size: int = 1,
    controller: Any = None,
    timer: HostStepTimer | None = None,
    modes: dict[str, type[Mode]] | None = None,
    port: int = 29500,
    module: Any = None,
    **options: Any,
) -> tuple[Mode, list[list[int] | None]]:
    """Mode ``name`` of rank 0 in a run of ``world_size`` ranks under ``plan``, and the list
    its re-planning calls land in (one entry per call: the update counts it passed)."""
    mode = build_mode(name, controller, 0.05, ModeOptions(**options), modes=modes)
    state = PlanState()
    state.plan = list(plan)
    ctx = RunContext.single(
        state, timer, world_size=world_size, main_address=ADDRESS, main_port=port, module=module
    )
    replans: list[list[int] | None] = []
    mode.bind(ctx, replans.append)
    return mode, replans


@pytest.fixture
def group() -> Iterator[int]:
    """A gloo process group of one rank; yields the port its store serves (MASTER_PORT)."""
    with socket.socket() as probe:
        probe.bind((ADDRESS, 0))
        port = probe.getsockname()[1]
    if dist.is_initialized():
        # an earlier in-process fit's group (Lightning's teardown leaves the default group)
        dist.destroy_process_group()
    store = dist.TCPStore(ADDRESS, port, 1, is_master=True, timeout=timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=0, world_size=1)
    try:
        yield port
    finally:
        dist.destroy_process_group()
