"""``SmoothL1Loss``, ``HuberLoss`` and ``KLDivLoss`` (PyTorch's definitions and reductions),
their functional forms and ops."""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, dispatch
from everyo_layers.checks import argument
from everyo_layers.loss import _elementwise, _ElementwiseLossOp, _Loss
from everyo_layers.loss_reduction import reduce_tensor


def _piecewise(d: np.ndarray, inside: np.ndarray, near, far) -> np.ndarray:
    """``np.where(inside, near(d), far(d))`` evaluating each branch only on the elements it
    is chosen for, so a branch that would overflow or divide by zero elsewhere never warns."""
    d = np.asarray(d)
    out = np.empty_like(d)
    out[inside] = near(d[inside])
    outside = ~inside
    out[outside] = far(d[outside])
    return out


class SmoothL1LossOp(_ElementwiseLossOp):
    """``0.5 d**2 / beta`` where ``|d| < beta``, ``|d| - 0.5 beta`` elsewhere (``d = x - y``)."""

    __slots__ = ("beta",)
    saved_inputs = ()  # backward reads the difference, a private array
    saves_output = False

    def elementwise(self, x, y, beta=1.0):
        self.beta = beta
        d = x - y
        self.saved = d
        scale = max(beta, 1e-300)
        return _piecewise(d, np.abs(d) < beta, lambda near: 0.5 * near * near / scale,
                          lambda far: np.abs(far) - 0.5 * beta)

    def partials(self):
        d = self.saved
        scale = max(self.beta, 1e-300)
        gx = _piecewise(d, np.abs(d) < self.beta, lambda near: near / scale, np.sign)
        return gx, -gx

    def composite(self, x, y):
        d = x - y
        small = np.abs(d.data) < self.beta
        # beta == 0 selects no quadratic element: divide by 1 there rather than by ~0
        scale = max(self.beta, 1e-300) if self.beta > 0 else 1.0
        per = dispatch("where", small, 0.5 * d * d / scale,
                       dispatch("abs", d) - 0.5 * self.beta)
        return reduce_tensor(per, self.reduction, self.count)


class HuberLossOp(_ElementwiseLossOp):
    """``0.5 d**2`` where ``|d| < delta``, ``delta (|d| - 0.5 delta)`` elsewhere."""

    __slots__ = ("delta",)
    saved_inputs = ()
    saves_output = False

    def elementwise(self, x, y, delta=1.0):
        self.delta = delta
        d = x - y
        self.saved = d
        return np.where(np.abs(d) < delta, 0.5 * d * d, delta * (np.abs(d) - 0.5 * delta))

    def partials(self):
        d = self.saved
        gx = np.where(np.abs(d) < self.delta, d, self.delta * np.sign(d))
        return gx, -gx

    def composite(self, x, y):
        d = x - y
        per = dispatch("where", np.abs(d.data) < self.delta, 0.5 * d * d,
                       self.delta * (dispatch("abs", d) - 0.5 * self.delta))
        return reduce_tensor(per, self.reduction, self.count)


class KLDivLossOp(_ElementwiseLossOp):
    """Pointwise ``target * (log(target) - input)`` for log-probability ``input``; with
    ``log_target`` the target is given as log-probabilities too. ``0 log 0 = 0``."""

    __slots__ = ("log_target",)
    saved_inputs = (0, 1)
    saves_output = False

    def elementwise(self, x, t, log_target=False):
        self.log_target = log_target
        self.saved = (x, t)
        if log_target:
            return np.exp(t) * (t - x)
        with np.errstate(divide="ignore", invalid="ignore"):
            return np.where(t > 0, t * (np.log(np.where(t > 0, t, 1)) - x), -t * x)

    def partials(self):
        x, t = self.saved
        if self.log_target:
            p = np.exp(t)
            return -p, p * (t - x + 1)
        with np.errstate(divide="ignore"):
            gt = np.where(t > 0, np.log(np.where(t > 0, t, 1)) + 1 - x, -np.inf)
        return -t, gt

    def composite(self, x, t):
        if self.log_target:
            per = dispatch("exp", t) * (t - x)
        else:
            positive = t.data > 0
            safe = dispatch("where", positive, t, 1.0)
            per = dispatch("where", positive, t * (dispatch("log", safe) - x), -t * x)
        return reduce_tensor(per, self.reduction, self.count)


