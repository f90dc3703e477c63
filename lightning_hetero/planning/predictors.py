"""One-step-ahead predictors of a rank's sample processing speed (paper 001, section 3.2.2).

A controller that plans the *next* interval from the *last* one assumes speeds persist.
On shared machines they do not: co-located jobs come and go. Each predictor here sees,
at every boundary, the speed a rank just measured (samples/s) and the resource readings
taken at that boundary, and guesses the speed of the coming interval.

* [`LastPredictor`][lightning_hetero.planning.predictors.LastPredictor] repeats the last speed
  (paper 001 calls it *memoryless*): it
  follows a real change at once but also every transient hiccup.
* [`EMAPredictor`][lightning_hetero.planning.predictors.EMAPredictor] smooths: robust to hiccups,
  slow after a real change.
* [`NARXPredictor`][lightning_hetero.planning.predictors.NARXPredictor] learns, per rank, how speed
  follows CPU and memory
  availability; readings tell a lasting change (resources moved) from a hiccup
  (resources did not), so it can be both quick and calm.
"""

import copy
import math
from abc import ABC, abstractmethod
from collections.abc import Sequence
from typing import TYPE_CHECKING, Any, ClassVar

from lightning_hetero.planning.split import is_count

if TYPE_CHECKING:
    import torch

__all__ = [
    "PREDICTORS",
    "EMAPredictor",
    "LastPredictor",
    "NARXPredictor",
    "SpeedPredictor",
    "relative_rmse",
]


def _check_speed(speed: float) -> float:
    speed = float(speed)
    if not (math.isfinite(speed) and speed > 0):
        raise ValueError(f"A measured speed must be finite and positive, got {speed}.")
    return speed


def _check_alpha(alpha: float) -> float:
    if not 0.0 < alpha <= 1.0:
        raise ValueError(f"`alpha` must be in (0, 1], got {alpha}.")
    return float(alpha)


class SpeedPredictor(ABC):
    """Predicts one rank's speed in the next interval from what it observed so far.

    Call ``observe`` once per boundary, then ``predict``. Predictors are pure
    and deterministic; all their state is in ``state_dict``.
    """

    #: Name under which ``LBBSPController(predictor=...)`` selects the predictor.
    name: ClassVar[str]

    @abstractmethod
    def observe(
        self, speed: float, cpu_available: float = math.nan, memory_available: float = math.nan
    ) -> None:
        """Record one boundary.

        Args:
            speed: samples per second the rank processed in the interval that just ended.
            cpu_available: the rank's CPU availability reading at this boundary, in
                ``[0, 1]``; ``nan`` when the rank cannot read it.
            memory_available: the rank's memory availability reading, likewise.
        """

    @abstractmethod
    def predict(self) -> float:
        """The predicted speed of the next interval; ``nan`` before any observation."""

    def state_dict(self) -> dict[str, Any]:
        """Everything needed to continue exactly after a restart (plain Python values)."""
        return {}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        """Restore what ``state_dict`` returned."""


class LastPredictor(SpeedPredictor):
    """Predicts that the next interval runs at the last measured speed.

    Example:
        >>> p = LastPredictor()
        >>> for speed in (100.0, 50.0, 80.0):
        ...     p.observe(speed)
        >>> p.predict()
        80.0
    """

    name = "last"

    def __init__(self) -> None:
        self.last_speed = math.nan

    def observe(
        self, speed: float, cpu_available: float = math.nan, memory_available: float = math.nan
    ) -> None:
        self.last_speed = _check_speed(speed)

    def predict(self) -> float:
        return self.last_speed

    def state_dict(self) -> dict[str, Any]:
        return {"last_speed": self.last_speed}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.last_speed = float(state["last_speed"])


class EMAPredictor(SpeedPredictor):
    """Predicts an exponential moving average of the measured speeds.

    ``v_hat <- alpha * v + (1 - alpha) * v_hat``, starting from the first speed;
    ``alpha`` weighs the latest observation (paper 001, Table 3 uses 0.2).

    Args:
        alpha: weight of the latest speed, in ``(0, 1]``; 1 is
            [`LastPredictor`][lightning_hetero.planning.predictors.LastPredictor].

    Example:
        >>> p = EMAPredictor(alpha=0.5)
        >>> for speed in (100.0, 50.0, 80.0):
        ...     p.observe(speed)
        >>> p.predict()
        77.5
    """

    name = "ema"

    def __init__(self, alpha: float = 0.2) -> None:
        self.alpha = _check_alpha(alpha)
        self.average = math.nan

    def observe(
        self, speed: float, cpu_available: float = math.nan, memory_available: float = math.nan
    ) -> None:
        speed = _check_speed(speed)
        if math.isnan(self.average):
            self.average = speed
        else:
            self.average = self.alpha * speed + (1.0 - self.alpha) * self.average

    def predict(self) -> float:
        return self.average

    def state_dict(self) -> dict[str, Any]:
        return {"average": self.average}

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.average = float(state["average"])


