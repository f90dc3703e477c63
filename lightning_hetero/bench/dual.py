"""Dual batch size benchmark (paper 003): uniform large batch vs dual batch vs hybrid.

Four workers on the parameter server train the digits CNN on images upsampled to 32x32,
with the same stage learning rates in every configuration (``stages``):

- ``uniform-large``: every worker uses the large batch ``B_L`` on ``d / n`` samples
  (``DualBatchController(small_workers=0)``, the paper's baseline);
- ``dual``: dual batch size learning with ``small_workers`` small-batch workers;
- ``hybrid``: dual batch size learning plus cyclic progressive learning: every stage
  trains first at 24x24 (less dropout, larger batches) and then at 32x32.

Runs and the report reuse the mode benchmark (``lightning_hetero.bench.modes``).
"""

from typing import Any

__all__ = ["DUAL_CONFIGS", "dual_configs", "stages"]

#: Learning rate and share of the epochs of each stage (paper 003 trains 80/40/20 epochs).
STAGES = ((0.05, 4), (0.01, 2), (0.002, 1))


def stages(
    epochs: int, resolutions: tuple[int, ...] = (32,), dropouts: tuple[float, ...] = (0.2,)
) -> list[dict[str, Any]]:
    """The stage schedule as ``ProgressiveSchedule`` stage dicts for ``epochs`` epochs.

    The epochs are split among ``STAGES`` in proportion to their shares (each stage
    gets at least one sub-stage epoch per resolution, the first stage takes the rest) and
    each stage cycles through ``resolutions`` (with ``dropouts``) in equal parts.

    Example:
        >>> [[s["epochs"] for s in st["substages"]] for st in stages(14, (24, 32), (0.1, 0.2))]
        [[4, 4], [2, 2], [1, 1]]
    """
    if len(resolutions) != len(dropouts) or not resolutions:
        raise ValueError("Give one dropout per resolution.")
    cycle = len(resolutions)
    total_share = sum(share for _, share in STAGES)
    per_stage = [max(round(epochs * share / total_share), cycle) for _, share in STAGES]
    per_stage[0] += epochs - sum(per_stage)
    if per_stage[0] < cycle:
        raise ValueError(
            f"{epochs} epochs are too few for {len(STAGES)} stages of {cycle} sub-stages;"
            f" use at least {cycle * len(STAGES)}."
        )
    schedule = []
    for (lr, _), count in zip(STAGES, per_stage):
        parts = [count // cycle + (i < count % cycle) for i in range(cycle)]
        substages = [
            {"epochs": n, "resolution": r, "dropout": p}
            for n, r, p in zip(parts, resolutions, dropouts)
        ]
        schedule.append({"lr": lr, "substages": substages})
    return schedule


#: The compared configurations (names for ``--configs``).
DUAL_CONFIGS = ("uniform-large", "dual", "hybrid")


def dual_configs(
    epochs: int,
    small_workers: int = 2,
    extra_time_ratio: float = 1.05,
    names: tuple[str, ...] | list[str] = DUAL_CONFIGS,
) -> dict[str, dict[str, Any]]:
    """RunConfig fields of the configurations ``names`` (only those are built, so that a
    run without ``hybrid`` may have fewer epochs than its cyclic schedule needs)."""

    def dual(small: int, schedule: list[dict[str, Any]]) -> dict[str, Any]:
        options = {"small_workers": small, "extra_time_ratio": extra_time_ratio}
        return {
            "controller": "dual",
            "controller_options": options,
            "extra": {"mode": "async"},
            "progressive": schedule,
        }

    build = {
        "uniform-large": lambda: dual(0, stages(epochs)),
        "dual": lambda: dual(small_workers, stages(epochs)),
        "hybrid": lambda: dual(small_workers, stages(epochs, (24, 32), (0.1, 0.2))),
    }
    return {name: build[name]() for name in names}