def smooth_l1_loss(input, target, reduction: str = "mean", beta: float = 1.0):
    """Smooth L1 loss: quadratic below ``beta``, linear above (PyTorch's ``smooth_l1_loss``).

    Example:
        >>> import everyo as eo
        >>> eo.smooth_l1_loss(eo.tensor([0.5, 3.0]), eo.zeros(2), reduction="none").data
        array([0.125, 2.5  ], dtype=float32)
    """
    if beta < 0:
        raise EveryOError(f"smooth_l1_loss: beta must be non-negative, got {beta}")
    return _elementwise("smooth_l1_loss", "smooth_l1_loss", input, target, reduction,
                        beta=float(beta))


def huber_loss(input, target, reduction: str = "mean", delta: float = 1.0):
    """Huber loss: ``0.5 d**2`` below ``delta``, ``delta (|d| - delta/2)`` above.

    Example:
        >>> import everyo as eo
        >>> eo.huber_loss(eo.tensor([0.5, 3.0]), eo.zeros(2), reduction="none", delta=2.0).data
        array([0.125, 4.   ], dtype=float32)
    """
    if delta <= 0:
        raise EveryOError(f"huber_loss: delta must be positive, got {delta}")
    return _elementwise("huber_loss", "huber_loss", input, target, reduction,
                        delta=float(delta))


def kl_div(input, target, reduction: str = "mean", log_target: bool = False):
    """Kullback-Leibler divergence of ``target`` from the log-probabilities ``input``.

    Args:
        reduction: ``"mean"`` (over every element, as PyTorch), ``"batchmean"`` (sum divided
            by the batch size: the mathematical KL divergence per sample), ``"sum"``, ``"none"``.
        log_target: ``target`` holds log-probabilities.

    Example:
        >>> import everyo as eo
        >>> p = eo.tensor([[0.5, 0.5]])
        >>> eo.kl_div(eo.log(p), p, reduction="batchmean").item()
        0.0
    """
    if reduction == "batchmean":
        total = _elementwise("kl_div", "kl_div", input, target, "sum",
                             log_target=bool(log_target))
        batch = input.shape[0] if len(input.shape) else 1
        return total / batch
    return _elementwise("kl_div", "kl_div", input, target, reduction, log_target=bool(log_target))


class SmoothL1Loss(_Loss):
    """Smooth L1 loss; see :func:`smooth_l1_loss`."""

    def __init__(self, reduction: str = "mean", beta: float = 1.0):
        super().__init__(reduction)
        self.beta = argument("SmoothL1Loss", "beta", beta, "non-negative float")

    def forward(self, input, target):
        return smooth_l1_loss(input, target, self.reduction, self.beta)


class HuberLoss(_Loss):
    """Huber loss; see :func:`huber_loss`."""

    def __init__(self, reduction: str = "mean", delta: float = 1.0):
        super().__init__(reduction)
        self.delta = argument("HuberLoss", "delta", delta, "positive float")

    def forward(self, input, target):
        return huber_loss(input, target, self.reduction, self.delta)


class KLDivLoss(_Loss):
    """KL divergence of log-probabilities; see :func:`kl_div` (also ``"batchmean"``)."""

    def __init__(self, reduction: str = "mean", log_target: bool = False):
        if reduction not in ("mean", "batchmean", "sum", "none"):
            raise EveryOError(f"KLDivLoss: reduction must be one of ('mean', 'batchmean', "
                              f"'sum', 'none'), got {reduction!r}")
        super().__init__("sum" if reduction == "batchmean" else reduction)
        self.reduction, self.log_target = reduction, bool(log_target)

    def forward(self, input, target):
        return kl_div(input, target, self.reduction, self.log_target)


OPS = {"smooth_l1_loss": SmoothL1LossOp, "huber_loss": HuberLossOp, "kl_div": KLDivLossOp}
LAYERS = {"SmoothL1Loss": SmoothL1Loss, "HuberLoss": HuberLoss, "KLDivLoss": KLDivLoss,
          "smooth_l1_loss": smooth_l1_loss, "huber_loss": huber_loss, "kl_div": kl_div}
