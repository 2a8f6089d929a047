"""Small Tensor-level helpers the ops' ``backward_graph`` methods share.

They are the differentiable twins of the array helpers the fast ``backward`` methods use
(:func:`everyo.autograd.unbroadcast`, ``np.broadcast_to``, ``np.expand_dims``).
"""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op, unbroadcast
from everyo.dispatch import dispatch
from everyo.tensor import Tensor


def unbroadcast_tensor(g, shape: tuple):
    """Sum Tensor ``g`` over the axes along which an operand of ``shape`` was broadcast."""
    if g.shape == shape:
        return g
    extra = g.ndim - len(shape)
    axes = tuple(range(extra)) + tuple(
        i + extra for i, n in enumerate(shape) if n == 1 and g.shape[i + extra] != 1)
    if axes:
        g = dispatch("sum", g, axis=axes, keepdims=True)
    return dispatch("reshape", g, shape=shape)


def expand_reduced(g, axes: tuple, keepdims: bool, shape: tuple):
    """Tensor ``g`` (a reduction's output gradient) broadcast back to the operand's ``shape``."""
    if not keepdims and axes:
        kept = list(shape)
        for a in axes:
            kept[a] = 1
        g = dispatch("reshape", g, shape=tuple(kept))
    return broadcast_tensor(g, shape)


def broadcast_tensor(t, shape: tuple):
    """Tensor ``t`` broadcast to ``shape`` (its gradient sums back)."""
    if t.shape == tuple(shape):
        return t
    return BroadcastTo.apply(t, shape=tuple(shape))


class BroadcastTo(Op):
    """``np.broadcast_to`` as an op (a read-only view, no copy); used inside gradient graphs."""

    __slots__ = ("source",)
    name = "broadcast_to"
    saved_inputs = ()
    saves_output = False

    def forward(self, x, shape):
        self.source = x.shape
        return np.broadcast_to(x, shape)

    def backward(self, g):
        return (unbroadcast(g, self.source),)

    def backward_graph(self, g, out):
        return (unbroadcast_tensor(g, self.source),)


def swap_last(t):
    """Tensor ``t`` with its last two axes swapped."""
    axes = list(range(t.ndim))
    axes[-1], axes[-2] = axes[-2], axes[-1]
    return dispatch("transpose", t, axes=tuple(axes))


def constant(array: np.ndarray):
    """A Tensor that does not require grad (a mask, a share)."""
    return Tensor._make(array, False, None)
