import random
from collections.abc import Callable

import pytest

from lightning_hetero.planning import BatchLimits, proportional_split

#: ``rng -> (limits, plan within them, compute times)``.
Case = Callable[[random.Random], tuple[BatchLimits, list[int], list[float]]]


def _random_case(rng: random.Random) -> tuple[BatchLimits, list[int], list[float]]:
    world_size = rng.randint(1, 16)
    lower = rng.randint(1, 8)
    upper = lower + rng.randint(0, 200)
    global_batch = rng.randint(world_size * lower, world_size * upper)
    limits = BatchLimits.build(world_size, global_batch, lower, upper)
    current = proportional_split(
        [rng.uniform(0.5, 2.0) for _ in range(world_size)],
        global_batch,
        limits.min_batch_size,
        limits.max_batch_size,
    )
    compute_s = [rng.uniform(0.01, 5.0) for _ in range(world_size)]
    return limits, current, compute_s


@pytest.fixture
def random_case() -> Case:
    """Draws random limits (1-16 ranks, scalar bounds), a valid plan and compute times."""
    return _random_case
