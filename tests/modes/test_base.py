"""ModeOptions: the strategy's options that modes read."""

import pytest

from lightning_hetero.modes import ModeOptions


def test_mode_options_are_taken_by_keyword_only() -> None:
    # several neighbours share a type (delta, perturb_threshold, gamma): swapped positions
    # would still type-check, so positions are refused
    with pytest.raises(TypeError, match="positional"):
        ModeOptions("epoch", True)  # type: ignore[misc]
    options = ModeOptions(delta=0.2, gamma=0.5)
    assert (options.delta, options.gamma, options.perturb_threshold) == (0.2, 0.5, 0.1)
