"""Replica merging of ``mode="local"`` (paper 004, Algorithm 2): the torch half.

The weights come from
[`lightning_hetero.planning.merge_weights`][lightning_hetero.planning.merge_weights] (pure numbers);
this module applies them: a weighted all-reduce of every replica's parameters, then the
merge momentum ``w' = sum_k alpha_k w_k + gamma * (w - w_prev)`` or, with ``outer_lr``,
DiLoCo's outer step (Nesterov momentum on the pseudo-gradient ``w - sum_k alpha_k w_k``).
"""

from collections.abc import Sequence

import torch
import torch.distributed as dist

from lightning_hetero.planning.merge import momentum_merge, outer_step

__all__ = ["ReplicaMerger", "flatten", "optimizer_state_tensors", "unflatten_", "weighted_average_"]


class ReplicaMerger:
    """Merges this rank's model replica with every other rank's.

    Args:
        module: the replica (every floating-point parameter and buffer is merged).
        rank: this rank.
        gamma: merge momentum in ``[0, 1)``; 0 is the plain weighted average.
        outer_lr: the outer optimizer's learning rate (Nesterov momentum 0.9 on the
            pseudo-gradient, [`outer_step`][lightning_hetero.planning.merge.outer_step]);
            ``None``: no outer optimizer.

    Floating-point buffers (e.g. BatchNorm statistics) are averaged with the same
    weights but without momentum; integer buffers (step counters) are left alone. The merge
    computes in float32 (``flatten``) whatever the parameters' dtypes, and each parameter
    keeps its own.
    """

    def __init__(
        self, module: torch.nn.Module, rank: int, gamma: float, outer_lr: float | None = None
    ) -> None:
        self.rank = rank
        self.gamma = gamma
        self.outer_lr = outer_lr
        self._velocity: torch.Tensor | None = None  # the outer optimizer's momentum buffer
        self.params = [p for p in module.parameters() if p.dtype.is_floating_point]
        self.buffers = [b for b in module.buffers() if b.dtype.is_floating_point]
        self.reset()

    def reset(self) -> None:
        """Take the replica as it is now as both the global and the previous global model."""
        with torch.no_grad():
            self._global = flatten(self.params) if self.params else None
        self._previous = self._global
        self._velocity = None

    def state_dict(self) -> dict[str, torch.Tensor | None]:
        """The global model of the last merge, the one before it (``gamma``) and the outer
        optimizer's momentum buffer (``outer_lr``; ``None`` before the first merge), on the
        CPU."""

        def saved(vector: torch.Tensor | None) -> torch.Tensor | None:
            return None if vector is None else vector.detach().to("cpu", copy=True)

        return {
            "global": saved(self._global),
            "previous": saved(self._previous),
            "velocity": saved(self._velocity),
        }

    def load_state_dict(self, state: dict[str, torch.Tensor | None]) -> None:
        """Continue from ``state`` (of ``state_dict``), on this replica's device."""
        size = sum(p.numel() for p in self.params)
        for name, vector in state.items():
            if vector is not None and vector.numel() != size:
                raise ValueError(
                    f"The checkpoint's local-SGD merge state ({name!r}) has {vector.numel()}"
                    f" values, this model {size} parameters: resume with the model it was"
                    " saved from."
                )
        like = self._global  # this run's vector: its device and dtype

        def placed(vector: torch.Tensor | None) -> torch.Tensor | None:
            if vector is None or like is None:
                return None
            return vector.to(device=like.device, dtype=like.dtype, copy=True)

        self._global = placed(state["global"])
        self._previous = placed(state["previous"])
        self._velocity = placed(state["velocity"])

    def norm_per_parameter(self) -> float:
        """This replica's L2 norm divided by its number of parameters (paper 004's test)."""
        if not self.params:
            return 0.0
        with torch.no_grad():
            flat = flatten(self.params)
        return float(flat.norm()) / flat.numel()

    def merge(self, weights: Sequence[float], group: dist.ProcessGroup | None = None) -> None:
        """Replace every rank's replica by the merged model (call on all ranks together)."""
        weight = float(weights[self.rank])
        with torch.no_grad():
            if self.params:
                merged = flatten(self.params) * weight
                _all_reduce(merged, group)
                assert self._global is not None and self._previous is not None
                if self.outer_lr is not None:
                    merged, self._velocity = outer_step(
                        self._global, merged, self._velocity, self.outer_lr
                    )
                elif self.gamma > 0:
                    merged = momentum_merge(merged, self._global, self._previous, self.gamma)
                self._previous, self._global = self._global, merged
                unflatten_(merged, self.params)
        weighted_average_(self.buffers, weight, float(sum(weights)), group)