class NARXPredictor(SpeedPredictor):
    """A small NARX network per rank, trained online (paper 001, Eq. 4 and section 4).

    The next speed is a learned function of the last two speeds and of the current and
    the last two CPU and memory readings:

        v[i+1] = v[i] * exp(F(v[i], v[i-1], c[i], c[i-1], c[i-2], m[i], m[i-1], m[i-2]))

    ``F`` is a feed-forward network with one ``tanh`` hidden layer plus a direct linear
    path from the inputs. Two choices differ from the paper's plain formulation, both
    for precision with the few samples an online model has:

    * the network predicts the *change* ``log(v[i+1] / v[i])`` rather than the level: in
      calm stretches (the common case) the answer is "no change", which a network that
      outputs about zero gets right to the last digit, while a level has to be learned
      from the readings and comes out a few percent off, which costs step time;
    * the loss is Huber's (squared below ``huber_delta``, linear above) on the log
      change: a co-located job that starts *during* the next interval is a surprise no
      input foretells, and squared loss would let those few large errors pull every
      other prediction. ``huber_delta=0`` gives plain squared error.

    Speeds enter as ``log(v) - log(v_ref)``, with ``v_ref`` the geometric mean of the
    speeds seen when the network is first trained, fixed afterwards: workloads whose
    speeds differ by orders of magnitude look alike to the network, and predictions are
    always positive. Readings, already fractions, enter as ``2 r - 1``.

    Training: after every observation, once ``warmup`` complete samples exist, the
    network continues from its current weights on the latest ``window`` samples with
    full-batch Adam. The newest ``validation_fraction`` of them are held out; training
    stops when their loss has not improved for ``patience`` epochs (or after
    ``max_epochs``) and keeps the weights with the best validation loss, the starting
    weights included, so an update never makes the held-out fit worse.

    Until the network is trained, and whenever a needed reading is ``nan`` (a rank that
    cannot read its resources has no exogenous input), it predicts the EMA of the speeds,
    as paper 001 does during its warm-up. Samples with a ``nan`` reading are not trained
    on. Computation is in float64 on the CPU from a seeded generator: the same
    observations give bit-identical predictions. Torch is imported on first training.

    Args:
        alpha: weight of the latest speed in the fallback EMA, in ``(0, 1]``.
        hidden_size: units in the hidden layer (>= 1).
        warmup: complete samples needed before the first training (>= 4).
        window: most recent samples kept and trained on (>= ``warmup``).
        validation_fraction: share of the window held out for early stopping, in ``(0, 1)``.
        max_epochs: most Adam epochs per observation (>= 1).
        patience: epochs without validation improvement before stopping (>= 1).
        learning_rate: Adam step size (> 0).
        weight_decay: L2 penalty on the weights (>= 0).
        huber_delta: where the loss turns from squared to linear, in log-speed units (>= 0).
        seed: seed of the initial weights.

    Example:
        >>> p = NARXPredictor(warmup=8)
        >>> for i in range(30):
        ...     cpu = 0.9 if (i // 5) % 2 else 0.4
        ...     p.observe(100.0 * cpu, cpu_available=cpu, memory_available=0.5)
        >>> p.trained, round(p.predict() / 90.0, 1)
        (True, 1.0)
    """

    name = "narx"
    #: Speed lags and reading lags: inputs are 2 speeds, 3 CPU and 3 memory readings.
    speed_lags: ClassVar[int] = 2
    reading_lags: ClassVar[int] = 3

    def __init__(
        self,
        alpha: float = 0.2,
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
        _check_alpha(alpha)
        for option, value, least in [
            ("hidden_size", hidden_size, 1),
            ("warmup", warmup, 4),
            ("max_epochs", max_epochs, 1),
            ("patience", patience, 1),
        ]:
            if not is_count(value, least):
                raise ValueError(f"`{option}` must be an integer >= {least}, got {value!r}.")
        if not is_count(window, warmup):
            raise ValueError(f"`window` must be an integer >= `warmup` ({warmup}), got {window!r}.")
        if not 0.0 < validation_fraction < 1.0:
            raise ValueError(f"`validation_fraction` must be in (0, 1), got {validation_fraction}.")
        if not (math.isfinite(learning_rate) and learning_rate > 0):
            raise ValueError(f"`learning_rate` must be finite and > 0, got {learning_rate}.")
        if not (math.isfinite(weight_decay) and weight_decay >= 0):
            raise ValueError(f"`weight_decay` must be finite and >= 0, got {weight_decay}.")
        if not (math.isfinite(huber_delta) and huber_delta >= 0):
            raise ValueError(f"`huber_delta` must be finite and >= 0, got {huber_delta}.")
        self.hidden_size = hidden_size
        self.warmup = warmup
        self.window = window
        self.validation_fraction = validation_fraction
        self.max_epochs = max_epochs
        self.patience = patience
        self.learning_rate = learning_rate
        self.weight_decay = weight_decay
        self.huber_delta = huber_delta
        self.seed = seed
        self.fallback = EMAPredictor(alpha)
        # The latest observations, oldest first: enough for `window` samples.
        self.speeds: list[float] = []
        self.cpu: list[float] = []
        self.memory: list[float] = []
        self.log_reference = math.nan
        self.weights: dict[str, list[Any]] | None = None
        self.updates = 0
        self.epochs = 0

    @property
    def n_inputs(self) -> int:
        """Number of network inputs."""
        return self.speed_lags + 2 * self.reading_lags

    @property
    def trained(self) -> bool:
        """Whether the network has been trained at least once (predictions use it)."""
        return self.weights is not None

    def observe(
        self, speed: float, cpu_available: float = math.nan, memory_available: float = math.nan
    ) -> None:
        speed = _check_speed(speed)
        self.fallback.observe(speed)
        self.speeds.append(speed)
        self.cpu.append(float(cpu_available))
        self.memory.append(float(memory_available))
        keep = self.window + self.reading_lags
        del self.speeds[:-keep], self.cpu[:-keep], self.memory[:-keep]
        inputs, targets = self._samples()
        if len(targets) >= self.warmup:
            self._train(inputs, targets)

    def predict(self) -> float:
        features = self._features(len(self.speeds))
        if self.weights is None or features is None:
            return self.fallback.predict()
        import torch

        params = self._parameters()
        with torch.no_grad():
            out = self._forward(params, self._tensor([features]))
        log_speed = float(out[0]) + features[0]  # features[0] is log(v[i])
        return math.exp(log_speed) if log_speed < 700.0 else math.inf

    def _features(self, end: int) -> list[float] | None:
        """Raw inputs from the observations before index ``end``; ``None`` if one is missing.

        Speeds come as ``log(v)``; ``_tensor`` subtracts the reference.
        """
        if end < self.reading_lags:
            return None
        speeds = self.speeds[end - self.speed_lags : end][::-1]
        readings = self.cpu[end - self.reading_lags : end][::-1]
        readings += self.memory[end - self.reading_lags : end][::-1]
        if any(math.isnan(r) for r in readings):
            return None
        return [math.log(v) for v in speeds] + [2.0 * r - 1.0 for r in readings]

    def _tensor(self, rows: list[list[float]]) -> "torch.Tensor":
        import torch

        x = torch.tensor(rows, dtype=torch.float64)
        x[:, : self.speed_lags] -= self.log_reference
        return x

    def _samples(self) -> tuple[list[list[float]], list[int]]:
        inputs, targets = [], []
        for end in range(self.reading_lags, len(self.speeds)):
            features = self._features(end)
            if features is not None:
                inputs.append(features)
                targets.append(end)
        return inputs, targets

    def _init_weights(self) -> None:
        import torch

        generator = torch.Generator().manual_seed(self.seed)
        n_in, n_hidden = self.n_inputs, self.hidden_size

        def uniform(*shape: int, bound: float) -> list[Any]:
            draw = torch.rand(*shape, generator=generator, dtype=torch.float64)
            return ((2.0 * draw - 1.0) * bound).tolist()

        self.weights = {
            "hidden_weight": uniform(n_hidden, n_in, bound=1.0 / math.sqrt(n_in)),
            "hidden_bias": uniform(n_hidden, bound=1.0 / math.sqrt(n_in)),
            "output_weight": uniform(n_hidden, bound=1.0 / math.sqrt(n_hidden)),
            "linear_weight": [0.0] * n_in,
            "output_bias": [0.0],
        }

    def _parameters(self) -> dict[str, "torch.Tensor"]:
        import torch

        assert self.weights is not None
        return {k: torch.tensor(v, dtype=torch.float64) for k, v in self.weights.items()}

    @staticmethod
    def _forward(params: dict[str, "torch.Tensor"], inputs: "torch.Tensor") -> "torch.Tensor":
        hidden = (inputs @ params["hidden_weight"].T + params["hidden_bias"]).tanh()
        return (
            hidden @ params["output_weight"]
            + inputs @ params["linear_weight"]
            + params["output_bias"]
        )

    def _loss(self, out: "torch.Tensor", target: "torch.Tensor") -> "torch.Tensor":
        import torch

        if self.huber_delta == 0:
            return ((out - target) ** 2).mean()
        return torch.nn.functional.huber_loss(out, target, delta=self.huber_delta)

    def _train(self, inputs: list[list[float]], target_index: list[int]) -> None:
        import torch

        if math.isnan(self.log_reference):
            seen = self.speeds[: target_index[-1] + 1]
            self.log_reference = math.fsum(math.log(v) for v in seen) / len(seen)
        if self.weights is None:
            self._init_weights()
        x = self._tensor(inputs[-self.window :])
        y = torch.tensor(
            [math.log(self.speeds[i] / self.speeds[i - 1]) for i in target_index[-self.window :]],
            dtype=torch.float64,
        )
        n_val = max(1, round(self.validation_fraction * len(y)))
        x_train, y_train, x_val, y_val = x[:-n_val], y[:-n_val], x[-n_val:], y[-n_val:]

        params = {k: v.requires_grad_() for k, v in self._parameters().items()}
        optimizer = torch.optim.Adam(
            list(params.values()), lr=self.learning_rate, weight_decay=self.weight_decay
        )

        def validation_loss() -> float:
            with torch.no_grad():
                return float(self._loss(self._forward(params, x_val), y_val))

        best_loss, best = validation_loss(), {k: v.detach().clone() for k, v in params.items()}
        stale = 0
        for _ in range(self.max_epochs):
            optimizer.zero_grad()
            loss = self._loss(self._forward(params, x_train), y_train)
            loss.backward()
            optimizer.step()
            self.epochs += 1
            current = validation_loss()
            if current < best_loss:
                best_loss, stale = current, 0
                best = {k: v.detach().clone() for k, v in params.items()}
            else:
                stale += 1
                if stale >= self.patience:
                    break
        self.weights = {k: v.tolist() for k, v in best.items()}
        self.updates += 1

    def state_dict(self) -> dict[str, Any]:
        return {
            "fallback": self.fallback.state_dict(),
            "speeds": list(self.speeds),
            "cpu": list(self.cpu),
            "memory": list(self.memory),
            "log_reference": self.log_reference,
            "weights": copy.deepcopy(self.weights),
            "updates": self.updates,
            "epochs": self.epochs,
        }

    def load_state_dict(self, state: dict[str, Any]) -> None:
        self.fallback.load_state_dict(state["fallback"])
        self.speeds = [float(v) for v in state["speeds"]]
        self.cpu = [float(v) for v in state["cpu"]]
        self.memory = [float(v) for v in state["memory"]]
        self.log_reference = float(state["log_reference"])
        weights = state["weights"]
        self.weights = copy.deepcopy(weights)
        self.updates = int(state["updates"])
        self.epochs = int(state["epochs"])


#: Predictor classes by name.
PREDICTORS: dict[str, type[SpeedPredictor]] = {
    cls.name: cls for cls in (LastPredictor, EMAPredictor, NARXPredictor)
}


def relative_rmse(predicted: Sequence[float], actual: Sequence[float]) -> float:
    """Root-mean-square error over the mean of the actual values (normalised RMSE).

    ``sqrt(mean((p - a)^2)) / mean(a)``: comparable across workloads whose speeds differ
    by orders of magnitude, and, unlike an average of per-sample relative errors, not
    dominated by the few intervals where a worker nearly stalls.

    Example:
        >>> relative_rmse([110.0, 90.0], [100.0, 100.0])
        0.1
    """
    if len(predicted) != len(actual) or not actual:
        raise ValueError("predicted and actual must be non-empty and of equal length.")
    squared = math.fsum((p - a) ** 2 for p, a in zip(predicted, actual)) / len(actual)
    return math.sqrt(squared) / (math.fsum(actual) / len(actual))
