"""Real training steps outside the loop, to measure memory and time before the first plan.

What a step costs besides forward, backward and the optimizer is injected by the caller:
the mode's (e.g. a parameter-server push) and the emulation's (e.g.
[`Throttle`][lightning_hetero.emulate.Throttle]'s delay), so nothing here knows either.
"""

import time
from collections.abc import Callable, Iterator, Sequence
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch
from lightning_utilities.core.rank_zero import rank_zero_info, rank_zero_warn
from torch.utils.data import DataLoader

from lightning_hetero._optim import patched
from lightning_hetero.context import RunContext
from lightning_hetero.memory_probe import auto_max_batch_size, budget_sharers, preserved_state
from lightning_hetero.planning import PlanError, probe_sizes
from lightning_hetero.planning.dual import TimeModel
from lightning_hetero.resources import reset_peak_memory

__all__ = ["StepProbe", "check_probe_options"]


def check_probe_options(memory_safety: float, probe_batch_sizes: Sequence[int] | None) -> None:
    """Refuse bad options of ``max_batch_size="auto"``'s probe at construction."""
    if not 0.0 < memory_safety <= 1.0:
        raise ValueError(f"`memory_safety` must be in (0, 1], got {memory_safety}.")
    if probe_batch_sizes is not None and (
        len(set(probe_batch_sizes)) < 2 or min(probe_batch_sizes) < 1
    ):
        raise ValueError(
            f"`probe_batch_sizes` needs at least two distinct sizes >= 1, got {probe_batch_sizes}."
        )


