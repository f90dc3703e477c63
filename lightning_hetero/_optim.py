"""Small optimizer helpers shared by the modes and the probes."""

import math
from collections.abc import Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass
from typing import Any, Literal

import torch
from lightning_utilities.core.rank_zero import rank_zero_warn

__all__ = [
    "LR_SCALING",
    "NoiseScale",
    "check_lookahead",
    "check_lr_scaling",
    "has_momentum",
    "is_adaptive",
    "lookahead_factor",
    "lr_factor",
    "lr_rule",
    "optimizer_params",
    "patched",
    "replica_factor",
    "scaled_lr",
    "second_moment_decay",
]

#: ``lr_scaling`` values: ``"auto"`` picks ``"linear"``, ``"noise"`` or ``"sqrt"`` by the
#: optimizer and the mode; ``True`` and ``False`` (before ``"auto"``) mean ``"linear"`` and
#: ``"none"``.
LR_SCALING = ("auto", "linear", "sqrt", "noise", "none")
Rule = Literal["linear", "sqrt", "noise", "none"]

# Optimizers whose step barely scales with the gradient's size: Adam and its kin divide by a
# running gradient norm, Rprop and Muon normalize the step outright.
_ADAPTIVE_NAMES = (
    "Adam", "AdamW", "Adamax", "NAdam", "RAdam", "RMSprop", "Adagrad", "Adadelta",
    "SparseAdam", "Adafactor", "Rprop", "Muon",
)  # fmt: skip
_ADAPTIVE = tuple(getattr(torch.optim, n) for n in _ADAPTIVE_NAMES if hasattr(torch.optim, n))
# Parameter-group keys only adaptive optimizers have (third-party ones included: Lion, LAMB,
# Adan, AdaBelief take ``betas``); SGD, ASGD, LARS and LBFGS have none of them.
_ADAPTIVE_KEYS = frozenset(
    {"betas", "beta1", "beta2", "beta2_decay", "rho", "centered", "lr_decay",
     "initial_accumulator_value", "etas", "ns_steps"}
)  # fmt: skip


def optimizer_params(optimizer: torch.optim.Optimizer) -> list[torch.Tensor]:
    """The parameters ``optimizer`` steps, in parameter-group order."""
    return [param for group in optimizer.param_groups for param in group["params"]]


def check_lr_scaling(value: Any) -> Literal["auto", "linear", "sqrt", "noise", "none"]:
    """``lr_scaling`` as one of ``LR_SCALING`` (``True``: ``"linear"``, ``False``:
    ``"none"``); anything else is refused naming the option.

    Examples:
        >>> check_lr_scaling(True), check_lr_scaling("sqrt")
        ('linear', 'sqrt')
    """
    if value is True:
        return "linear"
    if value is False:
        return "none"
    if isinstance(value, str) and value in LR_SCALING:
        return value  # type: ignore[return-value]
    raise ValueError(
        f"`lr_scaling` must be one of {list(LR_SCALING)} (or True for 'linear', False for"
        f" 'none'), got {value!r}."
    )


