"""Elementwise unary ops: neg, abs, exp, log, sqrt, tanh, sigmoid, relu, cast."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.dispatch import dispatch
from everyo.dtypes import is_floating
from everyo.half_precision import narrow
from everyo.kernel_registry import kernel
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


class ReLU(Op):
    __slots__ = ()
    saved_inputs = ()
    saves_output = False

    def forward(self, x):
        out, self.saved = kernel.relu_forward(x)  # (the gradient's mask: NaN passes)
        return out

    def backward(self, g):
        return (kernel.keep_where(self.saved, g),)

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
