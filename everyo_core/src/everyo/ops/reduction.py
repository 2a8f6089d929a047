"""Reductions over axes (sum, mean, max, min, var) and the normalising softmax/log_softmax."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.axes import check_axes, check_axis
from everyo.dispatch import dispatch
from everyo.dtypes import HALF_DTYPES
from everyo.errors import EveryOError
from everyo.half_precision import narrow, widen
from everyo.kernel_registry import kernel
from everyo.ops.graph_math import expand_reduced
from everyo.ops.unary import floating


def _axes(axis, shape: tuple, op: str) -> tuple:
    """``axis`` (None, an int or a sequence of ints; see ``check_axis``) as sorted
    non-negative axes; () for a 0-d tensor, whose axis 0 / -1 is the whole tensor."""
    if axis is None:
        return tuple(range(len(shape)))
    if not isinstance(axis, (tuple, list)):
        return (check_axis(axis, len(shape), op, shape),) if shape else ()
    axes = check_axes(axis, len(shape), op, shape)
    return axes if shape else ()


def accumulated(fn, x: np.ndarray, *args, **kwargs) -> np.ndarray:
    """``fn(x, ...)``; a 16-bit ``x`` is summed through float32 and the result rounded once.

    NOTE: NumPy reduces bfloat16 (ml_dtypes) sequentially in bfloat16, so the running sum
    stops growing at 256 when adding values below 1 (the sum of 10,000 values in [0, 1) came
    out as 256); float16's cumsum stalls the same way at 2048. PyTorch accumulates both in
    float32, as the BLAS-shaped ops here already do.

    Example:
        >>> accumulated(np.sum, np.full(1000, 0.5, np.float16)).item()
        500.0
    """
    if x.dtype in HALF_DTYPES:
        return narrow(np.asarray(fn(widen(x), *args, **kwargs)), x.dtype)
    return fn(x, *args, **kwargs)


def _expand(g: np.ndarray, axes: tuple, keepdims: bool) -> np.ndarray:
    """Reinsert reduced axes so ``g`` broadcasts against the operand."""
    return g if keepdims or not axes else np.expand_dims(g, axes)


class Sum(Op):
    precision = "float32"
    __slots__ = ("shape", "axes", "keepdims")
    saved_inputs = ()
    saves_output = False

    def forward(self, x, axis=None, keepdims=False):
        self.shape, self.axes, self.keepdims = x.shape, _axes(axis, x.shape, self.name), keepdims
        return accumulated(np.sum, x, axis=self.axes, keepdims=keepdims)

    def backward(self, g):
        return (np.broadcast_to(_expand(g, self.axes, self.keepdims), self.shape),)

    def backward_graph(self, g, out):
        return (expand_reduced(g, self.axes, self.keepdims, self.shape),)


class Mean(Op):
    precision = "float32"
    __slots__ = ("shape", "axes", "keepdims")
    saved_inputs = ()
    saves_output = False

    def forward(self, x, axis=None, keepdims=False):
        self.shape, self.axes, self.keepdims = x.shape, _axes(axis, x.shape, self.name), keepdims
        x = floating(x)
        if x.size == 0:  # NOTE: NaN where no value is averaged, as PyTorch (NumPy also warns)
            with np.errstate(invalid="ignore"):
                return np.sum(x, axis=self.axes, keepdims=keepdims) / x.dtype.type(self._count())
        return accumulated(np.mean, x, axis=self.axes, keepdims=keepdims)

    def _count(self) -> int:
        return int(np.prod([self.shape[a] for a in self.axes])) if self.axes else 1

    def backward(self, g):
        count = self._count()
        if count == 0:  # (an empty operand: an empty gradient)
            return (np.zeros(self.shape, g.dtype),)
        g = _expand(g, self.axes, self.keepdims) / np.asarray(count, g.dtype)
        return (np.broadcast_to(g, self.shape),)

    def backward_graph(self, g, out):
        count = self._count()
        g = g / float(count) if count else g * 0.0  # (an empty operand: an empty gradient)
        return (expand_reduced(g, self.axes, self.keepdims, self.shape),)


class _Extremum(Op):
    __slots__ = ("axes", "keepdims")
    saved_inputs = (0,)
    saves_output = True
    reducer = staticmethod(np.max)

    def forward(self, x, axis=None, keepdims=False):
        self.axes, self.keepdims = _axes(axis, x.shape, self.name), keepdims
        if x.size == 0:
            _refuse_empty(self.name, x.shape, self.axes)
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


def _refuse_empty(op: str, shape: tuple, axes: tuple) -> None:
    """Raise when one of ``axes`` is empty: the max (min) of no values does not exist (NumPy's
    raw ValueError; PyTorch refuses it too)."""
    for a in axes:
        if shape[a] == 0:
            raise EveryOError(f"{op}: axis {a} of shape {shape} is empty, and the {op} of no "
                              f"values does not exist; reduce a non-empty axis")


class Max(_Extremum):
    __slots__ = ()
    reducer = staticmethod(np.max)


class Min(_Extremum):
    __slots__ = ()
    reducer = staticmethod(np.min)


class Var(Op):
    """Variance with NumPy's ``ddof`` (default 0, the population variance)."""

    precision = "float32"
    __slots__ = ("axes", "keepdims", "denominator")
    # NOTE: backward keeps its own centred copy, but backward_graph (create_graph) recomputes
    # it from the operand, so an in-place write to the operand must be caught (as PyTorch's).
    saved_inputs = (0,)
    saves_output = False

    def forward(self, x, axis=None, keepdims=False, ddof=0):
        self.axes, self.keepdims = _axes(axis, x.shape, self.name), keepdims
        count = int(np.prod([x.shape[a] for a in self.axes])) if self.axes else 1
        # NOTE: PyTorch's rule: ddof >= N divides by 0 (inf, or nan for an empty sum), never
        # by a negative count (which would give a negative variance).
        self.denominator = max(count - ddof, 0)
        x = floating(x)
        dtype = x.dtype
        x = widen(x)  # 16-bit values are centred and summed in float32 (see accumulated)
        centered = x - x.mean(axis=self.axes, keepdims=True) if x.size else x
        self.saved = centered
        with np.errstate(divide="ignore", invalid="ignore"):
            out = np.sum(centered * centered, axis=self.axes, keepdims=keepdims) / \
                np.asarray(self.denominator, x.dtype)
        return narrow(np.asarray(out), dtype)

    def _scale(self, dtype) -> np.ndarray:
        with np.errstate(divide="ignore"):
            return np.divide(np.asarray(2.0, dtype), np.asarray(self.denominator, dtype))

    def backward(self, g):
        centered = self.saved
        with np.errstate(invalid="ignore"):
            return (_expand(g, self.axes, self.keepdims) * centered * self._scale(g.dtype),)

    def backward_graph(self, g, out):
        (x,) = self.parents
        centered = x - dispatch("mean", x, axis=self.axes, keepdims=True)
        g = expand_reduced(g, self.axes, self.keepdims, x.shape)
        with np.errstate(invalid="ignore"):
            return (g * centered * self._scale(g.data.dtype),)


