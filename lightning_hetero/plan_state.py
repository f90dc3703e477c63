"""The plan and everything it is made from, in one pure object (numbers in, plan out).

``PlanState`` keeps the user's options (the initial plan, the global batch, the bounds)
apart from what a run learns (the plan in force, the limits, measured capacities and memory
bounds, a plan restored from a checkpoint, the input scale). The strategy asks it for the
first plan when the training data is loaded, and hands it every later plan.
"""

import math
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Literal

from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_warn

from lightning_hetero.planning import BatchLimits, PlanError, check_plan, proportional_split
from lightning_hetero.planning.split import expand_bound, is_count

__all__ = ["INITIAL_PLANS", "PlanState", "check_plan_options"]

INITIAL_PLANS = ("uniform", "cores", "flops")


def check_plan_options(
    batch_sizes: str | list[int],
    global_batch_size: int | None,
    min_batch_size: int | None,
    max_batch_size: int | list[int] | str | None,
) -> str | list[int]:
    """Refuse bad plan options at construction; returns ``batch_sizes`` (checked)."""
    if min_batch_size is not None and not is_count(min_batch_size):
        raise ValueError(
            f"`min_batch_size` must be an integer >= 1 or None, got {min_batch_size!r}."
        )
    lowest = min_batch_size or 1
    if isinstance(max_batch_size, str) and max_batch_size != "auto":
        raise ValueError(
            f"`max_batch_size` must be an integer, a list, 'auto' or None, got {max_batch_size!r}."
        )
    uppers = [max_batch_size] if isinstance(max_batch_size, int) else max_batch_size
    if isinstance(uppers, list) and any(hi < lowest for hi in uppers):
        raise ValueError(
            f"`min_batch_size` ({min_batch_size}) must not exceed `max_batch_size`"
            f" ({max_batch_size})."
        )
    if global_batch_size is not None and global_batch_size < 1:
        raise ValueError(f"`global_batch_size` must be >= 1, got {global_batch_size}.")
    if isinstance(batch_sizes, str):
        if batch_sizes not in INITIAL_PLANS:
            raise ValueError(
                f"Unknown initial plan {batch_sizes!r}; expected one of {list(INITIAL_PLANS)}"
                " or a list with one batch size per rank."
            )
        return batch_sizes
    size = len(batch_sizes)
    return check_plan(
        batch_sizes,
        size,
        total=global_batch_size,
        lower=[lowest] * size,
        upper=expand_bound(max_batch_size, size, sum(batch_sizes))
        if max_batch_size not in (None, "auto")
        else None,
    )


