"""Activation layers (ReLU, Sigmoid, Tanh, Softmax, LogSoftmax, GELU, LeakyReLU) and the two
ops the core lacks, ``gelu`` and ``leaky_relu``."""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Module, Op, dispatch
from everyo_layers.checks import argument, check_float

_erf_implementation = None


def _erf(x: np.ndarray) -> np.ndarray:
    """Elementwise erf: SciPy's when installed (exact and fast), else ``math.erf`` per element.

    NOTE: SciPy is looked up on first use, not at import: importing scipy.special costs
    ~150 ms, which ``import everyo`` must not pay. SciPy is optional, not a dependency.
    """
    global _erf_implementation
    if _erf_implementation is None:
        try:
            from scipy.special import erf as scipy_erf
            _erf_implementation = scipy_erf
        except ImportError:  # pragma: no cover - exercised only where SciPy is absent
            scalar = np.vectorize(math.erf, otypes=[np.float64])
            _erf_implementation = lambda v: scalar(v).astype(v.dtype, copy=False)  # noqa: E731
    return _erf_implementation(x)


_SQRT_2_OVER_PI = math.sqrt(2.0 / math.pi)
_INV_SQRT_2 = 1.0 / math.sqrt(2.0)
_INV_SQRT_2PI = 1.0 / math.sqrt(2.0 * math.pi)


class NormalCDFOp(Op):
    """``Phi(x) = (1 + erf(x / sqrt 2)) / 2``, the standard normal CDF (GELU's gate, in the
    composite that second derivatives of ``gelu`` differentiate)."""

    __slots__ = ()
    name = "normal_cdf"
    saved_inputs = (0,)
    saves_output = False

    def forward(self, x):
        self.saved = x
        return 0.5 * (1 + _erf(x * _INV_SQRT_2))

    def backward(self, g):
        x = self.saved
        return (g * (_INV_SQRT_2PI * np.exp(-0.5 * x * x)),)

    def backward_graph(self, g, out):
        (x,) = self.parents
        return (g * dispatch("exp", x * x * -0.5) * _INV_SQRT_2PI,)


class GELUOp(Op):
    """``x * Phi(x)`` (erf form) or its tanh approximation (``approximate="tanh"``)."""

    __slots__ = ("approximate",)

    def forward(self, x, approximate="none"):
        self.approximate = approximate
        dtype = x.dtype
        x32 = x if dtype != np.float16 else x.astype(np.float32)
        if approximate == "tanh":
            inner = _SQRT_2_OVER_PI * (x32 + 0.044715 * x32 ** 3)
            t = np.tanh(inner)
            self.saved = (x32, t)
            out = 0.5 * x32 * (1 + t)
        else:
            cdf = 0.5 * (1 + _erf(x32 * _INV_SQRT_2))
            self.saved = (x32, cdf)
            out = x32 * cdf
        return out.astype(dtype, copy=False)

    def backward(self, g):
        x, second = self.saved
        if self.approximate == "tanh":
            t = second
            d_inner = _SQRT_2_OVER_PI * (1 + 3 * 0.044715 * x * x)
            dydx = 0.5 * (1 + t) + 0.5 * x * (1 - t * t) * d_inner
        else:
            dydx = second + x * (_INV_SQRT_2PI * np.exp(-0.5 * x * x))
        return ((g * dydx).astype(g.dtype, copy=False),)

    def composite(self, x):
        """``x * Phi(x)`` (or the tanh form) with differentiable ops."""
        if self.approximate == "tanh":
            inner = (x + x * x * x * 0.044715) * _SQRT_2_OVER_PI
            return x * 0.5 * (1.0 + dispatch("tanh", inner))
        return x * NormalCDFOp.apply(x)


class LeakyReLUOp(Op):
    """``x`` where positive, ``negative_slope * x`` elsewhere."""

    __slots__ = ("slope",)

    def forward(self, x, negative_slope=0.01):
        self.slope = negative_slope
        positive = x > 0
        self.saved = positive
        return np.where(positive, x, x * x.dtype.type(negative_slope))

    def backward(self, g):
        return (np.where(self.saved, g, g * g.dtype.type(self.slope)),)

    def backward_graph(self, g, out):
        return (dispatch("where", self.saved, g, g * self.slope),)


class _Activation(Module):
    """An activation with no parameters; subclasses implement ``activate(x)`` (``apply(fn)`` is
    ``Module.apply``, as in PyTorch)."""

    def forward(self, x):
        check_float(type(self).__name__, x)
        return self.activate(x)


class ReLU(_Activation):
    """``max(x, 0)``.

    Example:
        >>> import everyo as eo
        >>> eo.ReLU()(eo.tensor([-1.0, 2.0])).data
        array([0., 2.], dtype=float32)
    """

    def activate(self, x):
        return dispatch("relu", x)


class Sigmoid(_Activation):
    """``1 / (1 + exp(-x))``, stable for large |x|."""

    def activate(self, x):
        return dispatch("sigmoid", x)


class Tanh(_Activation):
    """Hyperbolic tangent."""

    def activate(self, x):
        return dispatch("tanh", x)


class Softmax(_Activation):
    """Softmax along ``axis`` (default the last).

    Example:
        >>> import everyo as eo
        >>> eo.Softmax()(eo.zeros(1, 4)).data
        array([[0.25, 0.25, 0.25, 0.25]], dtype=float32)
    """

    def __init__(self, axis: int = -1, *, dim=None):
        super().__init__()
        if dim is not None:  # PyTorch's name (nn.Softmax(dim=1)) for the same argument
            if axis != -1:
                raise EveryOError(f"{type(self).__name__}: got both axis={axis!r} and "
                                  f"PyTorch's dim={dim!r}; pass one")
            axis = dim
        self.axis = argument(type(self).__name__, "axis", axis, "int")

    def activate(self, x):
        return dispatch("softmax", x, axis=self.axis)

    def extra_repr(self) -> str:
        return f"axis={self.axis}"


class LogSoftmax(Softmax):
    """``log(softmax(x))`` along ``axis``, computed stably."""

    def activate(self, x):
        return dispatch("log_softmax", x, axis=self.axis)


class GELU(_Activation):
    """Gaussian error linear unit ``x * Phi(x)``; ``approximate="tanh"`` for the tanh form.

    Example:
        >>> import everyo as eo
        >>> round(float(eo.GELU()(eo.tensor([1.0])).data[0]), 4)
        0.8413
    """

    def __init__(self, approximate: str = "none"):
        super().__init__()
        if approximate not in ("none", "tanh"):
            raise EveryOError(f"GELU: approximate must be 'none' or 'tanh', got {approximate!r}")
        self.approximate = approximate

    def activate(self, x):
        return dispatch("gelu", x, approximate=self.approximate)

    def extra_repr(self) -> str:
        return f"approximate={self.approximate!r}"


class LeakyReLU(_Activation):
    """``x`` where positive, ``negative_slope * x`` elsewhere (default slope 0.01)."""

    def __init__(self, negative_slope: float = 0.01):
        super().__init__()
        self.negative_slope = argument("LeakyReLU", "negative_slope", negative_slope, "float")

    def activate(self, x):
        return dispatch("leaky_relu", x, negative_slope=self.negative_slope)

    def extra_repr(self) -> str:
        return f"negative_slope={self.negative_slope}"


OPS = {"gelu": GELUOp, "leaky_relu": LeakyReLUOp}
LAYERS = {"ReLU": ReLU, "Sigmoid": Sigmoid, "Tanh": Tanh, "Softmax": Softmax,
          "LogSoftmax": LogSoftmax, "GELU": GELU, "LeakyReLU": LeakyReLU}
