"""Ray Train: per-rank batch sizes for workers that Ray places and restarts.

``ray.train.lightning.prepare_trainer`` accepts Ray's own strategies only, so these are
[`HeteroStrategy`][lightning_hetero.HeteroStrategy] and
[`HeteroFSDPStrategy`][lightning_hetero.HeteroFSDPStrategy]
made Ray strategies (the FSDP2 one through this module's
[`prepare_trainer`][lightning_hetero.integrations.ray.prepare_trainer]: Ray has no
FSDP2 strategy): the plan, re-planning, weighted gradients, checkpoints and a resume on
another worker count work as under torchrun. Inside ``TorchTrainer``'s training function:

    import lightning.pytorch as pl
    from ray.train.lightning import RayTrainReportCallback
    from lightning_hetero.integrations.ray import (
        RayHeteroStrategy, checkpoint_path, prepare_trainer
    )

    trainer = prepare_trainer(pl.Trainer(strategy=RayHeteroStrategy(), devices="auto",
                                         callbacks=[RayTrainReportCallback()],
                                         enable_checkpointing=False))
    with checkpoint_path() as ckpt_path:  # None on a first start
        trainer.fit(model, ckpt_path=ckpt_path)

Needs the ``ray`` extra (``pip install 'lightning_hetero[ray]'``). Ray builds its Lightning
integration on ``lightning.pytorch`` whenever ``lightning`` is installed, which this package
requires, so there is no ``pytorch_lightning`` twin: a ``pytorch_lightning`` Trainer or
LightningModule is refused with what to import instead. See [Ray](../ray.md).
"""

import os
from collections.abc import Iterator
from contextlib import contextmanager
from typing import Any

try:
    import ray.train
    import ray.train.torch
    from ray.train.lightning import (
        RayDDPStrategy,
        RayLightningEnvironment,
        RayTrainReportCallback,
    )
    from ray.train.lightning import prepare_trainer as _ray_prepare_trainer
except ImportError as error:
    raise ImportError(
        "lightning_hetero.integrations.ray needs Ray Train, which is not installed (or failed to"
        f" import: {error}). Install the extra: pip install 'lightning_hetero[ray]'."
    ) from error

import lightning.pytorch as pl
import torch
from lightning.fabric.plugins.environments import ClusterEnvironment
from lightning.pytorch.strategies import DDPStrategy
from typing_extensions import override

from lightning_hetero._lightning import chosen_by_trainer
from lightning_hetero._namespaces import PYTORCH_LIGHTNING, SameCopy, namespace_of
from lightning_hetero.callback import HeteroCallback
from lightning_hetero.fsdp import HeteroFSDPStrategy
from lightning_hetero.strategy import HeteroStrategy

__all__ = ["RayHeteroFSDPStrategy", "RayHeteroStrategy", "checkpoint_path", "prepare_trainer"]

if not issubclass(RayDDPStrategy, DDPStrategy):  # Ray found no `lightning` when it loaded
    raise ImportError(
        "ray.train.lightning is built on pytorch_lightning here, but lightning_hetero's Ray"
        " strategies are built on lightning.pytorch: install `lightning` (a dependency of"
        " lightning_hetero) in the environment of Ray's workers."
    )

#: Modes that open a channel of their own besides the process group, at the job's main address.
_SIDE_CHANNEL_MODES = {"async": "the parameter server's RPC", "local": "the shared claim counter"}


def _other_copy(name: str, what: str) -> TypeError:
    return TypeError(
        f"{name} is built on lightning.pytorch, the Lightning copy that Ray Train's Lightning"
        f" integration (ray.train.lightning) uses whenever `lightning` is installed; {what} is"
        " from pytorch_lightning. Import the Trainer and the LightningModule from"
        " lightning.pytorch (`import lightning.pytorch as pl`) in Ray's training function."
    )


