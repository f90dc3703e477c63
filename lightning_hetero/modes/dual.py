"""Dual batch size learning (paper 003): the parameter server with two batch sizes.

``n_S`` ranks, the slowest by the time probe, train on a small batch ``B_S``, the others on
``B_L``; each rank's share of the epoch's samples is fixed so that every rank finishes its
epoch together, ``extra_time_ratio`` times the all-``B_L`` epoch but never longer than DDP's
by the probe's fits. The server scales each rank's updates by its model-update factor: by
default the ``lr_scaling`` rule of its batch share of DDP's global batch ``n * B_L``, applied
by the server as in async mode (``"auto"``: the linear rule for SGD, the measured-noise rule for
adaptive optimizers), so each push moves its part of one DDP step; the paper's
rule (``update_factor="ratio"``: full steps for ``B_L``, ``d_S/d_L`` for ``B_S``) takes
about ``n`` times DDP's step per sample.
"""

from typing import Any, ClassVar

import torch
from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader, Sampler

from lightning_hetero.modes.asynchronous import ParameterServerMode
from lightning_hetero.modes.base import TimeProbe
from lightning_hetero.planning import BatchLimits, PlanError
from lightning_hetero.planning.dual import (
    DualBatchController,
    DualBatchPlan,
    TimeModel,
    plan_dual_batch,
    plan_dual_batch_by_speed,
)
from lightning_hetero.sampler import EpochPermutation, PartitionBatchSampler

__all__ = ["DualBatchMode"]


def _smallest(bound: int | list[int] | None) -> int | None:
    """The smallest of per-rank bounds (one int for all ranks, or none)."""
    return min(bound) if isinstance(bound, list) else bound


class DualBatchMode(ParameterServerMode):
    """``mode="async"`` with ``controller="dual"``: a fixed plan of two batch sizes."""

    even_steps: ClassVar[bool] = False  # ranks run different numbers of steps per epoch
    fixed_plan: ClassVar[bool] = True

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._reference: DualBatchPlan | None = None  # the dual plan at input scale 1

    @property
    def dual(self) -> DualBatchController:
        assert isinstance(self.controller, DualBatchController)
        return self.controller

    @classmethod
    def option_text(cls) -> str:
        return "controller='dual'"

    def _shares(self) -> bool:
        """Each push is scaled by its batch share of DDP's step (``update_factor="share"``),
        by the server's ``lr_scaling`` rule; else by paper 003's factor alone."""
        return self.dual.update_factor == "share"

    def _lr_scaling(self) -> bool | str:
        # batch shares: the server's rule of b_k / (n * B_L), the share step_layout reports
        # ("auto": the measured-noise rule for adaptive optimizers, the linear one for SGD);
        # paper 003's factors replace batch-share scaling: the server leaves them alone
        return self.options.lr_scaling if self._shares() else "none"

    def update_factor(self, optimizer: torch.optim.Optimizer) -> float:
        plan = self.dual_plan
        assert plan is not None
        return 1.0 if self._shares() else float(plan.update_factors[self.ctx.rank])

    # ---------------------------------------------------------------- the plan
    def first_plan(self, loader: DataLoader, probe_time: TimeProbe) -> list[int] | None:
        """Time probe batches, then plan ``B_L``/``B_S`` and the per-rank sample shares."""
        ctx = self.ctx
        upper = ctx.plan_state.upper()
        smallest_upper = _smallest(upper)
        large = self.dual.large_batch_size or smallest_upper or loader.batch_size
        if large is None:
            raise ValueError(
                "controller='dual' needs a large batch size: set"
                " DualBatchController(large_batch_size=...), `max_batch_size`, or the training"
                " DataLoader's `batch_size`."
            )
        if smallest_upper is not None and large > smallest_upper:
            raise PlanError(
                f"The large batch size {large} exceeds the per-rank maximum {upper}; lower"
                " `large_batch_size` or raise `max_batch_size`."
            )
        probed = probe_time(large)  # one fit per rank (or one for all: paper 003's plan)
        models = [probed] if isinstance(probed, TimeModel) else list(probed)
        for rank, model in enumerate(models):
            if model.relative_error > 0.1:
                rank_zero_warn(
                    f"controller='dual': rank {rank}'s linear time fit is off by up to"
                    f" {model.relative_error:.0%} on the probe {list(model.samples)}."
                )
        dataset_size = len(loader.dataset)  # type: ignore[arg-type]
        small = self.dual.resolve_small_workers(ctx.world_size)
        dual = self.dual
        if isinstance(probed, TimeModel):
            self._reference = plan_dual_batch(
                probed, dataset_size, ctx.world_size, small, large, dual.extra_time_ratio,
                dual.update_factor,
            )  # fmt: skip
        else:  # the small batches on the slowest ranks, never an epoch slower than DDP's
            self._reference = plan_dual_batch_by_speed(
                models, dataset_size, small, large, dual.extra_time_ratio, dual.update_factor
            )
        return self.rescaled_plan()

    def rescaled_plan(self) -> list[int] | None:
        """The dual plan at the current input scale (hybrid scheme: one per resolution)."""
        reference = self._reference
        assert reference is not None
        state = self.ctx.plan_state
        scale = state.input_scale
        plan = reference
        if scale != 1.0 or state.scaled_global is not None:
            large = state.scaled_global or max(round(reference.large_batch_size / scale), 2)
            upper = state.scaled_upper()
            if state.scaled_global is None and upper is not None:
                large = min(large, _smallest(upper))
            plan = reference.rescaled(large, reference.time_model.scaled(scale))
        self.dual_plan = plan
        sizes = list(plan.batch_sizes)
        state.limits = BatchLimits(sum(sizes), sizes, sizes)
        rank_zero_info(f"hetero: dual batch size plan (input scale {scale:g})\n{plan.table()}")
        return sizes

    def batch_sampler(
        self, epochs: EpochPermutation, plan: list[int], drop_last: bool, lower: int
    ) -> Sampler[list[int]]:
        assert self.dual_plan is not None
        self.sampler = PartitionBatchSampler(
            epochs,
            self.dual_plan.samples,
            self.dual_plan.batch_sizes,
            rank=self.ctx.rank,
            drop_last=drop_last,
            min_batch_size=lower,
        )
        return self.sampler

    def apply_plan(self, plan: list[int], from_step: int | None) -> None:
        raise RuntimeError(
            f"hetero: the dual batch size plan is fixed; the {type(self.controller).__name__}"
            f" controller asked for {plan}."
        )

    def step_layout(self, batch_idx: int) -> tuple[int, int, bool] | None:
        sampler = self.sampler
        if not isinstance(sampler, PartitionBatchSampler):
            return None
        local = sampler.size_at(batch_idx)
        plan = self.dual_plan
        assert plan is not None
        # batch shares: of DDP's global batch n * B_L; paper 003's factors: the server scales
        # by the update factor alone, so the share is the batch itself
        total = plan.world_size * plan.large_batch_size if self._shares() else local
        return local, total, local == sampler.batch_size
