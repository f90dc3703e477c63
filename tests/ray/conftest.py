"""Ray Train tests: a local Ray cluster on this machine's CPUs, gloo, marked ``ray``.

``make test-ray`` installs the ``ray`` extra and runs them; without Ray installed they are not
collected. One cluster serves the whole session (starting one takes a while).
"""

import importlib.util
import os
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

HERE = Path(__file__).resolve().parent
os.environ.setdefault("RAY_USAGE_STATS_ENABLED", "0")  # no usage reports from tests

if importlib.util.find_spec("ray") is None:
    collect_ignore_glob = ["test_*.py"]  # the `ray` extra is not installed


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in item.path.parents:
            item.add_marker(pytest.mark.ray)


@pytest.fixture(scope="session")
def ray_cluster() -> Iterator[Any]:
    """A local Ray cluster with 3 logical CPUs (a worker reserves one; the machine may have
    fewer cores: the workers then share them)."""
    import ray

    ray.init(num_cpus=3, include_dashboard=False, configure_logging=False)
    try:
        yield ray
    finally:
        ray.shutdown()


def fit_on_ray(
    loop: Any,
    config: dict[str, Any],
    workers: int,
    storage: Path,
) -> Any:
    """Run ``loop`` on ``workers`` Ray Train workers (1 CPU each); returns Ray's result. A run
    in the ``storage`` of an earlier one continues it: ``ray.train.get_checkpoint()`` gives the
    workers its latest checkpoint (Ray Train's way of restoring a run)."""
    from ray import cloudpickle
    from ray.train import RunConfig, ScalingConfig
    from ray.train.torch import TorchTrainer

    from tests.ray import workloads

    cloudpickle.register_pickle_by_value(workloads)  # workers need not import the tests
    trainer = TorchTrainer(
        loop,
        train_loop_config=config,
        scaling_config=ScalingConfig(num_workers=workers, resources_per_worker={"CPU": 1}),
        run_config=RunConfig(storage_path=str(storage), name="run"),
    )
    return trainer.fit()
