"""Ops that ported PyTorch code reaches for: ``expand`` (broadcast to a shape), ``tril`` /
``triu`` (keep a triangle of the last two axes) and ``cumsum``."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op, unbroadcast
from everyo.axes import check_axis
from everyo.dispatch import dispatch
from everyo.errors import EveryOError
from everyo.ops.reduction import accumulated


def broadcast_axes(shape: tuple, target: tuple) -> tuple:
    """Axes of ``target`` along which an operand of ``shape`` was broadcast (to be summed)."""
    extra = len(target) - len(shape)
    return tuple(range(extra)) + tuple(i + extra for i, n in enumerate(shape)
                                       if n == 1 and target[i + extra] != 1)


class Expand(Op):
    """``x`` broadcast to ``shape`` (NumPy's broadcasting rules); the gradient is summed back."""

    __slots__ = ("in_shape",)
    saved_inputs, saves_output = (), False

    def forward(self, x, shape):
        self.in_shape = x.shape
        try:
            # NOTE: a copy, not NumPy's read-only broadcast view: later in-place updates of
            # the output (an optimizer, masked writes) must not fail or alias.
            return np.array(np.broadcast_to(x, shape))
        except ValueError:
            raise EveryOError(f"expand: cannot expand shape {x.shape} to {tuple(shape)}; only "
                              f"axes of size 1 (or new leading axes) can grow") from None

    def backward(self, g):
        return (unbroadcast(g, self.in_shape),)

    def backward_graph(self, g, out):
        axes = broadcast_axes(self.in_shape, g.shape)
        if axes:
            g = dispatch("sum", g, axis=axes, keepdims=True)
        return (dispatch("reshape", g, shape=self.in_shape),)


class _Triangle(Op):
    """Keep one triangle of the last two axes (``k`` shifts the diagonal), zero the rest."""

    __slots__ = ("k",)
    saved_inputs, saves_output = (), False
    keep = staticmethod(np.tril)

    def forward(self, x, k=0):
        if x.ndim < 2:
            raise EveryOError(f"{self.name}: needs at least 2 axes, got shape {x.shape}")
        self.k = int(k)
        return self.keep(x, self.k)

    def backward(self, g):
        return (self.keep(g, self.k),)

    def backward_graph(self, g, out):
        return (dispatch(self.name, g, k=self.k),)


class Tril(_Triangle):
    __slots__ = ()
    keep = staticmethod(np.tril)


class Triu(_Triangle):
    __slots__ = ()
    keep = staticmethod(np.triu)


def _reversed(axis: int, ndim: int) -> tuple:
    return (slice(None),) * (axis % ndim) + (slice(None, None, -1),)


class CumSum(Op):
    """Running sum along ``axis``; the gradient is the running sum of ``g`` from the end."""

    __slots__ = ("axis",)
    saved_inputs, saves_output = (), False

    def forward(self, x, axis):
        self.axis = check_axis(axis, x.ndim, "cumsum", x.shape)
        return accumulated(np.cumsum, x, axis=self.axis) if x.ndim else x.copy()

    def backward(self, g):
        if g.ndim == 0:
            return (g,)
        flip = _reversed(self.axis, g.ndim)
        return (np.ascontiguousarray(accumulated(np.cumsum, g[flip], axis=self.axis)[flip]),)

    def backward_graph(self, g, out):
        if g.ndim == 0:
            return (g,)
        flip = _reversed(self.axis, g.ndim)
        summed = dispatch("cumsum", dispatch("getitem", g, index=flip), axis=self.axis)
        return (dispatch("getitem", summed, index=flip),)


OPS = {"expand": Expand, "tril": Tril, "triu": Triu, "cumsum": CumSum}
