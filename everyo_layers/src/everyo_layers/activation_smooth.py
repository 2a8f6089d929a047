"""Smooth and gated activations: ``SiLU``, ``Softplus``, ``ELU``, ``Hardswish``, ``Mish``.

Each op computes its forward and first derivative on arrays (float16 through float32), and
re-expresses its forward with differentiable EveryO ops in ``composite`` for second derivatives.
"""

from __future__ import annotations

import numpy as np

from everyo import Op, dispatch
from everyo.kernels import stable_sigmoid
from everyo_layers.activation import _Activation
from everyo_layers.checks import argument


def _compute(x: np.ndarray) -> np.ndarray:
    return x.astype(np.float32) if x.dtype == np.float16 else x


def softplus_array(x: np.ndarray, beta: float = 1.0, threshold: float = 20.0) -> np.ndarray:
    """``log(1 + exp(beta x)) / beta``, linear above ``threshold`` (PyTorch's rule)."""
    bx = x * beta
    return np.where(bx > threshold, x, np.logaddexp(0, bx) / beta).astype(x.dtype, copy=False)


class _ElementwiseOp(Op):
    """``forward`` stores the float32-or-wider input; subclasses give ``value``/``slope``."""

    __slots__ = ("attrs",)
    saved_inputs = (0,)  # the input itself (or its float32 copy)
    saves_output = False

    def forward(self, x, **attrs):
        self.attrs = attrs
        xc = _compute(x)
        self.saved = xc
        return self.value(xc).astype(x.dtype, copy=False)

    def backward(self, g):
        return ((g * self.slope(self.saved)).astype(g.dtype, copy=False),)


class SiLUOp(_ElementwiseOp):
    """``x * sigmoid(x)``."""

    __slots__ = ()

    def value(self, x):
        return x * stable_sigmoid(x)

    def slope(self, x):
        s = stable_sigmoid(x)
        return s * (1 + x * (1 - s))

    def composite(self, x):
        return x * dispatch("sigmoid", x)


class SoftplusOp(_ElementwiseOp):
    """``log(1 + exp(beta x)) / beta``; the identity where ``beta x > threshold``."""

    __slots__ = ()

    def value(self, x):
        return softplus_array(x, self.attrs.get("beta", 1.0), self.attrs.get("threshold", 20.0))

    def slope(self, x):
        beta, threshold = self.attrs.get("beta", 1.0), self.attrs.get("threshold", 20.0)
        return np.where(x * beta > threshold, 1.0, stable_sigmoid(x * beta)).astype(x.dtype)

    def composite(self, x):
        beta, threshold = self.attrs.get("beta", 1.0), self.attrs.get("threshold", 20.0)
        bx = x * beta
        # log(1 + e^t) = max(t, 0) + log(1 + e^-|t|), stable for any t
        smooth = (dispatch("relu", bx) + dispatch("log", 1.0 + dispatch("exp", -dispatch(
            "abs", bx)))) / beta
        return dispatch("where", bx.data > threshold, x, smooth)


class ELUOp(_ElementwiseOp):
    """``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere."""

    __slots__ = ()

    def value(self, x):
        alpha = self.attrs.get("alpha", 1.0)
        return np.where(x > 0, x, alpha * np.expm1(np.minimum(x, 0)))

    def slope(self, x):
        alpha = self.attrs.get("alpha", 1.0)
        return np.where(x > 0, 1.0, alpha * np.exp(np.minimum(x, 0))).astype(x.dtype)

    def composite(self, x):
        alpha = self.attrs.get("alpha", 1.0)
        negative = alpha * (dispatch("exp", dispatch("minimum", x, 0.0)) - 1.0)
        return dispatch("where", x.data > 0, x, negative)


class HardswishOp(_ElementwiseOp):
    """``x * relu6(x + 3) / 6``."""

    __slots__ = ()

    def value(self, x):
        return x * np.clip(x + 3, 0, 6) / 6

    def slope(self, x):
        # PyTorch's derivative: 0 below -3, 1 above 3, (2x + 3) / 6 between (both ends open)
        return np.where(x < -3, 0.0, np.where(x > 3, 1.0, (2 * x + 3) / 6)).astype(x.dtype)

    def composite(self, x):
        return x * dispatch("clip", x + 3.0, min=0.0, max=6.0) / 6.0


class MishOp(_ElementwiseOp):
    """``x * tanh(softplus(x))``."""

    __slots__ = ()

    def value(self, x):
        return x * np.tanh(softplus_array(x))

    def slope(self, x):
        t = np.tanh(softplus_array(x))
        return t + x * (1 - t * t) * stable_sigmoid(x)

    def composite(self, x):
        smooth = dispatch("relu", x) + dispatch("log", 1.0 + dispatch("exp", -dispatch("abs", x)))
        return x * dispatch("tanh", smooth)


class SiLU(_Activation):
    """Sigmoid-weighted linear unit (swish): ``x * sigmoid(x)``.

    Example:
        >>> import everyo as eo
        >>> round(float(eo.SiLU()(eo.tensor([1.0])).data[0]), 4)
        0.7311
    """

    def activate(self, x):
        return dispatch("silu", x)


class Softplus(_Activation):
    """``log(1 + exp(beta x)) / beta``, the identity where ``beta x > threshold``.

    Example:
        >>> import everyo as eo
        >>> round(float(eo.Softplus()(eo.tensor([0.0])).data[0]), 4)
        0.6931
    """

    def __init__(self, beta: float = 1.0, threshold: float = 20.0):
        super().__init__()
        self.beta = argument("Softplus", "beta", beta, "positive float")
        self.threshold = argument("Softplus", "threshold", threshold, "float")

    def activate(self, x):
        return dispatch("softplus", x, beta=self.beta, threshold=self.threshold)

    def extra_repr(self) -> str:
        return f"beta={self.beta}, threshold={self.threshold}"


class ELU(_Activation):
    """Exponential linear unit: ``x`` where positive, ``alpha * (exp(x) - 1)`` elsewhere.

    Example:
        >>> import everyo as eo
        >>> eo.ELU()(eo.tensor([2.0, 0.0])).data
        array([2., 0.], dtype=float32)
    """

    def __init__(self, alpha: float = 1.0):
        super().__init__()
        self.alpha = argument("ELU", "alpha", alpha, "float")

    def activate(self, x):
        return dispatch("elu", x, alpha=self.alpha)

    def extra_repr(self) -> str:
        return f"alpha={self.alpha}"


class Hardswish(_Activation):
    """``x * relu6(x + 3) / 6`` (MobileNetV3's activation).

    Example:
        >>> import everyo as eo
        >>> eo.Hardswish()(eo.tensor([-4.0, 4.0])).data
        array([-0.,  4.], dtype=float32)
    """

    def activate(self, x):
        return dispatch("hardswish", x)


class Mish(_Activation):
    """``x * tanh(softplus(x))``.

    Example:
        >>> import everyo as eo
        >>> round(float(eo.Mish()(eo.tensor([1.0])).data[0]), 4)
        0.8651
    """

    def activate(self, x):
        return dispatch("mish", x)


OPS = {"silu": SiLUOp, "softplus": SoftplusOp, "elu": ELUOp, "hardswish": HardswishOp,
       "mish": MishOp}
LAYERS = {"SiLU": SiLU, "Softplus": Softplus, "ELU": ELU, "Hardswish": Hardswish, "Mish": Mish}
