"""Time to accuracy: the one computation behind ``bench.modes`` (real runs) and
``bench.mode_sim`` (virtual time), which both import it from here."""

import math
from collections.abc import Sequence
from typing import Any

__all__ = ["figures"]


def _time_to_target(curve: Sequence[Sequence[float]], target: float) -> tuple[float, float]:
    """Training seconds and epochs until the first validation at or above ``target``."""
    for epoch, (train_s, acc, _) in enumerate(curve, start=1):
        if acc >= target:
            return train_s, float(epoch)
    return math.inf, math.inf


def figures(
    runs: dict[str, Any], target: float, baseline: str = "ddp"
) -> dict[str, dict[str, float]]:
    """The report's figures for each successful run of one repeat (``runs[config]``);
    speedups are against the ``baseline`` run's time to target."""
    out: dict[str, dict[str, float]] = {}
    for name, summary in runs.items():
        curve = summary.get("accuracy_curve")
        if not curve:
            continue
        tta, epochs = _time_to_target(curve, target)
        out[name] = {
            "final_acc": curve[-1][1],
            "final_loss": curve[-1][2],
            "train_s": summary["train_s"],
            "tta_s": tta,
            "reached": float(tta < math.inf),
            "epochs_to_target": epochs,
        }
    base_tta = out[baseline]["tta_s"] if baseline in out else math.nan
    for values in out.values():
        tta = values["tta_s"]
        if math.isnan(base_tta) or (math.isinf(base_tta) and math.isinf(tta)):
            values["speedup"] = math.nan  # nothing to compare with
        elif math.isinf(tta):
            values["speedup"] = 0.0
        else:
            values["speedup"] = base_tta / tta
    return out
