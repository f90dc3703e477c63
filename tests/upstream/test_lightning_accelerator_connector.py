"""Lightning's accelerator-connector test of ModelParallelStrategy, run against HeteroFSDPStrategy.

Source: https://github.com/Lightning-AI/pytorch-lightning, tag 2.6.5 (commit be98784a1a03),
path tests/tests_pytorch/trainer/connectors/test_accelerator_connector.py (Apache-2.0, (c) The
Lightning AI team): only `test_precision_selection_model_parallel`, the file's one test of
ModelParallelStrategy, with its `mps_count_0` fixture (from upstream's tests_pytorch/conftest.py).

Changes from upstream: `ModelParallelStrategy()` -> `HeteroFSDPStrategy()`; `RunIf` from
tests/upstream/_support.py; the fixture copied in.
"""

from contextlib import nullcontext

import lightning.fabric
import pytest
from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

from lightning_hetero import HeteroFSDPStrategy
from tests.upstream._support import RunIf


def mock_mps_count(monkeypatch, n: int) -> None:
    monkeypatch.setattr(
        lightning.fabric.accelerators.mps,
        "_get_all_available_mps_gpus",
        lambda: [0] if n > 0 else [],
    )
    monkeypatch.setattr(
        lightning.fabric.accelerators.mps.MPSAccelerator, "is_available", lambda *_: n > 0
    )


@pytest.fixture
def mps_count_0(monkeypatch):
    mock_mps_count(monkeypatch, 0)


@RunIf(min_torch="2.4")
@pytest.mark.parametrize(
    ("precision", "raises"),
    [
        ("32-true", False),
        ("16-true", False),
        ("bf16-true", False),
        ("16-mixed", True),
        ("bf16-mixed", False),
    ],
)
def test_precision_selection_model_parallel(precision, raises, mps_count_0):
    error_context = (
        pytest.raises(ValueError, match=f"does not support .*{precision}")
        if raises
        else nullcontext()
    )
    with error_context:
        _AcceleratorConnector(precision=precision, strategy=HeteroFSDPStrategy())
