"""Make Lightning build ``HeteroStrategy`` wherever it would build ``DDPStrategy``.

Loaded by every Python process that has this folder on ``PYTHONPATH`` (``site`` imports
``sitecustomize`` at start-up), so the ranks Lightning launches (``popen`` re-runs the
command, ``spawn`` starts fresh interpreters) are patched as well. Nothing happens until
``lightning.pytorch`` is imported: then ``lightning_hetero`` is imported and

* ``DDPStrategy(...)`` returns a ``HeteroStrategy`` built with the same arguments
  (``DDPStrategy.__new__``; subclasses of ``DDPStrategy`` are left alone). Every ``"ddp*"``
  registry name (``"ddp"``, ``"ddp_spawn"``, ``"ddp_fork"``, ``"ddp_notebook"``,
  ``"ddp_find_unused_parameters_true"``, ...) builds its ``DDPStrategy`` through the
  registry, so it gets a ``HeteroStrategy`` too, as does ``strategy="auto"`` on several
  devices;
* with ``LIGHTNING_HETERO_UPSTREAM_WORLD1=1``: a ``Trainer`` that accumulates gradients
  (``accumulate_grad_batches != 1`` or a ``GradientAccumulationScheduler`` among its
  callbacks) on one device with ``strategy="auto"`` gets ``"ddp"``, i.e. a
  ``HeteroStrategy`` at world size 1, instead of ``SingleDeviceStrategy``.

Used by tools/upstream/run.py; see tools/upstream/README.md.
"""

import contextvars
import functools
import importlib.abc
import importlib.util
import os
import sys

WORLD1 = "LIGHTNING_HETERO_UPSTREAM_WORLD1"
#: a file: each ``HeteroStrategy`` built in place of a ``DDPStrategy`` appends the test's id
TRACE = "LIGHTNING_HETERO_UPSTREAM_TRACE"
_TARGET = "lightning.pytorch"
_accumulating: contextvars.ContextVar[bool] = contextvars.ContextVar("accumulating", default=False)


def _patch() -> None:
    from lightning.pytorch.strategies import DDPStrategy

    from lightning_hetero import HeteroStrategy

    def __new__(cls, *args, **kwargs):  # noqa: N807
        if cls is not DDPStrategy:
            return object.__new__(cls)
        if os.environ.get(TRACE):
            with open(os.environ[TRACE], "a") as file:  # noqa: PTH123
                test = os.environ.get("PYTEST_CURRENT_TEST", "?").rsplit(" ", 1)[0]
                file.write(f"{test}\t{os.environ.get('LOCAL_RANK', '-')}\n")
        return object.__new__(HeteroStrategy)

    DDPStrategy.__new__ = staticmethod(__new__)
    if os.environ.get(WORLD1) == "1":
        _patch_world1()


def _patch_world1() -> None:
    from lightning.pytorch import Trainer
    from lightning.pytorch.callbacks import GradientAccumulationScheduler
    from lightning.pytorch.strategies import SingleDeviceStrategy
    from lightning.pytorch.trainer.connectors.accelerator_connector import _AcceleratorConnector

    choose = _AcceleratorConnector._choose_strategy

    @functools.wraps(choose)
    def _choose_strategy(self):
        chosen = choose(self)
        if _accumulating.get() and type(chosen) is SingleDeviceStrategy:
            return "ddp"
        return chosen

    _AcceleratorConnector._choose_strategy = _choose_strategy
    init = Trainer.__init__

    @functools.wraps(init)
    def __init__(self, *args, **kwargs):  # noqa: N807
        callbacks = kwargs.get("callbacks") or []
        if not isinstance(callbacks, list | tuple):
            callbacks = [callbacks]
        accumulates = kwargs.get("accumulate_grad_batches", 1) != 1 or any(
            isinstance(c, GradientAccumulationScheduler) for c in callbacks
        )
        token = _accumulating.set(accumulates)
        try:
            init(self, *args, **kwargs)
        finally:
            _accumulating.reset(token)

    Trainer.__init__ = __init__


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs ``_patch`` once ``lightning.pytorch`` has finished importing."""

    def find_spec(self, fullname, path, target=None):
        if fullname != _TARGET:
            return None
        sys.meta_path.remove(self)
        spec = importlib.util.find_spec(fullname)
        if spec is None or spec.loader is None:
            return spec
        execute = spec.loader.exec_module

        def exec_module(module):
            execute(module)
            _patch()

        spec.loader.exec_module = exec_module
        return spec


if _TARGET in sys.modules:
    _patch()
else:
    sys.meta_path.insert(0, _AfterImport())
