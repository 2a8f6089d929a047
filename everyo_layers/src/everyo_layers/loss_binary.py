"""``BCELoss`` / ``binary_cross_entropy``: binary cross-entropy of *probabilities* (PyTorch's).

``loss = -(y * max(log x, -100) + (1 - y) * max(log(1 - x), -100))``: the logarithms are
clamped at -100, as PyTorch does, so a probability of exactly 0 or 1 gives a finite loss (100)
instead of ``inf``. The input gradient is PyTorch's ``(x - y) / max(x (1 - x), 1e-12)``
(finite at 0 and 1 as well). Inputs and targets must lie in ``[0, 1]`` (PyTorch raises too);
for logits, :func:`binary_cross_entropy_with_logits` is the stable choice.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, dispatch
from everyo_layers.checks import array_of
from everyo_layers.loss import (
    _broadcasting_weight,
    _check_elementwise,
    _elementwise,
    _ElementwiseLossOp,
    _Loss,
)
from everyo_layers.loss_weights import weighted_elementwise_loss

LOG_FLOOR = -100.0  # PyTorch's clamp of the logarithms
# PyTorch's floor of x (1 - x) in the gradient: its constant 1e-12 is a float, i.e. float32's
# nearest value (so the gradient at 0 and 1 is PyTorch's to the last bit)
GRADIENT_EPSILON = float(np.float32(1e-12))


def _clamped_log(p: np.ndarray) -> np.ndarray:
    with np.errstate(divide="ignore"):
        return np.maximum(np.log(p), LOG_FLOOR)


class BinaryCrossEntropyOp(_ElementwiseLossOp):
    """``-(y log x + (1 - y) log(1 - x))`` with the logs clamped at -100 (PyTorch's)."""

    __slots__ = ()

    def elementwise(self, x, y):
        log_x, log_1mx = _clamped_log(x), _clamped_log(1 - x)
        self.saved = (x, y, log_x, log_1mx)
        return -(y * log_x + (1 - y) * log_1mx)

    def partials(self):
        x, y, log_x, log_1mx = self.saved
        return (x - y) / np.maximum(x * (1 - x), GRADIENT_EPSILON), log_1mx - log_x

    def elementwise_graph(self, x, y):
        # NOTE: log(max(p, e^-100)) is the clamped log, and differentiable where it is not
        # clamped; the floor keeps log(0) from warning.
        floor = float(np.exp(LOG_FLOOR))
        log_x = dispatch("log", dispatch("maximum", x, floor))
        log_1mx = dispatch("log", dispatch("maximum", 1.0 - x, floor))
        return -(y * log_x + (1.0 - y) * log_1mx)


def _outside_unit_interval(values):
    """The first entry of ``values`` outside ``[0, 1]`` (NaN included), or None."""
    x = array_of(values)
    if x.size and not (np.all(x >= 0) and np.all(x <= 1)):  # NaN fails both
        return x[~((x >= 0) & (x <= 1))].flat[0]
    return None


def _check_probabilities(name: str, input, target) -> None:
    bad = _outside_unit_interval(input)
    if bad is not None:
        raise EveryOError(f"{name}: input must be probabilities in [0, 1] (for logits use "
                          f"binary_cross_entropy_with_logits), got {bad} in shape "
                          f"{array_of(input).shape}")
    bad = _outside_unit_interval(target)
    if bad is not None:  # PyTorch refuses it too; the formula would give a silent number
        raise EveryOError(f"{name}: target must be in [0, 1] (as PyTorch requires), got {bad} "
                          f"in shape {array_of(target).shape}")


def binary_cross_entropy(input, target, weight=None, reduction: str = "mean"):
    """Binary cross-entropy of probabilities ``input`` against targets ``target`` in [0, 1].

    Args:
        input: probabilities in ``[0, 1]``, any shape (e.g. a ``sigmoid``'s output).
        target: same shape.
        weight: optional weight of each element's loss, broadcast to the input (``"mean"``
            still divides by the number of elements, as PyTorch).
        reduction: ``"mean"``, ``"sum"`` or ``"none"``.

    The argument order is PyTorch's (``weight`` before ``reduction``).

    Example:
        >>> import everyo as eo
        >>> round(eo.binary_cross_entropy(eo.tensor([0.5, 0.5]), eo.tensor([1.0, 0.0])).item(), 4)
        0.6931
        >>> eo.binary_cross_entropy(eo.tensor([0.0]), eo.tensor([1.0])).item()  # log clamped
        100.0
    """
    name = "binary_cross_entropy"
    if isinstance(weight, str):  # binary_cross_entropy_with_logits takes reduction third
        raise EveryOError(f"{name}: the third argument is weight (PyTorch's order); pass "
                          f"reduction={weight!r} by name")
    _check_elementwise(name, input, target, reduction)
    _check_probabilities(name, input, target)
    if weight is not None:
        w = _broadcasting_weight(name, "weight", weight, input)
        return weighted_elementwise_loss("binary_cross_entropy", input, target, w, reduction)
    return _elementwise(name, "binary_cross_entropy", input, target, reduction)


class BCELoss(_Loss):
    """Binary cross-entropy of probabilities; see :func:`binary_cross_entropy`.

    Example:
        >>> import everyo as eo
        >>> criterion = eo.BCELoss()
        >>> round(criterion(eo.sigmoid(eo.zeros(3)), eo.ones(3)).item(), 4)
        0.6931
    """

    def __init__(self, weight=None, reduction: str = "mean"):
        super().__init__(reduction)
        self.weight = None if weight is None else np.asarray(array_of(weight))

    def forward(self, input, target):
        return binary_cross_entropy(input, target, self.weight, self.reduction)


OPS = {"binary_cross_entropy": BinaryCrossEntropyOp}
LAYERS = {"BCELoss": BCELoss, "binary_cross_entropy": binary_cross_entropy}
