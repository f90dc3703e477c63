"""Emulated heterogeneous workers on one machine."""

import math
import random
import time
from collections.abc import Mapping, Sequence
from numbers import Real
from typing import Any, Literal

import lightning.pytorch as pl
from lightning.pytorch.callbacks import Callback
from lightning.pytorch.utilities.data import extract_batch_size
from typing_extensions import override

from lightning_hetero.context import StepLayout

__all__ = ["Throttle"]

_MIN_NOISE_FACTOR = 0.05  # as the simulator: a delay never shrinks below 5% of itself


def _hetero(trainer: "pl.Trainer") -> StepLayout | None:
    """The trainer's strategy where it is one of the package's (``None`` for DDP and others)."""
    strategy = trainer.strategy
    return strategy if isinstance(strategy, StepLayout) else None


def _number(value: Any) -> bool:
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def _stall_pair(value: Any) -> bool:
    """Whether ``value`` is one ``(probability in [0, 1], seconds >= 0)`` pair."""
    return (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and len(value) == 2
        and all(_number(v) for v in value)
        and 0 <= value[0] <= 1
        and value[1] >= 0
    )


def _stalls(value: Any) -> tuple[float, float] | list[tuple[float, float]]:
    """``value`` as one ``(probability, seconds)`` pair for every rank or a list of pairs,
    one per rank."""
    if _stall_pair(value):
        return (float(value[0]), float(value[1]))
    if (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and value
        and all(_stall_pair(v) for v in value)
    ):
        return [(float(p), float(s)) for p, s in value]
    raise ValueError(
        "`stalls` must be a pair (probability in [0, 1], seconds >= 0) for every rank or a"
        f" non-empty sequence of such pairs (one per rank), got {value!r}."
    )


def _per_rank(name: str, value: Any) -> float | list[float]:
    """``value`` as one number for every rank or a list with one per rank, each >= 0."""
    if _number(value) and value >= 0:
        return float(value)
    if (
        isinstance(value, Sequence)
        and not isinstance(value, (str, bytes))
        and value
        and all(_number(v) and v >= 0 for v in value)
    ):
        return [float(v) for v in value]
    raise ValueError(
        f"`{name}` must be a number >= 0 (every rank) or a non-empty sequence of numbers >= 0"
        f" (one per rank), got {value!r}."
    )


