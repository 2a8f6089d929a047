"""Ops that move elements without changing them: reshape, transpose, indexing, concatenate,
stack and pad."""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.axes import check_axis
from everyo.dispatch import dispatch
from everyo.dtypes import result_dtype
from everyo.errors import EveryOError, EveryOIndexError
from everyo.ops.padding import pad_widths
from everyo.tensor import Tensor


class Reshape(Op):
    __slots__ = ("shape",)
    saved_inputs = ()
    saves_output = False

    def forward(self, x, shape):
        self.shape = x.shape
        try:
            return x.reshape(shape)
        except ValueError:
            raise EveryOError(f"reshape: cannot reshape {x.shape} ({x.size} elements) "
                              f"into {tuple(shape)}") from None

    def backward(self, g):
        return (g.reshape(self.shape),)

    def backward_graph(self, g, out):
        return (dispatch("reshape", g, shape=self.shape),)


class Transpose(Op):
    __slots__ = ("axes",)
    saved_inputs = ()
    saves_output = False

    def forward(self, x, axes=None):
        axes = tuple(range(x.ndim))[::-1] if axes is None else tuple(axes)
        # NOTE: stored non-negative: backward inverts the permutation with argsort.
        self.axes = tuple(check_axis(a, x.ndim, "transpose", x.shape) for a in axes)
        if sorted(self.axes) != list(range(x.ndim)):
            raise EveryOError(f"transpose: axes {axes} are not a permutation of "
                              f"{x.ndim} axes (shape {x.shape})")
        return x.transpose(self.axes)

    def backward(self, g):
        return (g.transpose(np.argsort(self.axes)),)

    def backward_graph(self, g, out):
        return (dispatch("transpose", g, axes=tuple(int(a) for a in np.argsort(self.axes))),)


def _plain_index(index):
    """Tensors inside an index become arrays; lists become integer/bool arrays."""
    if isinstance(index, Tensor):
        return index.data
    if isinstance(index, list):
        return np.asarray(index)
    if isinstance(index, tuple):
        return tuple(_plain_index(i) for i in index)
    return index


def _is_advanced(index) -> bool:
    parts = index if isinstance(index, tuple) else (index,)
    return any(isinstance(p, np.ndarray) and p.dtype != bool for p in parts)


class GetItem(Op):
    """Basic and integer-array indexing; the gradient is scattered back (added on repeats)."""

    __slots__ = ("shape", "index")
    saved_inputs = ()
    saves_output = False
    saved_attributes = ("index",)

    def forward(self, x, index):
        self.shape, self.index = x.shape, _plain_index(index)
        try:
            out = x[self.index]
        except IndexError as exc:
            raise EveryOIndexError(f"getitem: index {index!r} is invalid for shape {x.shape}: "
                                   f"{exc}") from None
        if not isinstance(out, np.ndarray):
            # NOTE: NumPy's x[1] is a scalar, a copy; x[1, ...] is the element as a 0-d view,
            # which t[1].fill_(v) writes into, as in PyTorch
            key = self.index if type(self.index) is tuple else (self.index,)
            out = x[key + (Ellipsis,)]
        return out

    def backward(self, g):
        return (_scatter(g, self.shape, self.index),)

    def backward_graph(self, g, out):
        return (ScatterGrad.apply(g, shape=self.shape, index=self.index),)


def _scatter(g: np.ndarray, shape: tuple, index) -> np.ndarray:
    grad = np.zeros(shape, g.dtype)
    if _is_advanced(index):
        np.add.at(grad, index, g)  # repeated indices must add up
    else:
        grad[index] = g
    return grad


class ScatterGrad(Op):
    """The gradient of ``getitem`` as an op (so that it can be differentiated again): ``g``
    placed at ``index`` in zeros of ``shape``. Its own gradient is ``getitem`` again."""

    __slots__ = ("index",)
    name = "getitem_backward"
    saved_inputs = ()
    saves_output = False
    saved_attributes = ("index",)

    def forward(self, g, shape, index):
        self.index = index
        return _scatter(g, shape, index)

    def backward(self, gg):
        return (gg[self.index],)

    def backward_graph(self, gg, out):
        return (dispatch("getitem", gg, index=self.index),)


class Concatenate(Op):
    __slots__ = ("axis", "splits")
    saved_inputs = ()
    saves_output = False

    def forward(self, *xs, axis=0):
        if not xs:
            raise EveryOError("concatenate: needs at least one tensor")
        self.axis = axis = check_axis(axis, xs[0].ndim, "concatenate", xs[0].shape)
        self.splits = np.cumsum([x.shape[axis] if x.ndim > axis else 0 for x in xs])[:-1]
        try:
            return np.concatenate(xs, axis=axis, dtype=result_dtype(*xs))
        except ValueError as exc:
            raise EveryOError(f"concatenate along axis {axis}: shapes "
                              f"{[x.shape for x in xs]} do not fit ({exc})") from None

    def backward(self, g):
        parts = np.split(g, self.splits, axis=self.axis)
        return tuple(p if n else None for p, n in zip(parts, self.needs_input_grad))

    def backward_graph(self, g, out):
        axis = self.axis % g.ndim
        bounds = [0, *self.splits, g.shape[axis]]
        lead = (slice(None),) * axis
        return tuple(dispatch("getitem", g, index=lead + (slice(int(lo), int(hi)),)) if n else None
                     for lo, hi, n in zip(bounds, bounds[1:], self.needs_input_grad))


class Stack(Op):
    __slots__ = ("axis",)
    saved_inputs = ()
    saves_output = False

    def forward(self, *xs, axis=0):
        if not xs:
            raise EveryOError("stack: needs at least one tensor")
        self.axis = axis = check_axis(axis, xs[0].ndim + 1, "stack", xs[0].shape)
        if len({x.shape for x in xs}) > 1:
            raise EveryOError(f"stack: every tensor must have the same shape, got "
                              f"{[x.shape for x in xs]}")
        return np.stack(xs, axis=axis, dtype=result_dtype(*xs))

    def backward(self, g):
        parts = np.moveaxis(g, self.axis, 0)
        return tuple(p if n else None for p, n in zip(parts, self.needs_input_grad))

    def backward_graph(self, g, out):
        lead = (slice(None),) * (self.axis % g.ndim)
        return tuple(dispatch("getitem", g, index=lead + (i,)) if n else None
                     for i, n in enumerate(self.needs_input_grad))


class Pad(Op):
    """Constant padding, ``pad_width`` as in ``np.pad``."""

    __slots__ = ("region",)
    saved_inputs = ()
    saves_output = False

    def forward(self, x, pad_width, value=0.0):
        widths = np.array(pad_widths(pad_width, x.ndim))
        if (widths < 0).any():
            raise EveryOError(f"pad: pad_width {pad_width!r} has a negative width; widths "
                              f"must be >= 0 (slice the tensor to remove elements)")
        self.region = tuple(slice(lo, lo + n) for (lo, _), n in zip(widths, x.shape))
        return np.pad(x, widths, constant_values=value)

    def backward(self, g):
        return (g[self.region],)

    def backward_graph(self, g, out):
        return (dispatch("getitem", g, index=self.region),)


OPS = {"reshape": Reshape, "transpose": Transpose, "getitem": GetItem,
       "concatenate": Concatenate, "stack": Stack, "pad": Pad}