class StepProbe:
    """Runs training steps of chosen sizes on ``loader``'s first samples.

    Args:
        context: the run (its module, optimizers, device, collectives).
        loader: the training loader.
        training_step: runs the module's ``training_step(batch, batch_idx)`` as the
            strategy does (under the precision plugin's step context; a sharded model:
            inside the root's forward).
        to_device: moves a collated batch to the rank's device, as the strategy does.
        schedulers: the learning-rate schedulers, whose state is put back with the rest.
        emulation: called with each timed step's batch and its number of samples before
            its backward (an emulated slower device's delay).
        extra: called with the module after each timed step's backward (the mode's
            per-step work, e.g. a push's round trip).
        agree: where a step communicates (a sharded model), makes every rank skip a probe
            size when one does (see ``probe_memory``).
        micro: where a step's micro-batches hold more than one ordinary step (FSDP2's units
            gathered from the first micro-batch to the last), the strategy's
            ``_micro_forward(last)``: the memory probe then runs each step at size ``s`` as
            two micro-batches of ``s`` samples, as training runs them, so its bound is a
            micro-batch bound. ``micro_failed`` undoes what it holds after an error.
    """

    def __init__(
        self,
        context: RunContext,
        loader: DataLoader,
        training_step: Callable[[Any, int], Any],
        to_device: Callable[[Any], Any],
        schedulers: Sequence[Any] = (),
        emulation: Sequence[Callable[[Any], None]] = (),
        extra: Callable[[torch.nn.Module], None] | None = None,
        agree: Callable[[bool], bool] | None = None,
        micro: Callable[[bool], AbstractContextManager[Any]] | None = None,
        micro_failed: Callable[[], None] | None = None,
    ) -> None:
        self.context = context
        self.loader = loader
        self.training_step = training_step
        self.to_device = to_device
        self.schedulers = schedulers
        self.emulation = emulation
        self.extra = extra
        self.agree = agree
        self.micro, self.micro_failed = micro, micro_failed

    @contextmanager
    def steps(
        self, what: str, instead: str = "", micro: bool = False
    ) -> Iterator[Callable[..., None]]:
        """Yield ``step(batch_size, timed=False)``, one real training step outside the loop.

        Model, optimizer and random state are put back afterwards and logging is silenced;
        ``instead`` completes the error for manual optimization with an alternative.
        ``timed=True`` runs what a worker's step costs without stepping the optimizer:
        forward, backward with the emulation's delay, and the mode's extra work. ``micro``:
        each step runs as two micro-batches of ``batch_size`` under ``self.micro`` (the same
        number on every rank, so sharded ranks issue the same collectives at every size).
        """
        ctx, loader = self.context, self.loader
        module = ctx.module
        if not module.automatic_optimization:
            raise ValueError(
                f"{what} runs training steps itself and needs automatic optimization{instead}."
            )
        dataset = loader.dataset
        optimizers = [*ctx.optimizers, *self.schedulers]

        held = micro and self.micro is not None
        passes = self._passes(held)

        def step(batch_size: int, timed: bool = False) -> None:
            batch = loader.collate_fn([dataset[i] for i in range(batch_size)])
            try:
                for last in passes:
                    with self.micro(last) if held else nullcontext():  # type: ignore[misc]
                        output = self.training_step(self.to_device(batch), 0)
                    loss = output["loss"] if isinstance(output, dict) else output
                    if not isinstance(loss, torch.Tensor):
                        raise ValueError(
                            f"{what} needs `training_step` to return the loss (or a dict with"
                            f" 'loss'), got {type(output).__name__}."
                        )
                    if timed:
                        for emulate in self.emulation:
                            emulate(batch, batch_size)
                    loss.backward()
            except BaseException:
                if held and self.micro_failed is not None:
                    self.micro_failed()  # e.g. out of memory between the micro-batches
                raise
            if timed and self.extra is not None:
                self.extra(module)
            for optimizer in ctx.optimizers:
                if not timed:
                    optimizer.step()
                optimizer.zero_grad(set_to_none=True)

        quiet = {"log": lambda *a, **k: None, "log_dict": lambda *a, **k: None}
        with preserved_state(module, optimizers), patched(module, quiet):
            yield step

    def memory(
        self,
        total: int,
        sizes: Sequence[int] | None,
        safety: float,
        max_auto: bool | None = None,
        micro_auto: bool = False,
        lower: int = 1,
    ) -> dict[str, Any]:
        """``max_batch_size="auto"`` (or ``micro_batch_size="auto"``): each rank's memory
        bound, gathered from all ranks.

        ``total``: the global batch (the largest size worth probing); ``sizes``: the sizes
        to probe (default: a few doubling up to ``total``). With ``micro``, each probed step
        runs as two held micro-batches (see ``steps``) and the bound is a micro-batch's.
        ``max_auto``/``micro_auto``: which of the two options the user set to ``"auto"``,
        so that messages name that one (default: ``max_batch_size`` unless ``micro``).
        ``lower``: the model's smallest batch (BatchNorm's 2): no size below it is probed.
        """
        ctx = self.context
        largest = min(total, len(self.loader.dataset))  # type: ignore[arg-type]
        sizes = sorted({max(lower, size) for size in sizes or probe_sizes(largest)})
        device = ctx.device
        devices = ctx.devices or [device]
        # ranks sharing what the probe measures: the GPU on CUDA (unless MPS partitions
        # it), the host's memory on CPU
        share = budget_sharers(device, devices)
        held = self.micro is not None
        micro_auto = micro_auto or held
        max_auto = not held if max_auto is None else max_auto
        set_ = (("max_batch_size='auto'", max_auto), ("micro_batch_size='auto'", micro_auto))
        option = " and ".join(name for name, on in set_ if on) or "max_batch_size='auto'"
        instead = "; set `max_batch_size` explicitly with manual optimization"
        error: PlanError | None = None
        with self.steps(option, instead, micro=held) as step:
            try:
                bound, model, result = auto_max_batch_size(
                    step, sizes, device, safety=safety, cap=total, share=share, agree=self.agree
                )
            except PlanError as caught:
                # the other ranks are about to gather their bounds: this rank joins with none
                # (0), so that every rank refuses and none waits for it there
                error, bound, model, result = caught, 0, None, None
        reset_peak_memory(device)  # the probe's peak is not training's
        bound = total if bound is None else bound
        fit = (0.0, 0.0) if model is None else (model.fixed_bytes, model.per_sample_bytes)
        rows = ctx.comm.gather_rows([bound, *fit])
        bounds = [int(row[0]) for row in rows]
        if min(bounds) < 1:
            self._refuse(option, bounds, error, held, micro_auto)
        assert model is not None and result is not None
        found = {
            "max_batch_sizes": bounds,
            "fixed_bytes": [row[1] for row in rows],
            "per_sample_bytes": [row[2] for row in rows],
            "budget_bytes": result.budget_bytes / share,
            "relative_error": model.relative_error,
            "samples": list(result.samples),
            "micro_batches": len(self._passes(held)),
        }
        if model.relative_error > 0.1:
            rank_zero_warn(
                f"{option}: the linear memory fit is off by up to"
                f" {model.relative_error:.0%} on rank 0's probe {list(result.samples)}."
            )
        what = "micro-batch" if micro_auto else "maximum batch"
        rank_zero_info(
            f"{option}: per-rank {what} sizes {bounds} (probed {result.tried}"
            f"{', each as two micro-batches held as in training' if held else ''})."
        )
        return found

    @staticmethod
    def _passes(held: bool) -> tuple[bool, ...]:
        """``last`` for each micro-batch of a probe step: held, the first holds (FSDP2: every
        unit gathered, gradients local) and the last puts each unit's own switches back and
        communicates as an ordinary step's backward; else one ordinary step."""
        return (False, True) if held else (True,)

    @staticmethod
    def _refuse(
        option: str, bounds: list[int], error: PlanError | None, held: bool, micro_auto: bool
    ) -> None:
        """Raise on every rank: the probe found no batch size that fits on some rank."""
        ranks = [rank for rank, bound in enumerate(bounds) if bound < 1]
        why = f" (this rank: {error})" if error is not None else ""
        if held:
            advice = (
                " Under HeteroFSDPStrategy a step's micro-batches hold every unit's parameters"
                " gathered and every gradient unsharded for the whole step, which does not fit"
                " there. Give `micro_batch_size` as ints (a bound at least a rank's share runs"
                " it as one ordinary FSDP step), bound those ranks' shares with"
                " `max_batch_size` and drop `micro_batch_size`, or shard over more ranks."
            )
        elif micro_auto:
            advice = " Give `micro_batch_size` as ints, or probe smaller `probe_batch_sizes`."
        else:
            advice = " Set `max_batch_size` explicitly, or probe smaller `probe_batch_sizes`."
        raise PlanError(
            f"hetero: {option}: the memory probe found no batch size that fits on rank(s)"
            f" {ranks}{why}.{advice}"
        )

    def time(self, largest: int) -> list[TimeModel]:
        """Fit ``t(x) = a*x + b`` to timed training steps, one fit per rank (in rank order)."""
        ctx = self.context
        largest = min(largest, len(self.loader.dataset))  # type: ignore[arg-type]
        sizes = sorted({min(2, largest), *probe_sizes(largest)})  # small batches show b
        cuda = ctx.device.type == "cuda"
        times = []
        with self.steps("controller='dual'") as step:
            step(sizes[0], timed=True)  # warm-up: allocator, kernels, caches
            for size in sizes:
                ctx.barrier("the time probe")  # ranks time each size together
                runs = []
                for _ in range(5):
                    if cuda:
                        torch.cuda.synchronize(ctx.device)
                    started = time.perf_counter()
                    step(size, timed=True)
                    if cuda:
                        torch.cuda.synchronize(ctx.device)
                    runs.append(time.perf_counter() - started)
                times.append(min(runs))
        rows = ctx.comm.gather_rows(times)
        # each rank's own fit: the dual plan gives the slowest ones the small batches
        return [TimeModel.fit(list(zip(sizes, row))) for row in rows]