@dataclass
class PlanState:
    """Options of the plan (first four fields) and what a run learns about it (the rest).

    Args:
        initial: ``"uniform"``, ``"cores"``, ``"flops"`` or one batch size per rank.
        global_batch_size: ``B``, or ``None`` for the explicit plan's sum or the loader's
            batch size times the world size.
        min_batch_size: the smallest batch of any rank, or ``None`` for ``default_min``.
        max_batch_size: the largest batch of a rank (one for all, one per rank), ``"auto"``
            (``measured_max`` once the memory probe ran) or ``None``.
    """

    initial: str | list[int] = "uniform"
    global_batch_size: int | None = None
    min_batch_size: int | None = None
    max_batch_size: int | list[int] | Literal["auto"] | None = None
    #: ``min_batch_size``'s default for this model (2 with BatchNorm layers, else 1).
    default_min: int = 1
    #: The plan in force, one batch size per rank (``None`` until the first plan).
    plan: list[int] | None = None
    #: The global batch and per-rank bounds of ``plan``.
    limits: BatchLimits | None = None
    #: Per-rank capacities of a ``"cores"``/``"flops"`` initial plan, once measured.
    capacities: list[float] | None = None
    #: Per-rank maximums measured by ``max_batch_size="auto"`` (at input scale 1).
    measured_max: list[int] | None = None
    restored: list[int] | None = None
    restored_weights: list[float] | None = None
    input_scale: float = 1.0
    #: A global batch set with the input scale (``None``: derived from the scale).
    scaled_global: int | None = None
    #: The global batch at input scale 1, known once the training loader was seen.
    base_global: int | None = None
    rescale_pending: bool = field(default=False)
    #: Loader batches of the Trainer's ``accumulate_grad_batches`` planned as one global batch
    #: (set at each fit's set-up; 1: none, see ``microbatch.converted_accumulation``).
    accumulation: int = 1

    # ---------------------------------------------------------------- bounds
    @property
    def batch_sizes(self) -> list[int]:
        """The plan in force, else an explicit initial plan, else nothing."""
        if self.plan is not None:
            return list(self.plan)
        return list(self.initial) if isinstance(self.initial, list) else []

    def lower(self) -> int:
        """``min_batch_size``, or its default for this model."""
        return self.min_batch_size if self.min_batch_size is not None else self.default_min

    def upper(self) -> int | list[int] | None:
        """Per-rank maximums: as given, or as measured by ``max_batch_size="auto"``."""
        if self.max_batch_size != "auto":
            return self.max_batch_size
        return self.measured_max  # None until measured

    def scaled_upper(self) -> int | list[int] | None:
        """Per-rank maximums at the current input scale (memory per sample follows it)."""
        upper = self.upper()
        if self.max_batch_size == "auto" and isinstance(upper, list) and self.input_scale != 1:
            return [max(1, math.floor(b / self.input_scale)) for b in upper]
        return upper

    def check_world(self, world_size: int) -> None:
        """Refuse an explicit plan or a global batch that cannot serve ``world_size`` ranks."""
        if isinstance(self.initial, list) and len(self.initial) != world_size:
            raise PlanError(
                f"`batch_sizes` has {len(self.initial)} entries but there are"
                f" {world_size} ranks: give one batch size per rank."
            )
        if self.global_batch_size is not None or isinstance(self.initial, list):
            total = self.global_batch_size or sum(self.initial)
            BatchLimits.build(world_size, total, self.lower(), self.upper())

    def global_batch(self, loader_batch_size: int | None, world_size: int) -> int:
        """``B`` at input scale 1: as given, the explicit plan's sum, or the loader's times K
        (and times the accumulation the strategy runs as one step)."""
        if self.global_batch_size is not None:
            return self.global_batch_size
        if isinstance(self.initial, list):
            return sum(self.initial)
        if loader_batch_size is None:
            raise ValueError("Set `global_batch_size` or the training DataLoader's `batch_size`.")
        return loader_batch_size * world_size * self.accumulation

    def scaled_limits(self, world_size: int) -> BatchLimits:
        """The limits at the current input scale: see ``HeteroStrategy.set_input_scale``."""
        assert self.base_global is not None
        upper = self.scaled_upper()
        total = self.scaled_global
        if total is None:
            total = round(self.base_global / self.input_scale)
            if self.input_scale != 1:  # a derived batch fits: it gives every rank its minimum
                lowest = sum(expand_bound(self.lower(), world_size, 1))
                if total < lowest:
                    rank_zero_warn(
                        f"hetero: input scale {self.input_scale:g} makes the global batch"
                        f" {total}, below the per-rank minimums' sum; using {lowest}."
                    )
                    total = lowest
                if upper is not None:
                    total = min(total, sum(expand_bound(upper, world_size, total)))
        try:
            return BatchLimits.build(world_size, total, self.lower(), upper)
        except PlanError as err:
            if self.max_batch_size == "auto":
                raise PlanError(
                    f"max_batch_size='auto' measured per-rank maximums {upper}; {err} Lower the"
                    " global batch size, or free memory on the ranks."
                ) from None
            if self.min_batch_size is None and self.lower() > 1:
                raise PlanError(
                    f"{err} The model has BatchNorm layers, which cannot train on a batch of one,"
                    " so every rank gets at least 2 samples (`min_batch_size` defaults to 2 for"
                    f" such models): raise the global batch size to at least {2 * world_size}"
                    " (the training DataLoader's `batch_size`, or `global_batch_size`)."
                ) from None
            lowest = sum(expand_bound(self.lower(), world_size, 1))
            if total < lowest:  # say where the global batch came from, not a derived bound
                ranks = f"{world_size} rank{'s' if world_size != 1 else ''}"
                source = (
                    "`global_batch_size`"
                    if self.global_batch_size is not None
                    else f"the training DataLoader's `batch_size` times {ranks}"
                    + (
                        f" times `accumulate_grad_batches={self.accumulation}`"
                        if self.accumulation > 1
                        else ""
                    )
                )
                raise PlanError(
                    f"The global batch of {total} samples ({source}) cannot give each of"
                    f" {ranks} its `min_batch_size` ({self.lower()}): that needs at"
                    f" least {lowest}. Raise the DataLoader's `batch_size` or"
                    " `global_batch_size`, or lower `min_batch_size`."
                ) from None
            raise

    # ---------------------------------------------------------------- plans
    def provisional(self, loader_batch_size: int | None, world_size: int) -> list[int]:
        """An even split of this run's global batch, until the first plan is made."""
        self.base_global = self.global_batch(loader_batch_size, world_size)
        limits = self.scaled_limits(world_size)
        return proportional_split(
            [1.0] * world_size, limits.global_batch_size, limits.min_batch_size
        )

    def resolve(self, loader_batch_size: int | None, world_size: int) -> list[int]:
        """The first plan: a restored one, else the initial plan, within the limits."""
        initial = self.initial
        self.base_global = self.global_batch(loader_batch_size, world_size)
        limits = self.limits = self.scaled_limits(world_size)
        total, lower, upper = limits.global_batch_size, limits.min_batch_size, limits.max_batch_size
        if self.restored is not None:
            restored = self.restored
            if len(restored) == world_size and sum(restored) == total:
                return check_plan(restored, world_size, total, lower, upper)
            if len(restored) == world_size:
                # another global batch (e.g. another input scale): keep the saved proportions
                rank_zero_info(
                    f"hetero: the checkpoint's plan {restored} sums to {sum(restored)}; this run's"
                    f" global batch is {total}: splitting it in the same proportions."
                )
                return proportional_split(restored, total, lower, upper)
            weights = self.restored_weights
            if weights is not None and len(weights) == world_size:
                return proportional_split(weights, total, lower, upper)  # the callback warned
            rank_zero_warn(
                f"The checkpoint's plan {restored} does not fit {world_size} ranks and a global"
                f" batch of {total}; starting again from batch_sizes={initial!r}."
            )
        if isinstance(initial, list):
            if total != self.base_global:  # another input scale: the same proportions
                return proportional_split(initial, total, lower, upper)
            return check_plan(initial, world_size, total, lower, upper)
        if initial == "uniform":
            return proportional_split([1.0] * world_size, total, lower, upper)
        assert self.capacities is not None
        return proportional_split(self.capacities, total, lower, upper)

    def rescaled(self, world_size: int) -> list[int]:
        """The plan in force, rescaled to the input scale set since the last loader."""
        limits = self.limits = self.scaled_limits(world_size)
        return proportional_split(
            self.batch_sizes,
            limits.global_batch_size,
            limits.min_batch_size,
            limits.max_batch_size,
        )

    def checked(self, batch_sizes: Sequence[int], world_size: int) -> list[int]:
        """``batch_sizes`` if it fits the limits in force (raises ``PlanError`` otherwise)."""
        assert self.limits is not None
        limits = self.limits
        return check_plan(
            batch_sizes,
            world_size,
            limits.global_batch_size,
            limits.min_batch_size,
            limits.max_batch_size,
        )

    def restore(self, batch_sizes: Sequence[int], weights: Sequence[float] | None = None) -> None:
        """Start (or continue) from ``batch_sizes``; ``weights`` split a world of another size."""
        self.restored = [int(b) for b in batch_sizes]
        self.restored_weights = None if weights is None else [float(w) for w in weights]
        self.plan = None  # made again from the next training loader

    def set_input_scale(self, scale: float, global_batch_size: int | None) -> bool:
        """Record a new input scale; ``True`` when a plan in force must be rescaled.

        From the next training loader the global batch is ``global_batch_size`` or, by
        default, the planned-for global batch divided by ``scale`` and capped by what fits:
        maximums measured by ``max_batch_size="auto"`` scale by ``1 / scale`` (memory per
        sample follows the input size; given maximums stay as they are), and the plan in force
        is rescaled in proportion. With ``controller="dual"`` the batch is the large batch
        ``B_L``, the time model's per-sample cost scales by ``scale`` and ``B_S`` is planned
        again (paper 003's hybrid scheme); the per-rank sample shares stay.
        """
        if not (math.isfinite(scale) and scale > 0):
            raise ValueError(f"`scale` must be a finite number > 0, got {scale}.")
        if global_batch_size is not None and not is_count(global_batch_size):
            raise ValueError(
                f"`global_batch_size` must be an integer >= 1, got {global_batch_size}."
            )
        if (scale, global_batch_size) == (self.input_scale, self.scaled_global):
            return False
        self.input_scale, self.scaled_global = scale, global_batch_size
        if self.plan is None:
            return False  # the first training loader applies it
        self.rescale_pending = True
        return True
