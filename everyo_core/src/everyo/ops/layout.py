"""Ops that ported PyTorch code reaches for: ``expand`` (broadcast to a shape), ``tril`` /
``triu`` (keep a triangle of the last two axes), ``diag`` and ``cumsum``."""

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


class Diag(Op):
    """PyTorch's ``diag``: a vector becomes a square matrix with it on diagonal ``diagonal``
    (0 the main one, > 0 above, < 0 below); a matrix gives that diagonal as a vector."""

    __slots__ = ("in_shape", "diagonal")
    saved_inputs, saves_output = (), False

    def forward(self, x, diagonal=0):
        if isinstance(diagonal, (bool, np.bool_)) or not isinstance(diagonal, (int, np.integer)):
            raise EveryOError(f"diag: diagonal must be an int, got {diagonal!r} "
                              f"({type(diagonal).__name__})")
        if x.ndim not in (1, 2):
            raise EveryOError(f"diag: needs a vector or a matrix (1 or 2 axes), got shape "
                              f"{x.shape}")
        self.in_shape, self.diagonal = x.shape, int(diagonal)
        # NOTE: np.diagonal returns a read-only view; the result is a tensor of its own.
        return np.diag(x, self.diagonal).copy()

    def backward(self, g):
        if len(self.in_shape) == 1:
            return (np.diagonal(g, self.diagonal).copy(),)
        grad = np.zeros(self.in_shape, g.dtype)
        rows, cols = _diagonal_indices(self.diagonal, len(g))
        grad[rows, cols] = g
        return (grad,)

    def backward_graph(self, g, out):
        if len(self.in_shape) == 1:
            return (dispatch("diag", g, diagonal=self.diagonal),)
        if g.shape[0] == 0:  # no element on that diagonal: zeros (the sum of nothing)
            return (dispatch("expand", dispatch("sum", g), shape=self.in_shape),)
        # the diagonal back in a square matrix, padded (or cropped: only zero rows/columns
        # go) to the operand's shape
        square = dispatch("diag", g, diagonal=self.diagonal)
        side = square.shape[0]
        widths = ((0, self.in_shape[0] - side), (0, self.in_shape[1] - side))
        return (dispatch("pad_mode", square, pad_width=widths, mode="constant", value=0.0),)


def _diagonal_indices(diagonal: int, length: int) -> tuple:
    """Row and column indices of the ``length`` elements of diagonal ``diagonal``."""
    steps = np.arange(length)
    return (steps - min(diagonal, 0), steps + max(diagonal, 0))


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


OPS = {"expand": Expand, "tril": Tril, "triu": Triu, "diag": Diag, "cumsum": CumSum}
