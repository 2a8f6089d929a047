"""Elementwise binary ops with NumPy broadcasting: add, sub, mul, div, pow, maximum, minimum,
plus the ternary ``where`` and ``clip``."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op, unbroadcast
from everyo.dispatch import dispatch
from everyo.dtypes import result_dtype
from everyo.errors import EveryOError
from everyo.ops.graph_math import constant, unbroadcast_tensor
from everyo.ops.unary import floating
from everyo.tensor import Tensor


def refuse_unbroadcastable(op: str, *arrays: np.ndarray) -> None:
    """Raise an EveryOError naming ``op`` and the shapes when ``arrays`` do not broadcast
    together; return (so that the caller re-raises NumPy's error) when they do.

    For an op's ``except ValueError:`` around its NumPy call: the check costs nothing until
    NumPy has refused the operands.
    """
    shapes = [a.shape for a in arrays]
    try:
        np.broadcast_shapes(*shapes)
    except ValueError:
        listed = ", ".join(map(str, shapes[:-1])) + f" and {shapes[-1]}"
        raise EveryOError(f"{op}: operands of shapes {listed} do not broadcast: aligned from "
                          f"the last axis, each pair of sizes must be equal or one of them 1"
                          ) from None


class Add(Op):
    __slots__ = ("shapes",)
    saved_inputs = ()
    saves_output = False

    def forward(self, a, b):
        self.shapes = (a.shape, b.shape)
        try:
            return a + b
        except ValueError:
            refuse_unbroadcastable(self.name, a, b)
            raise

    def backward(self, g):
        na, nb = self.needs_input_grad
        return (unbroadcast(g, self.shapes[0]) if na else None,
                unbroadcast(g, self.shapes[1]) if nb else None)

    def backward_graph(self, g, out):
        na, nb = self.needs_input_grad
        return (unbroadcast_tensor(g, self.shapes[0]) if na else None,
                unbroadcast_tensor(g, self.shapes[1]) if nb else None)


class Sub(Op):
    __slots__ = ("shapes",)
    saved_inputs = ()
    saves_output = False

    def forward(self, a, b):
        self.shapes = (a.shape, b.shape)
        try:
            return a - b
        except ValueError:
            refuse_unbroadcastable(self.name, a, b)
            raise

    def backward(self, g):
        na, nb = self.needs_input_grad
        return (unbroadcast(g, self.shapes[0]) if na else None,
                unbroadcast(-g, self.shapes[1]) if nb else None)

    def backward_graph(self, g, out):
        na, nb = self.needs_input_grad
        return (unbroadcast_tensor(g, self.shapes[0]) if na else None,
                unbroadcast_tensor(-g, self.shapes[1]) if nb else None)


class Mul(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = False
    gradient_reads = "others"

    def forward(self, a, b):
        self.saved = (a, b)
        try:
            return a * b
        except ValueError:
            refuse_unbroadcastable(self.name, a, b)
            raise

    def backward(self, g):
        a, b = self.saved
        na, nb = self.needs_input_grad
        return (unbroadcast(g * b, a.shape) if na else None,
                unbroadcast(g * a, b.shape) if nb else None)

    def backward_graph(self, g, out):
        a, b = self.parents
        na, nb = self.needs_input_grad
        return (unbroadcast_tensor(g * b, a.shape) if na else None,
                unbroadcast_tensor(g * a, b.shape) if nb else None)


class Div(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = False
    # g / b, and -g * ((a / b) / b): PyTorch's formulas, which read a and b, not the output
    gradient_reads = ((1,), (0, 1))

    def forward(self, a, b):
        if a.dtype.kind not in "fc" and b.dtype.kind not in "fc":
            a, b = floating(a), floating(b)  # true division of integers: float32, as PyTorch
        try:
            out = a / b
        except ValueError:
            refuse_unbroadcastable(self.name, a, b)
            raise
        self.saved = (a, b)
        return out

    def backward(self, g):
        a, b = self.saved
        na, nb = self.needs_input_grad
        return (unbroadcast(g / b, a.shape) if na else None,
                unbroadcast(-g * ((a / b) / b), b.shape) if nb else None)

    def backward_graph(self, g, out):
        a, b = self.parents
        na, nb = self.needs_input_grad
        return (unbroadcast_tensor(g / b, a.shape) if na else None,
                unbroadcast_tensor(-g * ((a / b) / b), b.shape) if nb else None)


def _lowered(b):
    """``b - 1``, except 1 where ``b == 0``: then ``b * a ** (b - 1)`` is 0 even at a == 0
    (PyTorch's gradient of ``x ** 0`` is 0 everywhere; 0 * 0 ** -1 would be NaN)."""
    return np.where(b == 0, np.ones((), b.dtype), b - 1)


class Pow(Op):
    precision = "float32"
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = True
    gradient_reads = ((0, 1), (0, -1))  # b * a ** (b - 1), and out * log(a)

    def forward(self, a, b):
        if a.dtype.kind in "iub" and b.dtype.kind in "iub" and (b < 0).any():
            raise EveryOError(f"pow: an integer tensor ({a.dtype}) to a negative integer "
                              f"exponent ({b.min()}) has no integer result; make the base or "
                              f"the exponent floating")
        try:
            out = a ** b
        except ValueError:
            refuse_unbroadcastable(self.name, a, b)
            raise
        self.saved = (a, b, out)
        return out

    def backward(self, g):
        a, b, out = self.saved
        na, nb = self.needs_input_grad
        ga = gb = None
        if na:
            ga = unbroadcast(g * b * a ** _lowered(b), a.shape)
        if nb:
            # NOTE: d(a**b)/db = a**b * log(a); PyTorch defines it as 0 where a == 0.
            with np.errstate(divide="ignore", invalid="ignore"):
                log_a = np.where(a == 0, 0, np.log(np.where(a == 0, 1, a)))
            gb = unbroadcast(g * out * log_a, b.shape)
        return ga, gb

    def backward_graph(self, g, out):
        a, b = self.parents
        na, nb = self.needs_input_grad
        ga = gb = None
        if na:
            exponent = dispatch("where", constant(b.data == 0), np.ones((), b.data.dtype), b - 1)
            ga = unbroadcast_tensor(g * b * a ** exponent, a.shape)
        if nb:
            zero = constant(a.data == 0)
            log_a = dispatch("where", zero, 0.0, dispatch("log", dispatch("where", zero, 1.0, a)))
            gb = unbroadcast_tensor(g * out * log_a, b.shape)
        return ga, gb


def _selection(a: np.ndarray, b: np.ndarray, wins) -> tuple:
    """Where ``a`` is the output of maximum/minimum, and where the two tie.

    NOTE: NaN propagates (np.maximum), so a NaN operand is the output and gets the gradient;
    two NaNs tie. (PyTorch gives the full gradient to *both* operands there.)
    """
    with np.errstate(invalid="ignore"):
        nan_a, nan_b = np.isnan(a), np.isnan(b)
        return wins(a, b) | (nan_a & ~nan_b), (a == b) | (nan_a & nan_b)


def _tie_aware(select_a: np.ndarray, ties: np.ndarray, g: np.ndarray):
    # NOTE: where a == b the gradient is split in half, as PyTorch's maximum/minimum do.
    share = np.where(ties, 0.5, select_a).astype(g.dtype, copy=False)
    return g * share, g * (1 - share)


def _tie_aware_graph(op, wins, g):
    a, b = op.parents
    select_a, ties = _selection(a.data, b.data, wins)
    share = np.where(ties, 0.5, select_a).astype(g.data.dtype, copy=False)
    return (unbroadcast_tensor(g * share, a.shape), unbroadcast_tensor(g * (1 - share), b.shape))


class Maximum(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, a, b):
        self.saved = (a, b)
        try:
            return np.maximum(a, b)
        except ValueError:
            refuse_unbroadcastable(self.name, a, b)
            raise

    def backward(self, g):
        a, b = self.saved
        ga, gb = _tie_aware(*_selection(a, b, np.greater), g)
        return unbroadcast(ga, a.shape), unbroadcast(gb, b.shape)

    def backward_graph(self, g, out):
        return _tie_aware_graph(self, np.greater, g)


class Minimum(Op):
    __slots__ = ()
    saved_inputs = (0, 1)
    saves_output = False

    def forward(self, a, b):
        self.saved = (a, b)
        try:
            return np.minimum(a, b)
        except ValueError:
            refuse_unbroadcastable(self.name, a, b)
            raise

    def backward(self, g):
        a, b = self.saved
        ga, gb = _tie_aware(*_selection(a, b, np.less), g)
        return unbroadcast(ga, a.shape), unbroadcast(gb, b.shape)

    def backward_graph(self, g, out):
        return _tie_aware_graph(self, np.less, g)


class Where(Op):
    """``where(condition, a, b)``; the condition is not differentiable."""

    __slots__ = ()
    saved_inputs = (0,)
    saves_output = False

    def forward(self, condition, a, b):
        condition = condition.astype(bool, copy=False)
        self.saved = (condition, a.shape, b.shape)
        if a.dtype != b.dtype:  # (float16 with bfloat16: float32 with any ml_dtypes)
            common = result_dtype(a, b)
            a, b = a.astype(common, copy=False), b.astype(common, copy=False)
        try:
            return np.where(condition, a, b)
        except ValueError:
            refuse_unbroadcastable(self.name, condition, a, b)
            raise

    def backward(self, g):
        condition, sa, sb = self.saved
        _, na, nb = self.needs_input_grad
        zero = np.zeros((), g.dtype)
        return (None,
                unbroadcast(np.where(condition, g, zero), sa) if na else None,
                unbroadcast(np.where(condition, zero, g), sb) if nb else None)

    def backward_graph(self, g, out):
        condition, sa, sb = self.saved
        _, na, nb = self.needs_input_grad
        mask, zero = constant(condition), np.zeros((), g.data.dtype)
        return (None,
                unbroadcast_tensor(dispatch("where", mask, g, zero), sa) if na else None,
                unbroadcast_tensor(dispatch("where", mask, zero, g), sb) if nb else None)


class Clip(Op):
    """``clip(x, min=None, max=None)``; the gradient passes where min <= x <= max. A bound that
    is a Tensor is an operand of :class:`ClipBetween` instead, so it gets a gradient too."""

    __slots__ = ()
    saved_inputs = (0,)
    saves_output = False

    @classmethod
    def apply(cls, x, min=None, max=None):
        if isinstance(min, Tensor) or isinstance(max, Tensor):
            bounds = [bound for bound in (min, max) if bound is not None]
            return ClipBetween.apply(x, *bounds, has_min=min is not None,
                                     has_max=max is not None)
        return super().apply(x, min=min, max=max)

    def forward(self, x, min=None, max=None):
        self.saved = (x, min, max)
        try:
            return np.clip(x, min, max)
        except ValueError:
            refuse_unbroadcastable(self.name, x, *(np.asarray(b) for b in (min, max)
                                                   if b is not None))
            raise

    def backward(self, g):
        return (np.where(self._inside(), g, np.zeros((), g.dtype)),)

    def _inside(self) -> np.ndarray:
        x, lo, hi = self.saved
        inside = np.ones(x.shape, bool)
        if lo is not None:
            inside &= x >= lo
        if hi is not None:
            inside &= x <= hi
        return inside

    def backward_graph(self, g, out):
        return (dispatch("where", constant(self._inside()), g, np.zeros((), g.data.dtype)),)


class ClipBetween(Op):
    """``clip`` whose bounds are operands (Tensors), differentiated as PyTorch's ``clamp``: the
    gradient goes to ``x`` where min <= x <= max, to ``min`` where x < min < max, to ``max``
    where x > max or min > max (the output is max there, as NumPy's and PyTorch's). Where
    x < min == max, PyTorch gives neither bound the gradient; we split it between them, as
    maximum/minimum split a tie.

    Not registered: ``dispatch("clip", ...)`` (what interceptors see) applies it.
    """

    __slots__ = ("has_min", "has_max")
    name = "clip"
    saves_output = False

    def forward(self, x, *bounds, has_min=True, has_max=True):
        self.has_min, self.has_max = has_min, has_max
        self.saved = (x, *bounds)
        try:
            return np.clip(x, bounds[0] if has_min else None, bounds[-1] if has_max else None)
        except ValueError:
            refuse_unbroadcastable(self.name, x, *bounds)
            raise

    def _shares(self, dtype) -> list:
        """The share of the output gradient each operand gets, elementwise, in order."""
        x, *bounds = self.saved
        lo = bounds[0] if self.has_min else None
        hi = bounds[-1] if self.has_max else None
        inside = np.ones(np.broadcast_shapes(*(a.shape for a in self.saved)), bool)
        if lo is not None:
            inside &= lo <= x
        if hi is not None:
            inside &= x <= hi
        shares = [inside.astype(dtype)]
        tie = (x < lo) & (lo == hi) if lo is not None and hi is not None else False
        if lo is not None:
            below = (x < lo) & (lo < hi) if hi is not None else x < lo
            shares.append(below + 0.5 * tie)
        if hi is not None:
            above = (x > hi) | (lo > hi) if lo is not None else x > hi
            shares.append(above + 0.5 * tie)
        return [np.asarray(share, dtype) for share in shares]

    def backward(self, g):
        return tuple(unbroadcast(g * share, t.shape) if needed else None for share, t, needed
                     in zip(self._shares(g.dtype), self.saved, self.needs_input_grad))

    def backward_graph(self, g, out):
        return tuple(unbroadcast_tensor(g * constant(share), t.shape) if needed else None
                     for share, t, needed
                     in zip(self._shares(g.data.dtype), self.saved, self.needs_input_grad))


OPS = {"add": Add, "sub": Sub, "mul": Mul, "div": Div, "pow": Pow, "maximum": Maximum,
       "minimum": Minimum, "where": Where, "clip": Clip}
