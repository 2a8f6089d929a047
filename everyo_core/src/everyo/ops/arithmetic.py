"""Elementwise binary ops with NumPy broadcasting: add, sub, mul, div, pow, maximum, minimum,
plus the ternary ``where`` and ``clip``."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op, unbroadcast
from everyo.ops.unary import floating


class Add(Op):
    __slots__ = ("shapes",)
    saved_inputs = ()
    saves_output = False

    def forward(self, a, b):
        self.shapes = (a.shape, b.shape)
        return a + b

    def backward(self, g):
        na, nb = self.needs_input_grad
        return (unbroadcast(g, self.shapes[0]) if na else None,
                unbroadcast(g, self.shapes[1]) if nb else None)


class Sub(Op):
    __slots__ = ("shapes",)
    saved_inputs = ()
    saves_output = False

    def forward(self, a, b):
        self.shapes = (a.shape, b.shape)
        return a - b

    def backward(self, g):
        na, nb = self.needs_input_grad
        return (unbroadcast(g, self.shapes[0]) if na else None,
                unbroadcast(-g, self.shapes[1]) if nb else None)


class Mul(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, a, b):
        self.saved = (a, b)
        return a * b

    def backward(self, g):
        a, b = self.saved
        na, nb = self.needs_input_grad
        return (unbroadcast(g * b, a.shape) if na else None,
                unbroadcast(g * a, b.shape) if nb else None)


class Div(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = True

    def forward(self, a, b):
        if a.dtype.kind not in "fc" and b.dtype.kind not in "fc":
            a, b = floating(a), floating(b)  # true division of integers: float32, as PyTorch
        out = a / b
        self.saved = (a, b, out)
        return out

    def backward(self, g):
        a, b, out = self.saved
        na, nb = self.needs_input_grad
        gb = g / b
        return (unbroadcast(gb, a.shape) if na else None,
                unbroadcast(-gb * out, b.shape) if nb else None)


class Pow(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = True

    def forward(self, a, b):
        out = a ** b
        self.saved = (a, b, out)
        return out

    def backward(self, g):
        a, b, out = self.saved
        na, nb = self.needs_input_grad
        ga = gb = None
        if na:
            ga = unbroadcast(g * b * a ** (b - 1), a.shape)
        if nb:
            # NOTE: d(a**b)/db = a**b * log(a); PyTorch defines it as 0 where a == 0.
            with np.errstate(divide="ignore", invalid="ignore"):
                log_a = np.where(a == 0, 0, np.log(np.where(a == 0, 1, a)))
            gb = unbroadcast(g * out * log_a, b.shape)
        return ga, gb


def _tie_aware(select_a: np.ndarray, ties: np.ndarray, g: np.ndarray):
    # NOTE: where a == b the gradient is split in half, as PyTorch's maximum/minimum do.
    share = np.where(ties, 0.5, select_a).astype(g.dtype, copy=False)
    return g * share, g * (1 - share)


class Maximum(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, a, b):
        self.saved = (a, b)
        return np.maximum(a, b)

    def backward(self, g):
        a, b = self.saved
        ga, gb = _tie_aware(a > b, a == b, g)
        return unbroadcast(ga, a.shape), unbroadcast(gb, b.shape)


class Minimum(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, a, b):
        self.saved = (a, b)
        return np.minimum(a, b)

    def backward(self, g):
        a, b = self.saved
        ga, gb = _tie_aware(a < b, a == b, g)
        return unbroadcast(ga, a.shape), unbroadcast(gb, b.shape)


class Where(Op):
    """``where(condition, a, b)``; the condition is not differentiable."""

    __slots__ = ()
    saved_inputs = (0,)
    saves_output = False

    def forward(self, condition, a, b):
        condition = condition.astype(bool, copy=False)
        self.saved = (condition, a.shape, b.shape)
        return np.where(condition, a, b)

    def backward(self, g):
        condition, sa, sb = self.saved
        _, na, nb = self.needs_input_grad
        zero = np.zeros((), g.dtype)
        return (None,
                unbroadcast(np.where(condition, g, zero), sa) if na else None,
                unbroadcast(np.where(condition, zero, g), sb) if nb else None)


class Clip(Op):
    """``clip(x, min=None, max=None)``; the gradient passes where min <= x <= max."""

    __slots__ = ()
    saved_inputs = (0,)
    saves_output = False

    def forward(self, x, min=None, max=None):
        self.saved = (x, min, max)
        return np.clip(x, min, max)

    def backward(self, g):
        x, lo, hi = self.saved
        inside = np.ones(x.shape, bool)
        if lo is not None:
            inside &= x >= lo
        if hi is not None:
            inside &= x <= hi
        return (np.where(inside, g, np.zeros((), g.dtype)),)


OPS = {"add": Add, "sub": Sub, "mul": Mul, "div": Div, "pow": Pow, "maximum": Maximum,
       "minimum": Minimum, "where": Where, "clip": Clip}