class Throttle(Callback):
    """Make rank ``k`` slower by ``sample_cost[k]`` seconds per sample of its batch.

    A batch's samples are those the plan gives the rank in that step under
    [`HeteroStrategy`][lightning_hetero.HeteroStrategy] (its ``b_k``), and what Lightning's
    ``extract_batch_size`` reads from the batch under any other strategy.

    The delay is added after the forward pass and before backward, so it counts as
    compute time (before the gradients are ready), exactly as a slower device would.
    Works with any strategy, which makes it the way to compare plain DDP with
    [`HeteroStrategy`][lightning_hetero.HeteroStrategy] on one machine.

    The other costs of a real cluster can be added too: loading on the training thread
    (``load_cost``), a device that is no faster below some batch size (``floor``), fixed
    costs per step (``step_cost``) and noise. On a batch of ``b`` samples rank ``k`` sleeps
    ``load_cost[k] * b`` in ``on_train_batch_start`` (before the forward, where
    ``DataLoader(num_workers=0)`` loads) and ``max(floor[k], sample_cost[k] * b) +
    step_cost[k]`` in ``on_before_backward``; see
    [`delay_s`][lightning_hetero.emulate.Throttle.delay_s]. With ``stalls`` a rank also
    sleeps ``seconds`` more in the first backward of some optimizer steps (see
    [`stall_s`][lightning_hetero.emulate.Throttle.stall_s]). A step that the hetero
    strategy runs as micro-batches (``micro_batch_size``) has one backward per micro-batch,
    each charged its own samples, ``floor`` and ``step_cost``, as the batches of Lightning's
    gradient accumulation are under DDP.

    Args:
        sample_cost: seconds per sample, one entry per global rank; or a mapping
            ``{epoch: [costs]}`` whose latest entry at or before the current epoch
            applies (epochs before the first entry run unthrottled).
        unit: what the keys of a ``sample_cost`` mapping count: ``"epoch"``, or ``"step"``
            (the trainer's ``global_step``, i.e. optimizer steps), to change speeds in the
            middle of an epoch.
        load_cost: seconds per sample of data loading on the training thread, before the
            forward; one number for every rank or one per rank.
        step_cost: seconds per step that the batch size does not change (kernel launches,
            optimizer, the loop), added to the compute delay; one number or one per rank.
        floor: the least compute delay of a step before ``step_cost`` (a device that takes
            as long for any batch below its saturation); one number or one per rank. Like
            ``load_cost`` and ``step_cost`` it does not change over time, and it applies
            also before the first entry of a ``sample_cost`` mapping.
        noise: relative standard deviation of every delay: each is multiplied by
            ``max(0.05, 1 + N(0, noise))``.
        stalls: ``(probability, seconds)``: at each optimizer step, with ``probability``,
            the rank stalls ``seconds`` more in its compute delay (another job's burst, a
            page fault, a GC pause: the heavy-tailed delays of a busy node, without noise);
            one pair for every rank or one per rank. Whether a step stalls is drawn from
            ``seed``, the global rank and the trainer's ``global_step`` alone, so runs with
            any strategy stall at the same steps.
        seed: seed of the noise and the stalls, combined with the global rank (runs repeat,
            ranks differ).

    Example:
        >>> Throttle(sample_cost=[0.004, 0.004, 0.006, 0.0015]).cost(rank=2, epoch=0)
        0.006
        >>> Throttle(sample_cost={0: [0.001, 0.001], 3: [0.001, 0.01]}).cost(rank=1, epoch=5)
        0.01
        >>> Throttle({0: [0.001, 0.001], 40: [0.001, 0.01]}, unit="step").cost(rank=1, epoch=39)
        0.001
        >>> throttle = Throttle([0.004, 0.002], load_cost=0.001, step_cost=0.02, floor=[0, 0.06])
        >>> throttle.delay_s(rank=0, when=0, batch_size=32)  # (load, compute) seconds
        (0.032, 0.148)
        >>> throttle.delay_s(rank=1, when=0, batch_size=16)  # 0.002 * 16 is below the floor
        (0.016, 0.08)
        >>> stalling = Throttle([0.004, 0.006], stalls=(0.15, 0.2))
        >>> sum(stalling.stall_s(rank=1, step=s) > 0 for s in range(1000))  # about 15%
        148
    """

    def __init__(
        self,
        sample_cost: Sequence[float] | Mapping[int, Sequence[float]],
        unit: Literal["epoch", "step"] = "epoch",
        *,
        load_cost: float | Sequence[float] = 0.0,
        step_cost: float | Sequence[float] = 0.0,
        floor: float | Sequence[float] = 0.0,
        noise: float = 0.0,
        stalls: tuple[float, float] | Sequence[tuple[float, float]] = (0.0, 0.0),
        seed: int = 0,
    ) -> None:
        if unit not in ("epoch", "step"):
            raise ValueError(f"`unit` must be 'epoch' or 'step', got {unit!r}.")
        self.load_cost = _per_rank("load_cost", load_cost)
        self.step_cost = _per_rank("step_cost", step_cost)
        self.floor = _per_rank("floor", floor)
        self.stalls = _stalls(stalls)
        if not (_number(noise) and noise >= 0):
            raise ValueError(
                f"`noise` must be a number >= 0 (a relative standard deviation), got {noise!r}."
            )
        if not isinstance(seed, int) or isinstance(seed, bool):
            raise ValueError(f"`seed` must be an int, got {seed!r}.")
        self.noise = float(noise)
        self.seed = seed
        self.unit = unit
        schedule = dict(sample_cost) if isinstance(sample_cost, Mapping) else {0: sample_cost}
        if not schedule:
            raise ValueError("`sample_cost` is empty.")
        self.schedule: dict[int, list[float]] = {}
        for epoch, costs in sorted(schedule.items()):
            costs = [float(c) for c in costs]
            if int(epoch) < 0 or not costs or any(c < 0 for c in costs):
                raise ValueError(
                    f"{unit.capitalize()}s and costs must be >= 0 and non-empty,"
                    f" got {epoch}: {costs}."
                )
            self.schedule[int(epoch)] = costs
        sizes = {len(c) for c in self.schedule.values()}
        if len(sizes) != 1:
            raise ValueError("Every entry of `sample_cost` needs one cost per rank.")
        widths = self._widths()
        for name, width in widths.items():
            if width != widths["sample_cost"]:
                raise ValueError(
                    f"`{name}` has {width} entries but `sample_cost` has"
                    f" {widths['sample_cost']}: give one per rank, or one number."
                )
        self._batch_size = 0
        self._rngs: dict[int, random.Random] = {}
        self._stall_step: int | None = None  # the optimizer step whose stall was drawn
        self._stall_due = 0.0  # seconds of that stall not yet slept

    def _widths(self) -> dict[str, int]:
        """How many ranks each per-rank option has an entry for (numbers fit any)."""
        widths = {"sample_cost": len(next(iter(self.schedule.values())))}
        for name in ("load_cost", "step_cost", "floor", "stalls"):
            value = getattr(self, name)
            if isinstance(value, list):
                widths[name] = len(value)
        return widths

    def cost(self, rank: int, epoch: int) -> float:
        """Seconds per sample for ``rank`` during ``epoch`` (a step when ``unit="step"``)."""
        costs: list[float] | None = None
        for start, entry in self.schedule.items():
            if start <= epoch:
                costs = entry
        if costs is None:
            return 0.0
        if rank >= len(costs):
            raise ValueError(f"Throttle has costs for {len(costs)} ranks; rank {rank} has none.")
        return costs[rank]

    def delay_s(self, rank: int, when: int, batch_size: int) -> tuple[float, float]:
        """``(load_s, compute_s)`` of a step on ``batch_size`` samples, without noise.

        ``when`` is the epoch (the step when ``unit="step"``). ``load_s`` is slept in
        ``on_train_batch_start``, ``compute_s`` (``max(floor, cost * b) + step_cost``) in
        ``on_before_backward``.
        """
        per_sample = self.cost(rank, when)  # checks the rank against sample_cost's width
        load, step, floor = (
            self._of(rank, value) for value in (self.load_cost, self.step_cost, self.floor)
        )
        return load * batch_size, max(floor, per_sample * batch_size) + step

    @staticmethod
    def _of(rank: int, value: float | list[float]) -> float:
        return value[rank] if isinstance(value, list) else value

    def stall_s(self, rank: int, step: int) -> float:
        """Seconds ``rank`` stalls at optimizer step ``step`` (``global_step``): the pair's
        ``seconds`` with its ``probability``, else 0. A draw of its own per ``seed``, rank
        and step, so the pattern does not depend on how many delays the strategy sleeps
        (micro-batches, probes) and repeats across runs."""
        probability, seconds = self.stalls[rank] if isinstance(self.stalls, list) else self.stalls
        if probability == 0 or seconds == 0:
            return 0.0
        draw = random.Random(f"lightning_hetero.Throttle.stall:{self.seed}:{rank}:{step}")
        return seconds if draw.random() < probability else 0.0

    def noise_factor(self, rank: int) -> float:
        """The next factor of ``rank``'s delays: ``max(0.05, 1 + N(0, noise))`` from a
        generator seeded with ``seed`` and ``rank``; 1.0 (nothing drawn) without noise."""
        if self.noise == 0:
            return 1.0
        rng = self._rngs.get(rank)
        if rng is None:
            rng = self._rngs[rank] = random.Random(f"lightning_hetero.Throttle:{self.seed}:{rank}")
        return max(_MIN_NOISE_FACTOR, 1.0 + rng.gauss(0.0, self.noise))

    @override
    def setup(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", stage: str) -> None:
        width = self._widths()["sample_cost"]  # every per-rank option has as many (__init__)
        if width != trainer.world_size:
            raise ValueError(
                f"Throttle has costs for {width} ranks but the run has {trainer.world_size}."
            )

    @override
    def on_train_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._stall_step, self._stall_due = None, 0.0  # a new fit draws its steps afresh

    @override
    def on_train_batch_start(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any, batch_idx: int
    ) -> None:
        self._batch_size = self._samples(trainer, batch, batch_idx)
        # one draw per optimizer step: the batches of Lightning's gradient accumulation share
        # a global_step, and only the step's first backward sleeps the stall
        if trainer.global_step != self._stall_step:
            self._stall_step = trainer.global_step
            self._stall_due = self.stall_s(trainer.global_rank, trainer.global_step)
        self._sleep(self._noisy(trainer.global_rank, self._delays(trainer, self._batch_size)[0]))

    @override
    def on_before_backward(
        self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", loss: Any
    ) -> None:
        # under the hetero strategy's micro-batches each backward is one micro-batch's: it
        # costs its own samples plus the fixed `step_cost`, as a Lightning batch of
        # gradient accumulation does under DDP
        strategy = _hetero(trainer)
        micro = None if strategy is None else strategy.micro_batch_samples
        samples = self._batch_size if micro is None else micro
        stall, self._stall_due = self._stall_due, 0.0
        self._sleep(self._noisy(trainer.global_rank, self._delays(trainer, samples)[1]) + stall)

    def emulate_step(self, trainer: "pl.Trainer", batch: Any, samples: int | None = None) -> None:
        """Sleep what a step on ``batch`` of ``samples`` samples (default: as Lightning reads
        the batch) costs this rank now, loading included: what a probe that times training
        steps outside the loop adds to each, as the loop's hooks would (stalls aside: they
        belong to the loop's optimizer steps)."""
        rank = trainer.global_rank
        samples = extract_batch_size(batch) if samples is None else samples
        load_s, compute_s = self._delays(trainer, samples)
        self._sleep(self._noisy(rank, load_s) + self._noisy(rank, compute_s))

    @staticmethod
    def _samples(trainer: "pl.Trainer", batch: Any, batch_idx: int) -> int:
        """This rank's samples in the step: what the strategy's plan gives it (``b_k``), else
        (another strategy, a mode without a step layout) what Lightning reads from the batch,
        which counts a tensor's first dimension and can miss (2 in a PyG ``Batch``: its
        ``edge_index``)."""
        strategy = _hetero(trainer)
        samples = None if strategy is None else strategy.step_samples(batch_idx)
        return extract_batch_size(batch) if samples is None else samples

    def _delays(self, trainer: "pl.Trainer", batch_size: int) -> tuple[float, float]:
        when = trainer.current_epoch if self.unit == "epoch" else trainer.global_step
        return self.delay_s(trainer.global_rank, when, batch_size)

    def _noisy(self, rank: int, delay: float) -> float:
        """``delay`` times the rank's next noise factor (none is drawn for no delay)."""
        return delay * self.noise_factor(rank) if delay > 0 else 0.0

    @staticmethod
    def _sleep(delay: float) -> None:
        if delay > 0:
            time.sleep(delay)