class _OnRay:
    """What both Ray strategies add: Ray's device, sampler arguments and environment, Ray's
    Lightning copy, and Ray's report callback after the epoch's re-planning."""

    def _refuse_environment(self, environment: Any) -> None:
        """Refuse a cluster environment given to the strategy that is not Ray's."""
        if environment is not None and not isinstance(environment, RayLightningEnvironment):
            raise ValueError(
                f"{type(self).__name__} runs on the workers Ray Train starts and ranks, so it"
                f" needs Ray's cluster environment, got {type(environment).__name__}. Leave"
                " `cluster_environment` out, or give"
                " `plugins=[ray.train.lightning.RayLightningEnvironment()]` as Ray's guide does."
            )

    @property
    def cluster_environment(self) -> ClusterEnvironment | None:
        """Ray's ``RayLightningEnvironment``: the one given (Ray's guide passes it in the
        Trainer's ``plugins``), else a new one."""
        return self._ray_environment

    @cluster_environment.setter
    def cluster_environment(self, environment: ClusterEnvironment | None) -> None:
        # None until the Trainer assigns one, so that Ray's guide line (the environment in
        # `plugins`) does not set it twice; where the user gave none, the Trainer assigns what
        # it detects (a LightningEnvironment, say), which does not know Ray's ranks
        if environment is not None and chosen_by_trainer(environment):
            environment = RayLightningEnvironment()
        self._refuse_environment(environment)
        self._ray_environment = environment

    @property
    def root_device(self) -> torch.device:
        """The device Ray assigned to this worker (``ray.train.torch.get_device()``)."""
        return ray.train.torch.get_device()

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        # validation, test and predict loaders: one shard per Ray worker
        return {"num_replicas": self.world_size, "rank": self.global_rank}  # type: ignore[attr-defined]

    @property
    def accelerator(self) -> Any:
        return SameCopy.accelerator.fget(self)  # type: ignore[attr-defined]

    @accelerator.setter
    def accelerator(self, accelerator: Any) -> None:
        # the Trainer's first call on the strategy: pytorch_lightning's Trainer stops here
        if namespace_of(accelerator) == PYTORCH_LIGHTNING:
            raise _other_copy(type(self).__name__, "the Trainer")
        SameCopy.accelerator.fset(self, accelerator)  # type: ignore[attr-defined]

    def connect(self, model: Any) -> Any:
        if namespace_of(model) == PYTORCH_LIGHTNING:
            raise _other_copy(type(self).__name__, f"{type(model).__qualname__}")
        return super().connect(model)  # type: ignore[misc]

    def setup_environment(self) -> None:
        self._check_side_channel()
        super().setup_environment()  # type: ignore[misc]
        module = self.lightning_module  # type: ignore[attr-defined]
        if module is not None and getattr(module, "_trainer", None) is not None:
            _report_after_boundary(module.trainer.callbacks)

    def _check_side_channel(self) -> None:
        mode = getattr(self, "mode", "bsp")
        channel = _SIDE_CHANNEL_MODES.get(mode)
        if channel is not None and "MASTER_ADDR" not in os.environ:
            raise RuntimeError(
                f"{type(self).__name__}(mode={mode!r}) runs {channel} at the job's main"
                " address (MASTER_ADDR), which Ray Train sets with TorchConfig(init_method='env'),"
                " its default. This run has none: leave TorchTrainer's `torch_config` at"
                " init_method='env', or train with mode='bsp'."
            )


def _report_after_boundary(callbacks: list[pl.Callback]) -> None:
    """Move the [`HeteroCallback`][lightning_hetero.HeteroCallback] before the first Ray report
    callback,
    so that the checkpoint Ray reports at an epoch end holds that epoch's boundary (the plan,
    the controller and each rank's throughput, which a resume on another worker count needs)."""
    reports = [i for i, cb in enumerate(callbacks) if isinstance(cb, RayTrainReportCallback)]
    ours = [i for i, cb in enumerate(callbacks) if isinstance(cb, HeteroCallback)]
    if reports and ours and ours[0] > reports[0]:
        callbacks.insert(reports[0], callbacks.pop(ours[0]))