def optimizer_state_tensors(
    optimizers: Sequence[torch.optim.Optimizer],
) -> tuple[list[torch.Tensor], list[float]]:
    """The per-parameter state of ``optimizers`` that a merge averages with the parameters:
    every floating-point tensor shaped like its parameter (SGD's momentum buffer, Adam's
    moments), in the optimizers' parameter order and each state's key order; step counters
    and other scalars are left out. Also its layout, ``[count, elements, sum of (position
    + 1) * elements]``: ranks merge the state only where every rank's layout is the same (a
    rank that has not yet stepped some parameter holds less), so no all-reduce mismatches."""
    tensors: list[torch.Tensor] = []
    position = elements = weighted = 0
    for optimizer in optimizers:
        raw = getattr(optimizer, "_optimizer", optimizer)  # a LightningOptimizer's
        for group in raw.param_groups:
            for param in group["params"]:
                position += 1
                state = raw.state.get(param, {})
                for key in sorted(state):
                    value = state[key]
                    if (
                        isinstance(value, torch.Tensor)
                        and value.is_floating_point()
                        and value.shape == param.shape
                    ):
                        tensors.append(value)
                        elements += value.numel()
                        weighted += position * value.numel()
    return tensors, [float(len(tensors)), float(elements), float(weighted)]


def flatten(tensors: Sequence[torch.Tensor]) -> torch.Tensor:
    """``tensors`` as one new vector on the first one's device, in float32 (float64 if any of
    them is): a merge never sums at bfloat16's or float16's precision, and tensors of mixed
    dtypes are not promoted when written back (``unflatten_``)."""
    wide = any(t.dtype == torch.float64 for t in tensors)
    dtype, device = (torch.float64 if wide else torch.float32), tensors[0].device
    return torch.cat([t.detach().reshape(-1).to(device=device, dtype=dtype) for t in tensors])


def unflatten_(vector: torch.Tensor, tensors: Sequence[torch.Tensor]) -> None:
    """Copy ``vector`` (of ``flatten``) back into ``tensors`` in place, each in its own dtype
    and on its own device."""
    with torch.no_grad():
        offset = 0
        for tensor in tensors:
            tensor.copy_(vector[offset : offset + tensor.numel()].view_as(tensor))
            offset += tensor.numel()


def _all_reduce(tensor: torch.Tensor, group: dist.ProcessGroup | None) -> None:
    if dist.is_initialized() and dist.get_world_size(group) > 1:
        dist.all_reduce(tensor, group=group)


def weighted_average_(
    tensors: Sequence[torch.Tensor],
    weight: float,
    total: float,
    group: dist.ProcessGroup | None = None,
) -> None:
    """Replace ``tensors`` on every rank by ``sum_k weight_k * tensors_k / total``.

    One all-reduce over all the tensors flattened together (``flatten``: float32, each
    tensor keeping its dtype); call on every rank, each with its own ``weight`` and the
    common ``total``.
    """
    if not tensors:
        return
    with torch.no_grad():
        averaged = flatten(tensors) * (weight / total)
        _all_reduce(averaged, group)
        unflatten_(averaged, tensors)
