"""Controllers selectable by name."""

import inspect
from typing import Any

from lightning_hetero._docstrings import plain_docstring
from lightning_hetero.planning.base import Controller
from lightning_hetero.planning.dual import DualBatchController
from lightning_hetero.planning.lbbsp import LBBSPController
from lightning_hetero.planning.model import ModelController
from lightning_hetero.planning.proportional import ProportionalController
from lightning_hetero.planning.static import StaticController
from lightning_hetero.planning.stepwise import StepwiseController
from lightning_hetero.planning.updates import UpdatesController

__all__ = ["CONTROLLERS", "make_controller"]

#: Controller classes by the name ``HeteroStrategy(controller=...)`` accepts.
CONTROLLERS: dict[str, type[Controller]] = {
    StaticController.name: StaticController,
    ProportionalController.name: ProportionalController,
    StepwiseController.name: StepwiseController,
    UpdatesController.name: UpdatesController,
    LBBSPController.name: LBBSPController,
    DualBatchController.name: DualBatchController,
    ModelController.name: ModelController,
}
for _controller in CONTROLLERS.values():  # LightningCLI's --help prints their docstrings
    plain_docstring(_controller)


def make_controller(name: str, **options: Any) -> Controller:
    """Build a controller by name; ``options`` the controller does not take are ignored,
    and so is ``deadband="auto"`` for one without ``auto_deadband`` (it
    keeps its own default)."""
    try:
        cls = CONTROLLERS[name]
    except KeyError:
        raise ValueError(
            f"Unknown controller {name!r}; expected one of {sorted(CONTROLLERS)} or a"
            " `lightning_hetero.planning.Controller` instance."
        ) from None
    accepted = dict(inspect.signature(cls).parameters)
    if options.get("deadband") == "auto" and not cls.auto_deadband:
        accepted.pop("deadband", None)
    return cls(**{key: value for key, value in options.items() if key in accepted})
