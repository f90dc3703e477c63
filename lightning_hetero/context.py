"""What a run's parts share, made once when the strategy sets up its environment.

The re-planner, the training mode and the probes get one
[`RunContext`][lightning_hetero.context.RunContext] instead of the
strategy: this rank's place in the job, its device, one collectives object, the step timer,
the plan state, the module and its optimizers, and where training is (epoch and global step). As
torch.distributed's ``Join`` takes a process group and a device rather than the trainer,
nothing here reaches back into Lightning, and a test builds a real context for one process
with [`RunContext.single`][lightning_hetero.context.RunContext.single].
"""

from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any, Protocol, runtime_checkable

import torch
import torch.distributed as dist

from lightning_hetero._comm import HostStepTimer
from lightning_hetero.collectives import Collectives
from lightning_hetero.plan_state import PlanState

__all__ = ["RunContext", "StepLayout"]


@runtime_checkable
class StepLayout(Protocol):
    """What the package's strategies (``HeteroEngine``) tell callbacks about their steps
    (``Throttle``); here, so that a callback checks for it without importing the engine,
    which imports the callbacks."""

    #: Samples of the micro-batch running now (``None`` outside micro-batched steps).
    micro_batch_samples: int | None

    def step_samples(self, batch_idx: int) -> int | None:
        """The samples the plan gives this rank in step ``batch_idx`` of the epoch (``b_k``);
        ``None`` where the mode cannot tell before the step."""


def _start() -> tuple[int, int]:
    return 0, 0


@dataclass(eq=False)
class RunContext:
    """One rank's run, as the re-planner, the mode and the probes see it.

    Args:
        rank: this process's global rank.
        world_size: number of ranks.
        local_rank: this process's rank on its host.
        device: the rank's root device (where its model and collective tensors live).
        comm: the collectives on the default process group (one object for the run).
        timer: times each training step and the waiting inside it.
        plan_state: the plan, its bounds and what it was made from.
        main_address: the job's main node address (``MASTER_ADDR``): where the parameter
            server and local mode's store listen.
        main_port: the job's main port (``MASTER_PORT``).
        devices: the devices of this host's ranks (ranks sharing a GPU share its memory).
        module: the ``LightningModule`` being trained (``None`` for a bare strategy).
        optimizers: its optimizers (filled in once the strategy has built them).
        position: returns ``(epoch, global step)`` now, as the trainer counts them.
    """

    rank: int
    world_size: int
    local_rank: int
    device: torch.device
    comm: Collectives
    timer: HostStepTimer
    plan_state: PlanState
    main_address: str = "127.0.0.1"
    main_port: int = 29500
    devices: list[torch.device] = field(default_factory=list)
    module: Any = None
    optimizers: list[torch.optim.Optimizer] = field(default_factory=list)
    position: Callable[[], tuple[int, int]] = _start

    @classmethod
    def single(
        cls,
        plan_state: PlanState | None = None,
        timer: HostStepTimer | None = None,
        device: torch.device | str = "cpu",
        timeout: timedelta | None = None,
        **fields: Any,
    ) -> "RunContext":
        """A context for one process on ``device`` (tests, tools); ``fields`` set the rest."""
        device = torch.device(device)
        return cls(
            rank=fields.pop("rank", 0),
            world_size=fields.pop("world_size", 1),
            local_rank=fields.pop("local_rank", 0),
            device=device,
            comm=fields.pop("comm", None) or Collectives(0, 1, device, timeout),
            timer=timer or HostStepTimer(),
            plan_state=plan_state or PlanState(),
            **fields,
        )

    @property
    def epoch(self) -> int:
        """The current epoch, as the trainer counts it."""
        return self.position()[0]

    @property
    def global_step(self) -> int:
        """The optimizer steps taken so far (the trainer's ``global_step``); a "step" without
        ``global`` in this package is a training batch's index within its epoch."""
        return self.position()[1]

    def barrier(self, name: str) -> None:
        """Wait until every rank gets here; a failure names ``name`` and this rank."""
        if not self.comm.distributed:
            return
        with self.comm.guarded(f"the barrier {name!r}"):
            if self.device.type == "cuda" and dist.get_backend() == "nccl":
                dist.barrier(device_ids=[self.device.index or 0])
            else:
                dist.barrier()
