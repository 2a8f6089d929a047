"""Elementwise unary ops: neg, abs, exp, log, sqrt, tanh, sigmoid, relu, cast."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.dispatch import dispatch
from everyo.dtypes import BFLOAT16, FLOAT16, is_floating
from everyo.half_precision import narrow
from everyo.tensor import DEFAULT_FLOAT


def floating(x: np.ndarray) -> np.ndarray:
    """``x`` if it is floating, else ``x`` in the default float (float32), as PyTorch does for
    an integer tensor entering exp, sigmoid, mean, true division... (NumPy would give float64,
    and ``stable_sigmoid`` would even round back to the integer dtype)."""
    return x if is_floating(x.dtype) else x.astype(DEFAULT_FLOAT)


class Neg(Op):
    __slots__ = ()
    saved_inputs = ()
    saves_output = False

    def forward(self, x):
        return -x

    def backward(self, g):
        return (-g,)

    def backward_graph(self, g, out):
        return (-g,)


class Abs(Op):
    __slots__ = ()
    saved_inputs = (0,)
    saves_output = False

    def forward(self, x):
        self.saved = x
        return np.abs(x)

    def backward(self, g):
        return (g * np.sign(self.saved),)

    def backward_graph(self, g, out):
        return (g * np.sign(self.parents[0].data),)


class Exp(Op):
    precision = "float32"
    __slots__ = ()
    saved_inputs = ()
    saves_output = True

    def forward(self, x):
        x = floating(x)
        out = np.exp(x)
        self.saved = out
        return out

    def backward(self, g):
        return (g * self.saved,)

    def backward_graph(self, g, out):
        return (g * out,)


class Log(Op):
    precision = "float32"
    __slots__ = ()
    saved_inputs = (0,)
    saves_output = False

    def forward(self, x):
        x = floating(x)
        self.saved = x
        return np.log(x)

    def backward(self, g):
        return (g / self.saved,)

    def backward_graph(self, g, out):
        return (g / self.parents[0],)


class Sqrt(Op):
    __slots__ = ()
    saved_inputs = ()
    saves_output = True

    def forward(self, x):
        x = floating(x)
        out = np.sqrt(x)
        self.saved = out
        return out

    def backward(self, g):
        return (g / (2 * self.saved),)

    def backward_graph(self, g, out):
        return (g / (out * 2.0),)


class Tanh(Op):
    __slots__ = ()
    saved_inputs = ()
    saves_output = True

    def forward(self, x):
        x = floating(x)
        out = np.tanh(x)
        self.saved = out
        return out

    def backward(self, g):
        y = self.saved
        return (g * (1 - y * y),)

    def backward_graph(self, g, out):
        return (g * (1.0 - out * out),)


def stable_sigmoid(x: np.ndarray) -> np.ndarray:
    """1 / (1 + exp(-x)) without overflow for large |x|."""
    z = np.exp(-np.abs(x))
    return np.where(x >= 0, 1 / (1 + z), z / (1 + z)).astype(x.dtype, copy=False)


class Sigmoid(Op):
    __slots__ = ()
    saved_inputs = ()
    saves_output = True

    def forward(self, x):
        x = floating(x)
        out = stable_sigmoid(x)
        self.saved = out
        return out

    def backward(self, g):
        y = self.saved
        return (g * y * (1 - y),)

    def backward_graph(self, g, out):
        return (g * out * (1.0 - out),)


#: dtype -> (bits of +inf, bits of -inf as int16) of the 16-bit floats: -0.0, negatives and
#: -inf are all <= the second as int16; a negative NaN's bits lie between it and 0.
_HALF_INF_BITS = {FLOAT16: (0x7C00, -1024), BFLOAT16: (0x7F80, -128)}


_SAME_SIZE_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def keep_where(mask: np.ndarray, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``values`` where ``mask`` holds, else +0.0, bit for bit: the gradient of a selection.

    NOTE: multiplying the floats' bits (an integer view) by the 0/1 mask is exact, and for
    float16, whose NumPy arithmetic is ~30x slower than float32, it is much faster than
    ``np.where`` or a float multiply.

    Example:
        >>> keep_where(np.array([True, False]), np.array([1.5, -2.0], np.float16))
        array([1.5, 0. ], dtype=float16)
    """
    ints = _SAME_SIZE_INT.get(values.dtype.itemsize) if is_floating(values.dtype) else None
    if ints is None:
        result = np.where(mask, values, values.dtype.type(0))
        if out is None:
            return result
        out[...] = result
        return out
    if out is None:
        return (values.view(ints) * mask).view(values.dtype)
    np.multiply(values.view(ints), mask, out=out.view(ints))
    return out


class ReLU(Op):
    __slots__ = ()
    saved_inputs = ()
    saves_output = False

    def forward(self, x):
        limits = _HALF_INF_BITS.get(x.dtype)
        if limits is not None:
            # NOTE: NumPy's float16 arithmetic is ~30x slower than float32 (bfloat16's, from
            # ml_dtypes, ~5x), so ReLU works on the int16 bits: -0.0, negatives and -inf
            # become +0.0; NaNs of either sign stay NaN, as in float32. Multiplying by the
            # mask is also ~4x faster than an int16 maximum.
            _, neg_inf_bits = limits
            bits = x.view(np.int16)
            # NOTE: the gradient passes where not x <= 0 (PyTorch's rule: NaN passes it):
            # positives and +NaN have bits > 0, -NaN bits lie in (-inf's bits, 0) as int16.
            self.saved = (bits > neg_inf_bits) & (bits != 0)
            return (bits * (bits > neg_inf_bits)).view(x.dtype)
        with np.errstate(invalid="ignore"):
            self.saved = ~(x <= 0)  # NaN passes the gradient, as in PyTorch
        return np.maximum(x, 0)

    def backward(self, g):
        return (keep_where(self.saved, g),)

    def backward_graph(self, g, out):
        return (g * self.saved.astype(g.data.dtype),)


class Cast(Op):
    """Differentiable dtype conversion; the gradient goes back in the operand's dtype."""

    __slots__ = ("source",)
    saved_inputs = ()
    saves_output = False

    def forward(self, x, dtype):
        self.source = x.dtype
        return narrow(x, dtype)

    def backward(self, g):
        return (narrow(g, self.source),)

    def backward_graph(self, g, out):
        return (dispatch("cast", g, dtype=self.source),)


OPS = {"neg": Neg, "abs": Abs, "exp": Exp, "log": Log, "sqrt": Sqrt, "tanh": Tanh,
       "sigmoid": Sigmoid, "relu": ReLU, "cast": Cast}
