"""LB-BSP: batch sizes proportional to each rank's *predicted* speed (paper 001, Alg. 1)."""

import math
import warnings
from collections.abc import Callable, Sequence
from itertools import repeat
from operator import truediv
from typing import Any

from lightning_hetero.planning.base import BatchLimits, Controller, RankStats, check_inputs
from lightning_hetero.planning.predictors import (
    PREDICTORS,
    EMAPredictor,
    LastPredictor,
    NARXPredictor,
    SpeedPredictor,
    _check_alpha,
)
from lightning_hetero.planning.split import proportional_split

__all__ = ["LBBSPController"]


class LBBSPController(Controller):
    """Split the global batch in proportion to each rank's predicted speed.

    At every boundary rank ``k`` has processed ``b_k`` samples per step in ``t_k``
    seconds, a speed ``v_k = b_k / t_k``. A predictor per rank turns the speeds seen so
    far (and, for ``"narx"``, the CPU and memory readings in ``stats``) into the speed
    ``v_hat_k`` expected in the next interval, and the next plan is (paper 001, Alg. 1):

        x_k = B * v_hat_k / sum_j v_hat_j

    rounded to integers that sum to ``B`` and kept within the per-rank bounds
    ([`proportional_split`][lightning_hetero.planning.proportional_split]).

    Predictors (``predictors``): ``"last"`` (the last speed),
    ``"ema"`` (an exponential moving average with weight ``alpha``) and ``"narx"`` (a small
    network per rank trained online on speeds and resource readings; the EMA until it is
    trained). A prediction that is not a finite positive speed is replaced by the EMA of
    that rank's speeds, with a warning.

    Paper 001 re-plans every iteration. Here a **dead-band** keeps the plan unless the new
    one is predicted to shorten the step, ``max_k x_k / v_hat_k``, by more than
    ``deadband`` (relative): re-planning has a cost (timings restart, prefetched batches
    keep the old size) and one-sample moves from noise buy nothing. ``deadband=0``
    re-plans whenever the predicted step gets shorter at all, as the paper does. A plan
    that breaks the limits is always replaced.

    Args:
        predictor: ``"last"``, ``"ema"``, ``"narx"``, or a callable returning a new
            [`SpeedPredictor`][lightning_hetero.planning.predictors.SpeedPredictor] (one per rank).
        alpha: weight of the latest speed in the EMA (the ``"ema"`` predictor and the
            fallback), in ``(0, 1]``; paper 001 uses 0.2.
        deadband: relative predicted step-time gain below which the plan is kept, in ``[0, 1)``.
        hidden_size: NARX hidden units.
        warmup: NARX samples before its first training; the EMA predicts until then.
        window: NARX samples kept and trained on.
        validation_fraction: newest share of the window NARX holds out for early stopping.
        max_epochs: most NARX training epochs per boundary.
        patience: NARX epochs without validation improvement before it stops.
        learning_rate: NARX Adam step size.
        weight_decay: NARX L2 penalty.
        huber_delta: NARX loss: squared below this log-speed error, linear above.
        seed: seed of the NARX initial weights.

    Attributes:
        predicted_speeds: the speeds (samples/s) the last plan was made from.

    Example:
        >>> from lightning_hetero.planning import BatchLimits
        >>> ctl = LBBSPController(predictor="ema")
        >>> ctl.update([64, 64, 64, 64], [4.0, 4.0, 6.0, 1.5], BatchLimits.build(4, 256))
        [48, 48, 32, 128]
    """

    name = "lbbsp"

    def __init__(
        self,
        predictor: str | Callable[[], SpeedPredictor] = "ema",
        alpha: float = 0.2,
        deadband: float = 0.05,
        hidden_size: int = 8,
        warmup: int = 20,
        window: int = 200,
        validation_fraction: float = 0.2,
        max_epochs: int = 20,
        patience: int = 3,
        learning_rate: float = 0.01,
        weight_decay: float = 1e-2,
        huber_delta: float = 0.05,
        seed: int = 0,
    ) -> None:
        if isinstance(predictor, str) and predictor not in PREDICTORS:
            raise ValueError(
                f"Unknown predictor {predictor!r}; expected one of {sorted(PREDICTORS)} or a"
                " callable that returns a `SpeedPredictor`."
            )
        if not isinstance(predictor, str) and not callable(predictor):
            raise ValueError(
                f"`predictor` must be a name or a callable returning a `SpeedPredictor`, got"
                f" {predictor!r}."
            )
        _check_alpha(alpha)
        if not 0.0 <= deadband < 1.0:
            raise ValueError(f"`deadband` must be in [0, 1), got {deadband}.")
        self.predictor = predictor
        # NARX trains a torch network: not bit-identical across machines
        self.replicable = predictor in ("last", "ema")
        self.alpha = alpha
        self.deadband = deadband
        self.narx_options = {
            "hidden_size": hidden_size,
            "warmup": warmup,
            "window": window,
            "validation_fraction": validation_fraction,
            "max_epochs": max_epochs,
            "patience": patience,
            "learning_rate": learning_rate,
            "weight_decay": weight_decay,
            "huber_delta": huber_delta,
            "seed": seed,
        }
        self._new_predictor()  # raises ValueError on bad options now rather than later
        self.predictors: list[SpeedPredictor] = []
        self.fallbacks: list[EMAPredictor] = []
        self.predicted_speeds: list[float] = []

    def _new_predictor(self) -> SpeedPredictor:
        if self.predictor == "narx":
            return NARXPredictor(alpha=self.alpha, **self.narx_options)
        if self.predictor == "ema":
            return EMAPredictor(self.alpha)
        if isinstance(self.predictor, str):
            return PREDICTORS[self.predictor]()
        made = self.predictor()
        if not isinstance(made, SpeedPredictor):
            raise ValueError(f"The predictor factory returned {made!r}, not a `SpeedPredictor`.")
        return made

    def _reset(self, world_size: int) -> None:
        self.predictors = [self._new_predictor() for _ in range(world_size)]
        self.fallbacks = [EMAPredictor(self.alpha) for _ in range(world_size)]

    def update(
        self,
        batch_sizes: Sequence[int],
        compute_s: Sequence[float],
        limits: BatchLimits,
        stats: Sequence[RankStats] | None = None,
    ) -> list[int]:
        current, compute_s, readings = check_inputs(batch_sizes, compute_s, limits, stats)
        world_size = len(current)
        if len(self.predictors) != world_size:
            self._reset(world_size)

        speeds = list(map(truediv, current, compute_s))
        predicted = _observe_and_predict(self.predictors, self.fallbacks, speeds)
        if predicted is None:  # some predictor is neither "last" nor "ema": one call per rank
            predicted = []
            for rank, (speed, reading) in enumerate(zip(speeds, readings)):
                predictor = self.predictors[rank]
                predictor.observe(speed, reading.cpu_available, reading.memory_available)
                self.fallbacks[rank].observe(speed)
                guess = predictor.predict()
                if not (math.isfinite(guess) and guess > 0):
                    fallback = self.fallbacks[rank].predict()
                    warnings.warn(
                        f"Rank {rank}: the {getattr(predictor, 'name', 'custom')!r}"
                        f" predictor gave {guess!r}, not a positive finite speed; using the EMA"
                        f" prediction {fallback:.6g} samples/s for this boundary.",
                        stacklevel=2,
                    )
                    guess = fallback
                predicted.append(guess)
        self.predicted_speeds = predicted

        target = proportional_split(
            predicted, limits.global_batch_size, limits.min_batch_size, limits.max_batch_size
        )
        if not limits.admits(current):
            return target
        current_step_s = max(map(truediv, current, predicted))
        target_step_s = max(map(truediv, target, predicted))
        return target if target_step_s < (1.0 - self.deadband) * current_step_s else current

    def state_dict(self) -> dict[str, Any]:
        return {
            "predictors": [p.state_dict() for p in self.predictors],
            "fallbacks": [p.state_dict() for p in self.fallbacks],
            "predicted_speeds": list(self.predicted_speeds),
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self._reset(len(state.get("predictors", [])))
        for predictor, saved in zip(self.predictors, state.get("predictors", [])):
            predictor.load_state_dict(saved)
        for fallback, saved in zip(self.fallbacks, state.get("fallbacks", [])):
            fallback.load_state_dict(saved)
        self.predicted_speeds = [float(v) for v in state.get("predicted_speeds", [])]


def _observe_and_predict(
    predictors: list[SpeedPredictor], fallbacks: list[EMAPredictor], speeds: list[float]
) -> list[float] | None:
    """``observe`` then ``predict`` on every rank's predictor at once, for the built-in
    ``"last"`` and ``"ema"`` predictors (and the EMA fallbacks), which ignore the readings.

    The same arithmetic as their methods, without a call per rank: at 4,096 ranks those
    calls alone would cost milliseconds. Their predictions of valid speeds are valid, so no
    fallback is needed. Returns ``None``, having changed nothing, for any other predictor
    or a speed that is not finite and positive (the per-rank path raises for it).
    """
    kinds = set(map(type, predictors))
    if not (
        kinds in ({EMAPredictor}, {LastPredictor}) and set(map(type, fallbacks)) <= {EMAPredictor}
    ):
        return None
    if not (speeds and math.isfinite(sum(speeds)) and min(speeds) > 0):
        return None
    if kinds == {LastPredictor}:
        _observe_emas(fallbacks, speeds)
        for predictor, speed in zip(predictors, speeds):
            predictor.last_speed = speed
        return list(speeds)
    _observe_emas(predictors, speeds, fallbacks)
    return [predictor.average for predictor in predictors]


def _observe_emas(
    predictors: list[EMAPredictor], speeds: list[float], also: list[EMAPredictor] | None = None
) -> None:
    """``EMAPredictor.observe`` on each (and on each of ``also``, in the same pass), for
    speeds known to be finite positive floats."""
    for predictor, other, speed in zip(predictors, also or repeat(None), speeds):
        average = predictor.average
        if average != average:  # nan: the first speed
            predictor.average = speed
        else:
            alpha = predictor.alpha
            predictor.average = alpha * speed + (1.0 - alpha) * average
        if other is not None:
            average = other.average
            if average != average:
                other.average = speed
            else:
                alpha = other.alpha
                other.average = alpha * speed + (1.0 - alpha) * average
