"""The global-batch slicing batch sampler (DESIGN section 3)."""

from collections.abc import Iterator, Sequence
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_warn
from torch.utils.data import Sampler

from lightning_hetero.planning import PlanError, check_plan, proportional_split

__all__ = ["ChunkedPermutation", "EpochPermutation", "GlobalBatchSampler", "PartitionBatchSampler"]


class EpochPermutation(Sampler[int]):
    """One permutation of ``range(num_samples)`` per epoch, identical on every rank.

    Lightning calls ``set_epoch`` on ``loader.batch_sampler.sampler`` at every epoch
    start, which is how the slicing sampler learns the epoch.
    """

    def __init__(self, num_samples: int, shuffle: bool = True, seed: int = 0) -> None:
        self.num_samples = num_samples
        self.shuffle = shuffle
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        return torch.randperm(self.num_samples, generator=generator).tolist()

    def __iter__(self) -> Iterator[int]:
        return iter(self.permutation())

    def __len__(self) -> int:
        return self.num_samples


class ChunkedPermutation(EpochPermutation):
    """One chunk-aware permutation per epoch, identical on every rank.

    The indices are stored in chunks (files, shards) of ``chunk_sizes[c]`` consecutive
    indices. Each epoch the chunk order is shuffled (unless ``shuffle_chunks=False``: a
    stream keeps its order), consecutive chunks are taken ``window`` at a time, and the
    samples of a window are shuffled among themselves: a window's chunks are read together
    and never again in the epoch. ``group`` (the global batch size) then orders the
    positions of each global batch by chunk (and by index within a chunk), so that a rank's
    slice of it, which is contiguous, reads as few chunks as its share allows, each front to
    back; a global batch is the same set of samples either way.

    Example:
        >>> order = ChunkedPermutation([3, 3, 2], shuffle=False)
        >>> order.permutation()
        [0, 1, 2, 3, 4, 5, 6, 7]
        >>> order = ChunkedPermutation([3, 3, 2], window=1, seed=1)
        >>> sorted(order.permutation()) == list(range(8))
        True
    """

    def __init__(
        self,
        chunk_sizes: Sequence[int],
        shuffle: bool = True,
        seed: int = 0,
        window: int = 1,
        group: int | None = None,
        shuffle_chunks: bool = True,
    ) -> None:
        sizes = [int(n) for n in chunk_sizes]
        if not sizes or min(sizes) < 1:
            raise ValueError(f"Every chunk needs >= 1 sample, got chunk sizes {sizes[:10]}.")
        if window < 1 or (group is not None and group < 1):
            raise ValueError(f"`window` and `group` must be >= 1, got {window} and {group}.")
        super().__init__(sum(sizes), shuffle=shuffle, seed=seed)
        self.chunk_sizes = sizes
        self.window = int(window)
        self.group = group
        self.shuffle_chunks = shuffle_chunks

    def permutation(self) -> list[int]:
        if not self.shuffle:
            return list(range(self.num_samples))
        generator = torch.Generator()
        generator.manual_seed(self.seed + self.epoch)
        sizes = torch.tensor(self.chunk_sizes)
        starts = torch.cumsum(sizes, 0) - sizes
        count = len(sizes)
        chunks = torch.randperm(count, generator=generator) if self.shuffle_chunks else None
        order = chunks if chunks is not None else torch.arange(count)
        pieces = []
        for first in range(0, count, self.window):
            members = order[first : first + self.window].tolist()
            indices = torch.cat([torch.arange(starts[c], starts[c] + sizes[c]) for c in members])
            pieces.append(indices[torch.randperm(len(indices), generator=generator)])
        positions = torch.cat(pieces)
        if self.group is not None and self.group > 1:
            rank_of_chunk = torch.empty(count, dtype=torch.long)
            rank_of_chunk[order] = torch.arange(count)
            chunk_of = torch.repeat_interleave(torch.arange(count), sizes)
            block = torch.arange(self.num_samples) // self.group
            chunk = chunk_of[positions]
            within = positions - starts[chunk]  # read each chunk front to back
            key = (block * count + rank_of_chunk[chunk]) * int(sizes.max()) + within
            positions = positions[torch.argsort(key)]
        return positions.tolist()


