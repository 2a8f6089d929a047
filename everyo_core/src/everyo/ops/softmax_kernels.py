"""The softmax family's kernel: ``log_softmax`` over one axis of an array (the
``log_softmax`` op's forward and ``cross_entropy``'s). The NumPy reference below is what runs
unless a kernel provider (``everyo.kernels``) supplies a faster one.

NOTE: NumPy reduces a short last axis (a classifier's 10 classes) one row at a time, ~0.1 us
a row per reduction: the reference's two reductions cost more than the rest of a small
classifier's loss; a compiled loop does a row in one pass.
"""

from __future__ import annotations

import numpy as np

from everyo.kernel_definitions import Kernel


def log_softmax(x: np.ndarray, axis: int = -1) -> np.ndarray:
    """Numerically stable ``log(softmax(x))`` along ``axis``: ``x - max - log(sum(exp(x -
    max)))``, in ``x``'s dtype."""
    shifted = x - x.max(axis=axis, keepdims=True)
    return shifted - np.log(np.exp(shifted).sum(axis=axis, keepdims=True))


KERNELS = {
    "log_softmax": Kernel(log_softmax, """
        x: a float32 or float64 array (the ops widen 16-bit input first), any shape and
        strides, its axis non-empty unless x is empty; axis: an int in [-x.ndim, x.ndim).
        Returns a new array of x's shape and dtype: x - max - log(sum(exp(x - max))) along
        axis, summed in x's dtype (a NaN in a row makes the row NaN; a row of -inf, or one
        with +inf, is NaN, as 0/0). Overwrites nothing. Within a few ulps of the largest
        magnitude (exp, log and the order of the sum differ)."""),
}
