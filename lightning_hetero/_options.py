"""Keyword arguments a strategy does not know, refused when it is built.

``HeteroStrategy`` forwards its extra keyword arguments to ``DistributedDataParallel`` as
``DDPStrategy`` does; a misspelt option would otherwise reach ``DistributedDataParallel(...)``
only when ``fit`` wraps the model, minutes after the typo.
"""

import difflib
import inspect
from collections.abc import Callable, Iterable

import torch

# set by Lightning's DDPStrategy itself when it wraps the model
_SET_BY_LIGHTNING = ("self", "module", "device_ids")


def ddp_keywords() -> list[str]:
    """The keyword arguments ``HeteroStrategy`` may forward to ``DistributedDataParallel``:
    those of the installed torch's constructor, less those Lightning passes itself."""
    parameters = inspect.signature(torch.nn.parallel.DistributedDataParallel.__init__).parameters
    return [name for name in parameters if name not in _SET_BY_LIGHTNING]


def keywords(function: Callable) -> list[str]:
    """The named parameters of ``function`` (``self``, ``*args`` and ``**kwargs`` left out)."""
    named = (inspect.Parameter.POSITIONAL_OR_KEYWORD, inspect.Parameter.KEYWORD_ONLY)
    parameters = inspect.signature(function).parameters.values()
    return [p.name for p in parameters if p.kind in named and p.name != "self"]


def refuse_unknown(owner: str, given: Iterable[str], valid: Iterable[str], where: str) -> None:
    """Raise ``TypeError`` naming the first of ``given`` not in ``valid``, and the closest valid
    name when one is close. ``where``: what the valid names are, for the message."""
    valid = list(valid)
    unknown = sorted(set(given) - set(valid))
    if not unknown:
        return
    name = unknown[0]
    close = difflib.get_close_matches(name, valid, n=1)
    hint = f" Did you mean {close[0]!r}?" if close else ""
    more = f" (also unknown: {unknown[1:]})" if len(unknown) > 1 else ""
    raise TypeError(f"{owner} got an unknown option {name!r}{more}.{hint} Its options: {where}.")
