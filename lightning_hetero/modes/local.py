"""Local SGD with shared mega-batches and weighted merges (paper 004)."""

import os
from collections.abc import Callable
from typing import Any, ClassVar

import torch

from lightning_hetero._optim import check_lr_scaling, lr_rule, replica_factor, scaled_lr
from lightning_hetero.cursor import MegaBatchSampler, SharedCursor
from lightning_hetero.localsgd import ReplicaMerger, optimizer_state_tensors, weighted_average_
from lightning_hetero.modes.base import MergeOptions, Mode, ModeOptions, OptionGroup
from lightning_hetero.planning import Controller, check_merge_options, merge_weights
from lightning_hetero.planning.merge import sample_weights
from lightning_hetero.sampler import EpochPermutation

__all__ = ["LocalSGDMode"]


class LocalSGDMode(Mode):
    """``mode="local"``: each rank steps its own replica; replicas merge after each mega-batch.

    Ranks claim batches of their planned size from a shared pool of ``megabatch_size``
    samples (a counter in the process group's store), so a fast rank makes more updates per
    mega-batch. When a mega-batch is used up, the replicas are merged with weights from
    their batch sizes and update counts, and the plan is made again from the update counts
    (``local_steps="equal"``, paper 004: batch sizes follow speed, so every rank makes the
    same number of updates). With ``local_steps="proportional"`` (the default) the batch
    sizes stay (the ``static`` controller) and each rank makes updates in proportion to its
    speed in the same wall time; the merge weighs each replica by its samples. ``outer_lr``
    adds DiLoCo's outer optimizer to the merge.
    """

    name: ClassVar[str] = "local"
    default_controller: ClassVar[str] = "updates"
    even_steps: ClassVar[bool] = False
    option_groups: ClassVar[tuple[type[OptionGroup], ...]] = (MergeOptions,)

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        super().__init__(*args, **kwargs)
        self._cursor: SharedCursor | None = None
        self._run_id = ""
        self._next_merge = 0  # the next mega-batch of the epoch to merge
        self._updates = 0  # this rank's updates in the current mega-batch
        self._samples = 0  # and the samples they trained
        self._restored: dict[str, Any] = {}  # a checkpoint's state, until training starts

    @classmethod
    def check_options(cls, options: ModeOptions, controller: Controller) -> None:
        super().check_options(options, controller)
        if check_lr_scaling(options.lr_scaling) == "noise":
            raise ValueError(
                "lr_scaling='noise' scales pushes by the gradient noise async mode's parameter"
                " server measures; mode='local' steps each replica on its own. Leave"
                " lr_scaling='auto' (the square-root rule for adaptive optimizers) or set"
                " 'sqrt'."
            )
        if options.local_steps == "proportional" and controller.adapts:
            raise ValueError(
                "local_steps='proportional' keeps every rank's batch size and lets each rank"
                " make updates in proportion to its speed; the"
                f" {type(controller).__name__} moves batch sizes. Leave `controller` unset"
                " (static), or set local_steps='equal' (paper 004's equal updates) with it."
            )

    @classmethod
    def controller_name(cls, options: ModeOptions) -> str:
        return "static" if options.local_steps == "proportional" else cls.default_controller

    @classmethod
    def other_boundaries(cls) -> str:
        return " and after every mega-batch"

    def setup_environment(self) -> None:
        ctx = self.ctx
        self._cursor = SharedCursor.connect(ctx.main_address, ctx.main_port)
        self._run_id = str(ctx.comm.broadcast_objects([os.urandom(6).hex()])[0])

    def batch_sampler(
        self, epochs: EpochPermutation, plan: list[int], drop_last: bool, lower: int
    ) -> MegaBatchSampler:
        assert self._cursor is not None
        options = self.options
        megabatch = options.megabatch_size or 10 * sum(plan)
        check_merge_options(
            options.delta, options.gamma, options.perturb_threshold, megabatch, sum(plan)
        )
        self.sampler = MegaBatchSampler(
            epochs,
            self._cursor,
            plan[self.ctx.rank],
            megabatch,
            self._run_id,
            min_batch_size=lower,
        )
        return self.sampler

    def apply_plan(self, plan: list[int], from_step: int | None) -> None:
        assert isinstance(self.sampler, MegaBatchSampler)
        self.sampler.set_batch_size(plan[self.ctx.rank])  # from the next claim

    def on_train_start(self) -> None:
        ctx = self.ctx
        module = ctx.module
        for tensor in [*module.parameters(), *module.buffers()]:
            ctx.comm.broadcast_tensor(tensor.data)
        self.merger = ReplicaMerger(module, ctx.rank, self.options.gamma, self.options.outer_lr)
        if self._restored:  # a resumed run: the merges' momentum goes on
            self.merger.load_state_dict(self._restored["merger"])
            self._restored = {}

    def step_samples(self, batch_idx: int) -> int | None:
        # the next batch's tag, left in place: `step_layout` consumes it at the step's start
        sampler = self.sampler
        if not isinstance(sampler, MegaBatchSampler) or not sampler.tags:
            return None
        return sampler.tags[0].size

    def step_layout(self, batch_idx: int) -> tuple[int, int, bool] | None:
        sampler = self.sampler
        if not isinstance(sampler, MegaBatchSampler):
            return None
        megabatch, local = sampler.tags.popleft()
        while self._next_merge < megabatch:
            self._merge_megabatch()
        self._updates += 1
        self._samples += local
        plan = self.ctx.plan_state.batch_sizes
        return local, sum(plan), local == plan[self.ctx.rank]

    def optimizer_step(self, optimizer: torch.optim.Optimizer, run: Callable[[], Any]) -> Any:
        # a merge moves the model by 1/K of each replica's step: K times the factor of an
        # async push of b_k samples (linear: 1 at an even split, paper 004; square root for
        # adaptive optimizers: sqrt(K) there, see replica_factor)
        local, total = self.share
        rule = lr_rule(self.options.lr_scaling, optimizer)
        factor = replica_factor(rule, local, total, self.ctx.world_size)
        with scaled_lr(optimizer, factor):
            return super().optimizer_step(optimizer, run)

    # ---------------------------------------------------------------- merges
    def _merge_megabatch(self) -> None:
        """Merge the replicas after mega-batch ``_next_merge`` and re-plan (every rank)."""
        assert self.merger is not None and self.replan is not None
        ctx = self.ctx
        state, layout = [], [0.0, 0.0, 0.0]
        if self.options.merge_optimizer_state:
            state, layout = optimizer_state_tensors(ctx.optimizers)
        own = [self._updates, self.merger.norm_per_parameter(), self._samples, *layout]
        rows = ctx.comm.gather_rows(own)
        updates = [int(row[0]) for row in rows]
        plan = ctx.plan_state.batch_sizes
        if self.options.local_steps == "proportional":
            weights = sample_weights([int(row[2]) for row in rows], plan)
        else:
            weights = merge_weights(
                plan,
                updates,
                [row[1] for row in rows],
                delta=self.options.delta,
                threshold=self.options.perturb_threshold,
            )
        self.merger.merge(weights.weights)
        # the optimizers' state (momentum) with the same weights, where every rank holds the
        # same tensors (a rank that has not stepped every parameter yet holds fewer)
        if state and all(row[3:] == layout for row in rows):
            weight = float(weights.weights[ctx.rank])
            weighted_average_(state, weight, float(sum(weights.weights)))
        self.merges.append(
            {
                "epoch": ctx.epoch,
                "megabatch": self._next_merge,
                "batch_sizes": plan,
                "updates": updates,
                "weights": weights.weights,
                "perturbed": weights.perturbed,
            }
        )
        self._next_merge += 1
        self._updates = self._samples = 0
        self.replan(updates)

    def _finish_epoch(self) -> None:
        """Merge the mega-batches of this epoch not merged yet (every rank)."""
        if not isinstance(self.sampler, MegaBatchSampler):
            return
        while self._next_merge < self.sampler.num_megabatches:
            self._merge_megabatch()

    def on_train_epoch_start(self) -> None:
        self._next_merge = 0  # a new epoch's mega-batches start at 0
        self._updates = self._samples = 0

    def on_train_epoch_end(self) -> bool:
        self._finish_epoch()
        return False  # re-planned at each merge

    def on_validation_start(self, epoch_end: bool = False) -> None:
        self._finish_epoch()  # validate the merged model

    # ---------------------------------------------------------------- checkpoints
    def state_dict(self) -> dict[str, Any]:
        # the outer optimizer's momentum and gamma's previous model live in the merger
        if self._restored or self.merger is None:
            return dict(self._restored)
        return {"merger": self.merger.state_dict()}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        # Lightning restores checkpoints before training starts, when the merger is made
        self._restored = dict(state)
