"""Tests for lightning_hetero/planning/registry.py: controllers selected by name."""

import pytest

from lightning_hetero.planning.base import Controller
from lightning_hetero.planning.model import ModelController
from lightning_hetero.planning.proportional import ProportionalController
from lightning_hetero.planning.registry import CONTROLLERS, make_controller
from lightning_hetero.planning.static import StaticController


@pytest.mark.parametrize(
    ("name", "cls"),
    [
        ("static", StaticController),
        ("proportional", ProportionalController),
        ("model", ModelController),
    ],
)
def test_known_name_builds_its_class(name: str, cls: type[Controller]) -> None:
    assert type(make_controller(name)) is cls


def test_registry_keys_are_the_controllers_own_names() -> None:
    assert all(cls.name == name for name, cls in CONTROLLERS.items())
    assert all(issubclass(cls, Controller) for cls in CONTROLLERS.values())


def test_deadband_and_other_options_are_passed_through() -> None:
    controller = make_controller("proportional", deadband=0.2, throughput_drop=0.3)
    assert isinstance(controller, ProportionalController)
    assert controller.deadband == 0.2
    assert controller.throughput_drop == 0.3


def test_options_a_controller_does_not_take_are_ignored() -> None:
    assert isinstance(make_controller("static", deadband=0.2), StaticController)


def test_invalid_option_value_still_raises_from_the_controller() -> None:
    with pytest.raises(ValueError, match="deadband"):
        make_controller("proportional", deadband=1.5)


def test_each_call_builds_a_fresh_controller() -> None:
    assert make_controller("proportional") is not make_controller("proportional")


def test_unknown_name_raises_value_error_listing_known_names() -> None:
    with pytest.raises(ValueError, match="Unknown controller 'pid'") as excinfo:
        make_controller("pid")
    for name in CONTROLLERS:
        assert repr(name) in str(excinfo.value)
