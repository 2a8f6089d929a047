"""Reductions over axes (sum, mean, max, min, var) and the normalising softmax/log_softmax."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.dispatch import dispatch
from everyo.errors import EveryOError
from everyo.ops.graph_math import expand_reduced
from everyo.ops.unary import floating


def _axes(axis, shape: tuple, op: str) -> tuple:
    """``axis`` (None, an int or ints, negatives allowed) as sorted non-negative axes."""
    if axis is None:
        return tuple(range(len(shape)))
    ndim = len(shape)
    if isinstance(axis, (int, np.integer)):
        axis = (axis,)
    # NOTE: a 0-d tensor accepts axis 0 / -1, as PyTorch's; anything else out of range is an
    # error, never wrapped modulo ndim (which would silently reduce another axis).
    bound = max(ndim, 1)
    if any(not -bound <= a < bound for a in axis):
        raise EveryOError(f"{op}: axis {axis if len(axis) > 1 else axis[0]} is out of range "
                          f"for shape {shape}")
    return tuple(sorted(a % ndim for a in axis)) if ndim else ()


def _expand(g: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    """Reinsert reduced axes so ``g`` broadcasts against the operand."""
    return g if keepdims or not axes else np.expand_dims(g, axes)


class Sum(Op):
    __slots__ = ("shape", "axes", "keepdims")
    saved_inputs = ()
    saves_output = False

    def forward(self, x, axis=None, keepdims=False):
        self.shape, self.axes, self.keepdims = x.shape, _axes(axis, x.shape, self.name), keepdims
        return np.sum(x, axis=self.axes, keepdims=keepdims)

    def backward(self, g):
        return (np.broadcast_to(_expand(g, self.axes, self.keepdims), self.shape),)

    def backward_graph(self, g, out):
        return (expand_reduced(g, self.axes, self.keepdims, self.shape),)


class Mean(Op):
    __slots__ = ("shape", "axes", "keepdims")
    saved_inputs = ()
    saves_output = False

    def forward(self, x, axis=None, keepdims=False):
        self.shape, self.axes, self.keepdims = x.shape, _axes(axis, x.shape, self.name), keepdims
        return np.mean(floating(x), axis=self.axes, keepdims=keepdims)

    def backward(self, g):
        count = int(np.prod([self.shape[a] for a in self.axes])) if self.axes else 1
        g = _expand(g, self.axes, self.keepdims) / np.asarray(count, g.dtype)
        return (np.broadcast_to(g, self.shape),)

    def backward_graph(self, g, out):
        count = int(np.prod([self.shape[a] for a in self.axes])) if self.axes else 1
        return (expand_reduced(g / float(count), self.axes, self.keepdims, self.shape),)


class _Extremum(Op):
    __slots__ = ("axes", "keepdims")
    saved_inputs = (0,)
    saves_output = True
    reducer = staticmethod(np.max)

    def forward(self, x, axis=None, keepdims=False):
        self.axes, self.keepdims = _axes(axis, x.shape, self.name), keepdims
        out = self.reducer(x, axis=self.axes, keepdims=True)
        self.saved = (x, out)
        return out if keepdims else np.squeeze(out, self.axes)

    def backward(self, g):
        x, out = self.saved
        # NOTE: ties share the gradient evenly (as PyTorch's amax/amin do).
        hits = x == out
        share = hits / hits.sum(axis=self.axes, keepdims=True)
        return (_expand(g, self.axes, self.keepdims) * share.astype(g.dtype, copy=False),)

    def backward_graph(self, g, out):
        x, top = self.saved
        hits = x == top
        share = (hits / hits.sum(axis=self.axes, keepdims=True)).astype(g.data.dtype, copy=False)
        return (expand_reduced(g, self.axes, self.keepdims, x.shape) * share,)


class Max(_Extremum):
    __slots__ = ()
    reducer = staticmethod(np.max)


class Min(_Extremum):
    __slots__ = ()
    reducer = staticmethod(np.min)


class Var(Op):
    """Variance with NumPy's ``ddof`` (default 0, the population variance)."""

    __slots__ = ("axes", "keepdims", "denominator")
    saved_inputs = ()
    saves_output = False

    def forward(self, x, axis=None, keepdims=False, ddof=0):
        self.axes, self.keepdims = _axes(axis, x.shape, self.name), keepdims
        count = int(np.prod([x.shape[a] for a in self.axes])) if self.axes else 1
        self.denominator = count - ddof
        x = floating(x)
        centered = x - x.mean(axis=self.axes, keepdims=True)
        self.saved = centered
        return np.sum(centered * centered, axis=self.axes, keepdims=keepdims) / self.denominator

    def backward(self, g):
        centered = self.saved
        scale = np.asarray(2 / self.denominator, g.dtype)
        return (_expand(g, self.axes, self.keepdims) * centered * scale,)

    def backward_graph(self, g, out):
        (x,) = self.parents
        centered = x - dispatch("mean", x, axis=self.axes, keepdims=True)
        g = expand_reduced(g, self.axes, self.keepdims, x.shape)
        return (g * centered * (2.0 / self.denominator),)


class Softmax(Op):
    __slots__ = ("axis",)
    saved_inputs = ()
    saves_output = True

    def forward(self, x, axis=-1):
        self.axis = axis
        x = floating(x)
        shifted = np.exp(x - x.max(axis=axis, keepdims=True))
        out = shifted / shifted.sum(axis=axis, keepdims=True)
        self.saved = out
        return out

    def backward(self, g):
        y = self.saved
        return (y * (g - (g * y).sum(axis=self.axis, keepdims=True)),)

    def backward_graph(self, g, out):
        dot = dispatch("sum", g * out, axis=self.axis, keepdims=True)
        return (out * (g - dot),)


def log_softmax_array(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable log(softmax(x)) on a plain array."""
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


class LogSoftmax(Op):
    __slots__ = ("axis",)
    saved_inputs = ()
    saves_output = True

    def forward(self, x, axis=-1):
        self.axis = axis
        out = log_softmax_array(floating(x), axis)
        self.saved = out
        return out

    def backward(self, g):
        return (g - np.exp(self.saved) * g.sum(axis=self.axis, keepdims=True),)

    def backward_graph(self, g, out):
        total = dispatch("sum", g, axis=self.axis, keepdims=True)
        return (g - dispatch("exp", out) * total,)


OPS = {"sum": Sum, "mean": Mean, "max": Max, "min": Min, "var": Var, "softmax": Softmax,
       "log_softmax": LogSoftmax}