class RayHeteroStrategy(_OnRay, HeteroStrategy, RayDDPStrategy):
    """[`HeteroStrategy`][lightning_hetero.HeteroStrategy] for Ray Train (a ``RayDDPStrategy``).

    Every option and mode of ``HeteroStrategy`` (``"bsp"``, ``"async"``, ``"local"``) works as
    under torchrun. Ray Train creates the process group before Lightning starts, so the
    backend and its timeout belong to ``TorchTrainer(torch_config=TorchConfig(backend=...,
    timeout_s=...))``; ``timeout`` here should equal ``timeout_s`` (both default to 30 min):
    it is the time errors name. The cluster environment is Ray's ``RayLightningEnvironment``:
    the one in ``Trainer(plugins=[...])`` (Ray's guide line works unchanged), else a new one;
    another is refused by name. The device is the one Ray assigned to the worker.
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        for name, default in (("process_group_backend", None), ("start_method", "popen")):
            if kwargs.get(name, default) != default:
                raise ValueError(
                    f"RayHeteroStrategy does not take {name}={kwargs[name]!r}: Ray Train starts"
                    " the workers and their process group before Lightning runs. Choose the"
                    " backend with TorchTrainer(torch_config=TorchConfig(backend=...)) and"
                    f" leave {name} out."
                )
        self._refuse_environment(kwargs.get("cluster_environment"))
        super().__init__(*args, **kwargs)


class RayHeteroFSDPStrategy(_OnRay, HeteroFSDPStrategy):
    """[`HeteroFSDPStrategy`][lightning_hetero.HeteroFSDPStrategy] (FSDP2) for Ray Train.

    Ray's own ``prepare_trainer`` knows FSDP1's ``RayFSDPStrategy`` only (Ray has no FSDP2
    strategy): prepare the Trainer with
    [`prepare_trainer`][lightning_hetero.integrations.ray.prepare_trainer] from this module, which
    makes
    Ray's checks for it. The options are those of
    ``HeteroFSDPStrategy``; ``data_parallel_size="auto"`` shards over all Ray workers. The
    backend and timeout belong to ``TorchConfig``, as for
    [`RayHeteroStrategy`][lightning_hetero.integrations.ray.RayHeteroStrategy].
    """

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        if kwargs.get("process_group_backend") is not None:
            raise ValueError(
                "RayHeteroFSDPStrategy does not take process_group_backend="
                f"{kwargs['process_group_backend']!r}: Ray Train starts the process group."
                " Choose the backend with TorchTrainer(torch_config=TorchConfig(backend=...))."
            )
        super().__init__(*args, **kwargs)

    @override
    def setup_environment(self) -> None:
        if self._data_parallel_size == "auto":  # every Ray worker, not nodes x local devices
            self._data_parallel_size = self.world_size
        super().setup_environment()


def prepare_trainer(trainer: pl.Trainer) -> pl.Trainer:
    """``ray.train.lightning.prepare_trainer``, which also takes a
    [`RayHeteroFSDPStrategy`][lightning_hetero.integrations.ray.RayHeteroFSDPStrategy], with an
    error that names the strategy to use when
    ``trainer`` runs a plain ``HeteroStrategy`` or ``HeteroFSDPStrategy``."""
    strategy = trainer.strategy
    if isinstance(strategy, HeteroStrategy | HeteroFSDPStrategy) and not isinstance(
        strategy, _OnRay
    ):
        ray_class = (
            "RayHeteroFSDPStrategy"
            if isinstance(strategy, HeteroFSDPStrategy)
            else ("RayHeteroStrategy")
        )
        raise TypeError(
            f"This Trainer's strategy is a {type(strategy).__name__}, which Ray Train does not"
            f" run (Ray starts the workers and the process group itself). Use"
            f" `lightning_hetero.integrations.ray.{ray_class}` with the same options."
        )
    if isinstance(strategy, RayHeteroFSDPStrategy):
        # Ray's prepare_trainer checks that the strategy is one of its classes, of which FSDP1's
        # RayFSDPStrategy is the sharded one, and that the cluster environment is Ray's (and
        # records a usage tag); the second check is Ray's for this strategy too
        # (tests/ray/test_ray_api.py fails when Ray's function does more)
        environment = strategy.cluster_environment
        if environment is not None and not isinstance(environment, RayLightningEnvironment):
            raise RuntimeError(
                f"RayHeteroFSDPStrategy runs with Ray's cluster environment"
                f" (ray.train.lightning.RayLightningEnvironment), but this Trainer's is a"
                f" {type(environment).__name__}: leave the `plugins` without a cluster"
                " environment."
            )
        return trainer
    return _ray_prepare_trainer(trainer)


@contextmanager
def checkpoint_path(name: str = RayTrainReportCallback.CHECKPOINT_NAME) -> Iterator[str | None]:
    """The Lightning checkpoint file in Ray's latest checkpoint (``ray.train.get_checkpoint()``),
    for ``trainer.fit(..., ckpt_path=...)``; ``None`` when the run has none (a first start).

    A restart of the worker group, on the same or another number of workers, resumes from it:
    the plan continues, or is made anew from the saved throughputs (see [Ray](../ray.md)).
    The file stays while the context is open (a remote checkpoint is downloaded into a
    temporary folder).
    """
    checkpoint = ray.train.get_checkpoint()
    if checkpoint is None:
        yield None
        return
    with checkpoint.as_directory() as folder:
        path = os.path.join(folder, name)
        if not os.path.isfile(path):
            raise FileNotFoundError(
                f"Ray's latest checkpoint ({checkpoint.path}) has no file {name!r}: pass the name"
                " its report callback saves (RayTrainReportCallback saves"
                f" {RayTrainReportCallback.CHECKPOINT_NAME!r}) as checkpoint_path(name=...)."
            )
        yield path
