"""A step's micro-batches under FSDP2 with the collectives of one step (pure torch).

Each rank runs its share of a step as its own number of micro-batches, so every rank must
issue the same collectives whatever that number: those of one ordinary FSDP2 step. In torch
2.13's FSDP2 (``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``) a parameter
group (one per ``fully_shard`` unit) communicates in three places:

- ``unshard`` (before its forward, and before its backward or as a backward prefetch)
  all-gathers the parameters, and is a no-op while they are unsharded;
- ``post_forward`` reshards them unless ``post_forward_mesh_info`` is ``None``
  (``reshard_after_forward=False``; FSDP's root has ``None`` by default: it stays gathered
  from forward to backward);
- ``post_backward`` reduce-scatters the gradients (with the ones accumulated so far) if
  ``reduce_grads``, and reshards if ``reshard_after_backward``; with ``reduce_grads`` off
  it only keeps the unsharded gradients, which survive a reshard.

So an ordinary step issues: an all-gather per unit in forward, one per resharded unit in
backward, and one reduce-scatter per unit. ``UnshardedAccumulation.hold`` turns off all
three switches for every group (what ``set_reshard_after_forward(False)``,
``set_reshard_after_backward(False)`` and ``set_requires_gradient_sync(False)`` set) while
the step's micro-batches before the last run: the first forward all-gathers each unit
once, and nothing else communicates. ``release``, before the last micro-batch's forward,
puts each group's own values back (saved per group: the root's ``None`` stays ``None``, a
user's ``reshard_after_forward`` stays as given): that forward finds the units gathered and
reshards them as an ordinary forward does, and its backward all-gathers and
reduce-scatters exactly as an ordinary backward. A rank whose share is one micro-batch
runs an ordinary step, so it issues the same collectives in the same order.

The cost is memory: from the first forward to the last one, every unit's parameters are
unsharded at once (the full model, not one unit at a time), beside an unsharded gradient
for every parameter (FSDP's accumulation without communication).
"""

from __future__ import annotations

from typing import Any

import torch
from torch import nn

from lightning_hetero._fsdp import fsdp_param_groups

__all__ = ["UnshardedAccumulation"]

#: The ``FSDPParamGroup`` attributes that decide a group's collectives (see the docstring).
SWITCHES = ("post_forward_mesh_info", "reduce_grads", "all_reduce_grads", "reshard_after_backward")
#: Their values while the micro-batches before a step's last one run.
HELD = {
    "post_forward_mesh_info": None,
    "reduce_grads": False,
    "all_reduce_grads": False,
    "reshard_after_backward": False,
}


class UnshardedAccumulation:
    """Keep an FSDP2 model gathered, and its gradients local, across a step's micro-batches."""

    def __init__(self) -> None:
        # each group with its own values of ``SWITCHES`` while held; ``None``: not held
        self._saved: list[tuple[Any, dict[str, Any]]] | None = None

    @property
    def holding(self) -> bool:
        """Whether the switches are held (between a step's first and last micro-batch)."""
        return self._saved is not None

    def hold(self, module: nn.Module) -> None:
        """From the next forward on, gather each unit of ``module`` once and communicate
        nothing else (no-op while held)."""
        if self._saved is not None:
            return
        _lazy_init_roots(module)  # FSDP's root default is set there: save that, not the one before
        groups = fsdp_param_groups(module)
        missing = sorted({name for g in groups for name in SWITCHES if not hasattr(g, name)})
        if missing:
            raise RuntimeError(
                f"hetero: `micro_batch_size` under HeteroFSDPStrategy sets FSDP2's {missing},"
                f" which this torch ({torch.__version__}) does not have: upgrade torch"
                " (written against 2.13), or remove `micro_batch_size`."
            )
        self._saved = [(g, {name: getattr(g, name) for name in SWITCHES}) for g in groups]
        for group in groups:
            for name, value in HELD.items():
                setattr(group, name, value)

    def release(self) -> None:
        """Put each group's own switches back (no-op unless held)."""
        saved, self._saved = self._saved, None
        for group, values in saved or ():
            for name, value in values.items():
                setattr(group, name, value)

    def abandon(self, module: nn.Module) -> None:
        """After a failed micro-batch: ``release`` and free every unit's gathered parameters
        now (no collective), also where the step's last forward had released them already."""
        self.release()
        for group in fsdp_param_groups(module):
            group.reshard()


def _lazy_init_roots(module: nn.Module) -> None:
    """Run FSDP2's lazy initialization of each outermost FSDP module under ``module`` (a
    root: the one it would run in its first forward), so that it sets the root's defaults."""
    roots: list[str] = []
    for name, sub in module.named_modules():
        get_state = getattr(sub, "_get_fsdp_state", None)
        if not callable(get_state) or any(name.startswith(f"{r}.") or r == "" for r in roots):
            continue
        roots.append(name)
        get_state()._lazy_init()  # a no-op once done