class GlobalBatchSampler(Sampler[list[int]]):
    """Yield this rank's slice of each global batch of one shared permutation.

    Step ``s`` owns positions ``[s*B, (s+1)*B)`` of the epoch's permutation and rank
    ``k`` takes the ``b_k`` positions starting at ``b_0 + ... + b_{k-1}``. Every rank
    therefore has the same number of steps, each sample is used once per epoch, and
    the split can change at any step boundary without reshuffling.

    Plan changes are scheduled with ``set_plan`` from a given step on. The
    caller must pick a step no rank has drawn yet (DataLoader workers prefetch);
    ``cursor`` is the number of batches drawn in the current epoch.

    ``drop_last`` decides what happens to the ``r = N mod B`` samples that do not fill a
    global batch: ``True`` drops them (a different set each shuffled epoch); ``False``
    keeps them all in one last, smaller step, split in proportion to the plan with every
    rank given at least its ``min_batch_sizes`` entry. When ``r`` is below the sum of
    those minimums, the step is padded with the epoch's first samples, as
    ``DistributedSampler`` pads under DDP, and every rank gets
    exactly its minimum: no rank ever trains on fewer samples than its minimum (a
    BatchNorm layer cannot train on a batch of one).

    Example:
        >>> epoch = EpochPermutation(11, shuffle=False)
        >>> lower = [2, 2]
        >>> [list(GlobalBatchSampler(epoch, [3, 2], k, min_batch_sizes=lower)) for k in (0, 1)]
        [[[0, 1, 2], [5, 6, 7], [10, 0]], [[3, 4], [8, 9], [1, 2]]]
    """

    def __init__(
        self,
        sampler: EpochPermutation,
        batch_sizes: Sequence[int],
        rank: int,
        drop_last: bool = False,
        min_batch_sizes: Sequence[int] | None = None,
    ) -> None:
        plan = check_plan(batch_sizes, len(batch_sizes))
        if not 0 <= rank < len(plan):
            raise ValueError(f"rank {rank} is outside the plan of {len(plan)} ranks.")
        self.sampler = sampler
        self.rank = rank
        self.drop_last = drop_last
        self.min_batch_sizes = [1] * len(plan) if min_batch_sizes is None else list(min_batch_sizes)
        if len(self.min_batch_sizes) != len(plan) or min(self.min_batch_sizes) < 1:
            raise ValueError(
                f"`min_batch_sizes` needs one entry >= 1 per rank, got {min_batch_sizes}."
            )
        self.global_batch_size = sum(plan)
        num_samples = len(sampler)
        if num_samples < self.global_batch_size:
            raise PlanError(
                f"The training set has {num_samples} samples, fewer than one global batch of"
                f" {self.global_batch_size}: lower the batch size or add data."
            )
        self.cursor = 0
        #: The step this epoch's iteration started at (0 unless resumed inside the epoch).
        self.first_step = 0
        self._epoch_plan = plan
        self._changes: list[tuple[int, list[int]]] = []
        self._resume: dict[str, Any] | None = None

    @property
    def batch_sizes(self) -> list[int]:
        """The latest plan (the one the next epoch starts with)."""
        return list(self._changes[-1][1] if self._changes else self._epoch_plan)

    def set_plan(self, batch_sizes: Sequence[int], from_step: int | None = None) -> None:
        """Use ``batch_sizes`` from step ``from_step`` of the current epoch on.

        ``None`` (or a step at or past the end of the epoch) means from the next epoch.
        A step already drawn cannot be changed: that would break exact coverage.
        """
        plan = check_plan(batch_sizes, len(self._epoch_plan), self.global_batch_size)
        if from_step is None or from_step >= len(self):
            from_step = len(self)
        elif from_step < self.cursor:
            raise ValueError(
                f"Cannot change the plan from step {from_step}: this rank has already drawn"
                f" {self.cursor} batches of the epoch."
            )
        self._changes = [(s, p) for s, p in self._changes if s < from_step]
        self._changes.append((from_step, plan))

    def plan_at(self, step: int) -> list[int]:
        """The plan that governs step ``step`` of the current epoch."""
        plan = self._epoch_plan
        for start, changed in self._changes:
            if start <= step:
                plan = changed
        return plan

    def layout(self, step: int) -> tuple[int, list[int]]:
        """First position in the permutation and per-rank sizes of step ``step``."""
        full_steps, remainder = divmod(len(self.sampler), self.global_batch_size)
        plan = self.plan_at(step)
        start = step * self.global_batch_size
        if step < full_steps:
            return start, list(plan)
        lower = self.min_batch_sizes
        if remainder < sum(lower):
            return start, list(lower)  # padded with the epoch's first samples
        return start, proportional_split(plan, remainder, lower)

    def __len__(self) -> int:
        full_steps, remainder = divmod(len(self.sampler), self.global_batch_size)
        return full_steps + (remainder > 0 and not self.drop_last)

    def state_dict(self, step: int | None = None) -> dict[str, Any]:
        """Where this epoch stands: its epoch, plans and the next ``step`` to train (default
        ``cursor``, the next step to draw)."""
        return {
            "epoch": getattr(self.sampler, "epoch", 0),
            "step": self.cursor if step is None else int(step),
            "steps": len(self),
            "samples": len(self.sampler),
            "epoch_plan": list(self._epoch_plan),
            "changes": [[start, list(plan)] for start, plan in self._changes],
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Resume inside an epoch: the next iteration of epoch ``state["epoch"]`` starts at
        step ``state["step"]`` with the plans that epoch ran (any other epoch starts afresh).

        A state whose epoch had ended (all its ``steps`` drawn) holds nothing to resume. On
        another number of ranks with the same global batch, the epoch goes on from the same
        step with this sampler's plan: a step's samples depend only on the global batch.
        Where the training set's length or the global batch changed, the saved step is a
        position in another order: the epoch's order starts over (its remaining steps draw
        from the start of this run's order), with a warning that says so.
        """
        self._resume = None
        if int(state["step"]) >= int(state.get("steps", state["step"] + 1)):
            return
        samples = int(state.get("samples", len(self.sampler)))  # older checkpoints: unsaved
        batch = sum(state["epoch_plan"])
        if samples != len(self.sampler) or batch != self.global_batch_size:
            rank_zero_warn(
                f"hetero: the checkpoint stopped at step {state['step']} of epoch"
                f" {state['epoch']} ({samples} training samples, a global batch of {batch}),"
                f" and this run has {len(self.sampler)} samples and a global batch of"
                f" {self.global_batch_size}: that step is a position in another order, so the"
                " epoch's order starts over (its remaining steps draw from the start of a new"
                " order: some samples are trained twice this epoch, some not at all). Resume"
                " from a checkpoint written at an epoch end, or with the same data and"
                " `global_batch_size`, for exact epochs."
            )
            return
        plans = [state["epoch_plan"], *(plan for _, plan in state["changes"])]
        if any(len(p) != len(self._epoch_plan) for p in plans):  # another world: its own plan
            state = {**state, "epoch_plan": self.batch_sizes, "changes": []}
        self._resume = dict(state)

    def __iter__(self) -> Iterator[list[int]]:
        resume, self._resume = self._resume, None
        first = 0
        if resume is not None and resume["epoch"] == getattr(self.sampler, "epoch", 0):
            self._epoch_plan = list(resume["epoch_plan"])
            self._changes = [(int(start), list(plan)) for start, plan in resume["changes"]]
            first = int(resume["step"])
        else:
            # A new epoch starts from the latest plan; scheduled changes have been folded in.
            self._epoch_plan = self.batch_sizes
            self._changes = []
        self.cursor = self.first_step = first
        positions = self.sampler.permutation()
        steps = len(self)
        if steps:  # a padded tail step wraps around to the epoch's first samples
            start, sizes = self.layout(steps - 1)
            positions += positions[: max(start + sum(sizes) - len(positions), 0)]
        for step in range(first, steps):
            start, sizes = self.layout(step)
            offset = start + sum(sizes[: self.rank])
            self.cursor = step + 1
            yield positions[offset : offset + sizes[self.rank]]


class PartitionBatchSampler(Sampler[list[int]]):
    """Yield this rank's own share of one shared permutation, in batches of its own size.

    Rank ``k`` takes ``samples[k]`` consecutive positions of the epoch's permutation
    (starting after the shares of ranks ``0..k-1``) in batches of ``batch_sizes[k]``:
    every sample is used once per epoch, but ranks make different numbers of steps.
    Dual batch size learning uses it (small-batch ranks train on fewer samples, in more,
    smaller steps); it suits only modes without per-step collectives (``mode="async"``).

    ``drop_last`` drops a rank's last batch when it is short; otherwise it is kept, padded
    with the first samples of the rank's share up to ``min_batch_size``.

    Example:
        >>> epoch = EpochPermutation(10, shuffle=False)
        >>> list(PartitionBatchSampler(epoch, samples=[6, 4], batch_sizes=[4, 3], rank=1))
        [[6, 7, 8], [9]]
    """

    def __init__(
        self,
        sampler: EpochPermutation,
        samples: Sequence[int],
        batch_sizes: Sequence[int],
        rank: int,
        drop_last: bool = False,
        min_batch_size: int = 1,
    ) -> None:
        if len(samples) != len(batch_sizes):
            raise ValueError(
                f"`samples` has {len(samples)} entries and `batch_sizes` {len(batch_sizes)};"
                " give one of each per rank."
            )
        if not 0 <= rank < len(samples):
            raise ValueError(f"rank {rank} is outside the plan of {len(samples)} ranks.")
        if any(n < 1 for n in samples) or any(b < 1 for b in batch_sizes):
            raise PlanError(
                f"Every rank needs >= 1 sample and a batch size >= 1, got samples {list(samples)}"
                f" and batch sizes {list(batch_sizes)}."
            )
        if sum(samples) != len(sampler):
            raise PlanError(
                f"The per-rank shares {list(samples)} sum to {sum(samples)}, but the training"
                f" set has {len(sampler)} samples."
            )
        self.sampler = sampler
        self.rank = rank
        self.drop_last = drop_last
        self.samples = [int(n) for n in samples]
        self.batch_size = int(batch_sizes[rank])
        self.min_batch_size = min(min_batch_size, self.samples[rank])

    def size_at(self, step: int) -> int:
        """Number of samples in this rank's batch ``step`` (the last one may be short)."""
        left = self.samples[self.rank] - step * self.batch_size
        return max(min(self.batch_size, left), self.min_batch_size if left > 0 else 0)

    def __len__(self) -> int:
        full, remainder = divmod(self.samples[self.rank], self.batch_size)
        return full + (remainder > 0 and not self.drop_last)

    def __iter__(self) -> Iterator[list[int]]:
        start = sum(self.samples[: self.rank])
        share = self.sampler.permutation()[start : start + self.samples[self.rank]]
        for step in range(len(self)):
            batch = share[step * self.batch_size : (step + 1) * self.batch_size]
            yield batch + share[: self.size_at(step) - len(batch)]