def is_adaptive(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` (or the one a ``LightningOptimizer`` wraps) is adaptive: one of
    torch's Adam/RMSprop/Adagrad family, or any optimizer whose parameter groups carry one
    of their keys (``betas``, ``rho``, ...)."""
    raw = getattr(optimizer, "_optimizer", optimizer)
    if isinstance(raw, _ADAPTIVE):
        return True
    return any(_ADAPTIVE_KEYS.intersection(group) for group in raw.param_groups)


def has_momentum(optimizer: torch.optim.Optimizer) -> bool:
    """Whether ``optimizer`` (or the one a ``LightningOptimizer`` wraps) steps with heavy-ball
    momentum: ``torch.optim.SGD`` (or a subclass) with ``momentum > 0`` in some group."""
    raw = getattr(optimizer, "_optimizer", optimizer)
    return isinstance(raw, torch.optim.SGD) and any(
        float(group.get("momentum", 0.0)) > 0 for group in raw.param_groups
    )


def check_epoch_average(epoch_average: Any) -> None:
    """Refuse an ``epoch_average`` other than ``"auto"``, ``True`` or ``False``."""
    if not (isinstance(epoch_average, bool) or epoch_average == "auto"):
        raise ValueError(f"`epoch_average` must be 'auto', True or False, got {epoch_average!r}.")


def check_lookahead(lookahead: Any, optimizers: Sequence[torch.optim.Optimizer]) -> None:
    """Refuse ``lookahead=True`` where some optimizer has no heavy-ball momentum to look
    ahead by (``has_momentum``)."""
    if lookahead is not True:
        return
    lacking = [
        type(getattr(o, "_optimizer", o)).__name__ for o in optimizers if not has_momentum(o)
    ]
    if lacking:
        raise ValueError(
            f"lookahead=True moves parameters ahead by heavy-ball momentum, which"
            f" {', '.join(lacking)} has none of: use torch.optim.SGD with momentum > 0, or"
            " lookahead='auto'."
        )


def lookahead_factor(group: Mapping[str, Any], updates: float) -> float:
    """How far, in units of ``lr * momentum_buffer``, the momentum of ``updates`` further SGD
    steps at ``group``'s learning rate moves the parameters: ``sum_{j=1..n} mu^j`` (one power
    more under Nesterov, whose step adds ``mu * buffer`` to the gradient), negative for
    ``maximize``. ``updates`` may be fractional (a moving average).

    Examples:
        >>> lookahead_factor({"momentum": 0.9}, 1), round(lookahead_factor({"momentum": 0.9}, 2), 4)
        (0.9, 1.71)
        >>> lookahead_factor({"momentum": 0.9, "nesterov": True}, 1)
        0.81
        >>> lookahead_factor({"momentum": 0.0}, 3)
        0.0
    """
    mu = float(group.get("momentum", 0.0))
    if mu <= 0 or updates <= 0:
        return 0.0
    total = mu * (1 - mu**updates) / (1 - mu) if mu < 1 else float(updates)
    if group.get("nesterov", False):
        total *= mu
    return -total if group.get("maximize", False) else total


def lr_rule(lr_scaling: Any, optimizer: torch.optim.Optimizer, measured: bool = False) -> Rule:
    """The scaling rule ``lr_scaling`` means for ``optimizer``: ``"auto"`` is ``"linear"`` for
    the SGD family and, for adaptive optimizers (``is_adaptive``), ``"noise"`` where the
    caller measures the gradient noise (``measured``: async mode's server, ``NoiseScale``),
    else ``"sqrt"``. ``"noise"`` without a measurement is refused."""
    rule = check_lr_scaling(lr_scaling)
    if rule == "auto":
        if not is_adaptive(optimizer):
            return "linear"
        return "noise" if measured else "sqrt"
    if rule == "noise" and not measured:
        raise ValueError(
            "lr_scaling='noise' scales each push by the gradient noise the parameter server"
            " measures, so it needs mode='async' (with or without controller='dual'); use"
            " 'sqrt' or 'auto' here."
        )
    return rule


def second_moment_decay(optimizer: torch.optim.Optimizer) -> float:
    """How much of its running mean of squared gradients ``optimizer`` keeps per step, from
    its first parameter group: ``betas[1]`` (Adam and its kin), ``alpha`` (RMSprop), ``rho``
    (Adadelta), else ``1.0`` for Adagrad (a sum over every step) and ``0.999`` (Adam's
    default) for the rest."""
    raw = getattr(optimizer, "_optimizer", optimizer)
    group = raw.param_groups[0]
    if "betas" in group:
        return float(group["betas"][1])
    for key in ("alpha", "rho"):
        if key in group:
            return float(group[key])
    return 1.0 if isinstance(raw, torch.optim.Adagrad) else 0.999


def lr_factor(rule: str, share: float) -> float:
    """The learning-rate factor of a step on ``share`` of the reference batch: ``share``
    (linear scaling rule, SGD), ``sqrt(share)`` (square-root rule, adaptive methods), or 1.

    Examples:
        >>> lr_factor("linear", 0.25), lr_factor("sqrt", 0.25), lr_factor("none", 0.25)
        (0.25, 0.5, 1.0)
    """
    if not (math.isfinite(share) and share > 0):
        raise ValueError(f"a batch share must be a positive number, got {share}.")
    if rule == "linear":
        return share
    if rule == "sqrt":
        return math.sqrt(share)
    if rule == "none":
        return 1.0
    raise ValueError(
        f"Unknown learning-rate scaling rule {rule!r}; expected linear, sqrt or none ('noise'"
        " is measured: NoiseScale.factor)."
    )


def replica_factor(rule: str, batch_size: int, global_batch_size: int, replicas: int) -> float:
    """The learning-rate factor of a local-SGD replica's step on ``batch_size`` of the
    global batch's ``global_batch_size`` samples, averaged over ``replicas`` replicas.

    A merge moves the model by the mean of the replicas' steps, ``1 / K`` of each; so that a
    replica's step moves the merged model as far as a push of its ``b_k`` samples moves the
    server's (``lr_factor`` of ``b_k / B``), its factor is ``K`` times that: ``K b_k / B``
    (linear rule; 1 at an even split) or ``K sqrt(b_k / B)`` (square-root rule; ``sqrt(K)``
    at an even split, where ``K`` Adam replicas at ``lr`` moved about ``1 / sqrt(K)`` of
    DDP's step per sample, issue 32). ``"none"``: 1.

    Examples:
        >>> replica_factor("linear", 32, 128, 4), replica_factor("sqrt", 32, 128, 4)
        (1.0, 2.0)
    """
    if rule == "none":
        return 1.0
    return replicas * lr_factor(rule, batch_size / global_batch_size)


@dataclass
class _ParamWindow:
    """One parameter's sums over the pushes of a window that had its gradient."""

    total: torch.Tensor  # sum of b_k * g_k
    squares: float = 0.0  # sum of b_k * |g_k|^2
    samples: int = 0
    pushes: int = 0


class NoiseScale:
    """The learning-rate factor of the ``"noise"`` rule, from the gradients pushed so far.

    A push of ``b`` out of a global batch of ``B`` samples gets the factor that makes ``B / b``
    such pushes of an adaptive optimizer move as far as one DDP step, by the gradient noise
    scale ``B_noise = tr(Sigma) / |G|^2`` (McCandlish, Kaplan, Amodei et al., "An Empirical
    Model of Large-Batch Training", 2018). Adam divides each step by the running root mean
    square of the gradients, which for a batch of ``b`` is about ``sqrt(|G|^2 + tr(Sigma) /
    b)``; where the pushes agree (low noise) ``B / b`` steps add up, and the linear rule
    ``b / B`` matches DDP; where noise dominates they add up like a random walk, and the
    square-root rule does. In between:

        factor(b) = b / B * sqrt((1 + B_noise * h) / (1 + B_noise / B)),

    clipped to lie between ``b / B`` and ``sqrt(b / B)``. ``h`` is the mean of ``1 / b`` over
    the pushes so far, weighted as the optimizer weighs squared gradients into its running
    mean (``moment_decay``, Adam's ``beta2``): Adam's denominator is one running mean over
    every push, so where pushes of different sizes mix (dual batch: many small pushes beside
    few large ones) it carries the small batches' noise into the large pushes' steps too.
    Where every push has ``b`` samples, ``h = 1 / b``. The plain square-root
    rule takes ``sqrt(B / b)`` times DDP's step per ``B`` samples where gradients agree, and
    diverged at DDP's stable learning rate (issue 32); this rule does not go past DDP's step
    there.

    ``|G|^2`` and ``tr(Sigma)`` come from the pushes of each ``B`` samples: the pushed
    gradients' squared norms, weighted by batch size, and the squared norm of their weighted
    mean, two batch sizes of the same gradient (the paper's Appendix A.1 unbiased
    estimators), averaged over windows with weight ``decay``. Until the first window is full
    the factor is linear's.

    Args:
        decay: the weight of the running estimates over windows of ``B`` samples.
        moment_decay: the optimizer's decay of its squared-gradient mean per step
            (``second_moment_decay``); ``1.0``: a plain mean over every push (Adagrad).

    Examples:
        >>> rule = NoiseScale()
        >>> same = [torch.ones(3)]  # every push agrees: DDP's step is the linear rule's
        >>> for _ in range(4):
        ...     rule.observe(same, 8, 32)
        >>> rule.factor(0.25)
        0.25
    """

    def __init__(self, decay: float = 0.9, moment_decay: float = 0.999) -> None:
        if not 0 <= decay < 1:
            raise ValueError(f"`decay` must be in [0, 1), got {decay}.")
        if not 0 <= moment_decay <= 1:
            raise ValueError(f"`moment_decay` must be in [0, 1], got {moment_decay}.")
        self.decay = decay
        self.moment_decay = moment_decay
        #: The running sums of ``1 / b`` and of the weights (``moment_decay``): their ratio is
        #: ``h``, the pushes' mean inverse batch size, bias-corrected as Adam's moments.
        self._inverse_batch = 0.0
        self._weight = 0.0
        #: Running estimates of ``|G|^2`` and ``tr(Sigma)`` (per-sample gradient variance);
        #: ``None`` until the first window of ``B`` samples is full.
        self.signal: float | None = None
        self.noise: float | None = None
        #: The window's sums per parameter (its index in ``grads``): see ``_ParamWindow``.
        self._window: dict[int, _ParamWindow] = {}
        self._samples = 0
        self._pushes = 0
        self._global_batch_size = 0
        self._warned = False

    def observe(
        self, grads: Sequence[torch.Tensor | None], batch_size: int, global_batch_size: int
    ) -> None:
        """Count a push of ``grads``, the mean gradients over ``batch_size`` samples (``None``
        for parameters without one), out of a global batch of ``global_batch_size``.

        ``grads[k]`` is always the same parameter's gradient (the optimizer's order): each
        parameter's estimate counts the pushes that had its gradient, so gradients that come
        and go (a branch unused in a step, parameters unfrozen mid-window) neither misalign
        nor mix. A push with a non-finite gradient is skipped (one warning): the factor
        stays finite."""
        if global_batch_size != self._global_batch_size:  # a new B: a new window
            self._reset_window()
            self._global_batch_size = global_batch_size
        present = {k: g.detach().float() for k, g in enumerate(grads) if g is not None}
        if not all(bool(torch.isfinite(g).all()) for g in present.values()):
            if not self._warned:
                self._warned = True
                rank_zero_warn(
                    'hetero: a pushed gradient is not finite (inf or NaN); the "noise"'
                    " learning-rate rule skips such pushes in its measurement (warned once)."
                )
            return
        self._inverse_batch = self.moment_decay * self._inverse_batch + 1 / batch_size
        self._weight = self.moment_decay * self._weight + 1
        for k, grad in present.items():
            window = self._window.get(k)
            if window is None:
                self._window[k] = window = _ParamWindow(torch.zeros_like(grad))
            window.total.add_(grad, alpha=batch_size)
            window.squares += batch_size * float(grad.square().sum())
            window.samples += batch_size
            window.pushes += 1
        self._samples += batch_size
        self._pushes += 1
        if self._samples >= global_batch_size and self._pushes >= 2:
            signal = noise = 0.0
            measured = False
            for window in self._window.values():
                if window.pushes < 2:
                    continue  # one push of this parameter: no spread to measure
                n = window.samples
                mean_sq = float(window.total.square().sum()) / n**2
                # E[sum b_k |g_k|^2] = n |G|^2 + pushes * tr(Sigma); E[|mean|^2] = |G|^2 + tr/n
                param_noise = (window.squares - n * mean_sq) / (window.pushes - 1)
                noise += param_noise
                signal += mean_sq - param_noise / n
                measured = True
            if measured and math.isfinite(signal) and math.isfinite(noise):
                if self.signal is None or self.noise is None:
                    self.signal, self.noise = signal, noise
                else:
                    self.signal = self.decay * self.signal + (1 - self.decay) * signal
                    self.noise = self.decay * self.noise + (1 - self.decay) * noise
            self._reset_window()

    def _reset_window(self) -> None:
        self._window, self._samples, self._pushes = {}, 0, 0

    def factor(self, share: float) -> float:
        """The learning-rate factor of a push of ``share = b / B`` of the global batch."""
        low, high = lr_factor("linear", share), lr_factor("sqrt", share)
        if self.signal is None or self.noise is None or self.noise <= 0:
            return low  # no measurement yet, or no noise: the pushes add up like DDP's
        if self.signal <= 0:
            return high  # noise only: a random walk
        noise_scale = self.noise / self.signal
        inverse_batch = self._inverse_batch / self._weight  # h: every push's 1/b, Adam-weighted
        factor = share * math.sqrt(
            (1 + noise_scale * inverse_batch) / (1 + noise_scale / self._global_batch_size)
        )
        return min(max(factor, low), high)


@contextmanager
def scaled_lr(optimizer: torch.optim.Optimizer, factor: float) -> Iterator[None]:
    """Multiply every group's learning rate by ``factor`` for the duration of the block."""
    lrs = [group["lr"] for group in optimizer.param_groups]
    for group in optimizer.param_groups:
        group["lr"] = group["lr"] * factor
    try:
        yield
    finally:
        for group, lr in zip(optimizer.param_groups, lrs):
            group["lr"] = lr


_ABSENT = object()


@contextmanager
def patched(obj: object, attributes: dict[str, Any]) -> Iterator[None]:
    """Set instance attributes of ``obj`` for the duration of the block (e.g. ``step``), then
    restore exactly what was there: an instance attribute set before (such as the wrapper an
    LR scheduler puts on ``optimizer.step``) gets its value back, others are deleted."""
    saved = {name: vars(obj).get(name, _ABSENT) for name in attributes}
    for name, value in attributes.items():
        setattr(obj, name, value)
    try:
        yield
    finally:
        for name, value in saved.items():
            if value is _ABSENT:
                delattr(obj, name)
            else:
                setattr(obj, name, value)
