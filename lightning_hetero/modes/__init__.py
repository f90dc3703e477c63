"""Training modes: one module each, one registry entry each.

``HeteroStrategy(mode=...)`` builds its mode with ``build_mode`` and hands every lifecycle
hook to it (see ``Mode``). A new mode is a new module with a
``Mode`` subclass and one entry in ``MODES``.
"""

from lightning_hetero.modes.asynchronous import ParameterServerMode
from lightning_hetero.modes.base import (
    OPTION_GROUPS,
    MergeOptions,
    Mode,
    ModeOptions,
    OptionGroup,
    Replan,
    ServerOptions,
    TimeProbe,
)
from lightning_hetero.modes.bsp import SynchronousMode
from lightning_hetero.modes.dual import DualBatchMode
from lightning_hetero.modes.local import LocalSGDMode
from lightning_hetero.modes.sharded import ShardedMode
from lightning_hetero.planning import Controller, make_controller
from lightning_hetero.planning.base import Deadband
from lightning_hetero.planning.dual import DualBatchController

__all__ = [
    "MODES",
    "OPTION_GROUPS",
    "VARIANTS",
    "DualBatchMode",
    "LocalSGDMode",
    "MergeOptions",
    "Mode",
    "ModeOptions",
    "OptionGroup",
    "ParameterServerMode",
    "Replan",
    "ServerOptions",
    "ShardedMode",
    "SynchronousMode",
    "TimeProbe",
    "build_mode",
]

#: ``mode=`` values and their classes.
MODES: dict[str, type[Mode]] = {
    SynchronousMode.name: SynchronousMode,
    ParameterServerMode.name: ParameterServerMode,
    LocalSGDMode.name: LocalSGDMode,
}
#: Variants of a mode that a kind of controller selects: ``(mode name, controller class)``.
VARIANTS: dict[tuple[str, type[Controller]], type[Mode]] = {
    (ParameterServerMode.name, DualBatchController): DualBatchMode,
}


def build_mode(
    name: str,
    controller: str | Controller | None,
    deadband: Deadband,
    options: ModeOptions,
    modes: dict[str, type[Mode]] | None = None,
    variants: dict[tuple[str, type[Controller]], type[Mode]] | None = None,
) -> Mode:
    """The mode object for ``mode=name``, with its controller, after checking the options.

    ``controller``: a name (built with ``deadband``), an instance, or ``None`` for the mode's
    default. ``modes`` and ``variants``: an engine's own registries (default: ``MODES`` and
    ``VARIANTS``, DDP's). A controller listed in ``variants`` selects that variant of the mode
    (the parameter server with a
    [`DualBatchController`][lightning_hetero.planning.dual.DualBatchController]
    runs dual batch sizes).
    """
    modes = MODES if modes is None else modes
    variants = VARIANTS if modes is MODES and variants is None else variants or {}
    try:
        cls = modes[name]
    except KeyError:
        raise ValueError(f"Unknown mode {name!r}; expected one of {list(modes)}.") from None
    if controller is None:
        controller = cls.controller_name(options)
    if isinstance(controller, str):
        controller = make_controller(controller, deadband=deadband)
    elif not isinstance(controller, Controller):
        raise TypeError(
            "`controller` must be a name or a Controller instance,"
            f" got {type(controller).__name__}."
        )
    for (mode, kind), variant in variants.items():
        if mode == name and isinstance(controller, kind):
            variant.check_options(options, controller)  # the variant's own flags and checks
            return variant(controller, options)
    cls.check_options(options, controller)
    for (mode, kind), variant in VARIANTS.items():  # a variant's controller under another mode
        if isinstance(controller, kind):
            raise ValueError(
                f"{type(controller).__name__} runs under mode={mode!r} only: use mode={mode!r}"
                f" with {variant.option_text()}, got {cls.option_text()}."
            )
    return cls(controller, options)