def _softmax_axis(axis, x: np.ndarray, op: str) -> int | None:
    """The normalised axis; None for a 0-d tensor, which is its own one-element axis
    (PyTorch: softmax 1, log_softmax 0)."""
    checked = check_axis(axis, x.ndim, op, x.shape)
    return checked if x.ndim else None


class Softmax(Op):
    precision = "float32"
    __slots__ = ("axis",)
    saved_inputs = ()
    saves_output = True

    def forward(self, x, axis=-1):
        self.axis = _softmax_axis(axis, x, self.name)
        x = floating(x)
        if x.size == 0:  # nothing to normalise (np.max has no identity)
            self.saved = x
            return x.copy()
        wide = widen(x)  # a 16-bit row is normalised in float32 and rounded once
        shifted = np.exp(wide - wide.max(axis=self.axis, keepdims=True))
        out = narrow(shifted / shifted.sum(axis=self.axis, keepdims=True), x.dtype)
        self.saved = out
        return out

    def backward(self, g):
        y, g = widen(self.saved), widen(g)  # (the engine rounds to the operand's dtype)
        return (y * (g - (g * y).sum(axis=self.axis, keepdims=True)),)

    def backward_graph(self, g, out):
        dot = dispatch("sum", g * out, axis=self.axis, keepdims=True)
        return (out * (g - dot),)


def log_softmax_array(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable log(softmax(x)) on a plain float32/float64 array (the ``log_softmax``
    kernel, see everyo.ops.softmax_kernels)."""
    return kernel.log_softmax(x, axis)


class LogSoftmax(Op):
    precision = "float32"
    __slots__ = ("axis",)
    saved_inputs = ()
    saves_output = True

    def forward(self, x, axis=-1):
        self.axis = _softmax_axis(axis, x, self.name)
        x = floating(x)
        out = narrow(log_softmax_array(widen(x), self.axis), x.dtype) if x.size else x.copy()
        self.saved = out
        return out

    def backward(self, g):
        g = widen(g)  # (the engine rounds the result to the operand's dtype)
        return (g - np.exp(widen(self.saved)) * g.sum(axis=self.axis, keepdims=True),)

    def backward_graph(self, g, out):
        total = dispatch("sum", g, axis=self.axis, keepdims=True)
        return (g - dispatch("exp", out) * total,)


OPS = {"sum": Sum, "mean": Mean, "max": Max, "min": Min, "var": Var, "softmax": Softmax,
       "log_softmax": LogSoftmax}
