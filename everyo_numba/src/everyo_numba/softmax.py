"""``log_softmax`` along the last axis of a float32/float64 array: each row in one
compiled pass (its maximum, then the sum of the exponentials, in the row's dtype as the
reference sums), where NumPy's reference makes two reductions that visit a short row one at a
time (~0.1 us a row each). Other axes are left to the reference.

Not the reference's bits: Numba's ``exp``/``log`` are the C library's, NumPy's its own SIMD
ones, and the sum runs in row order where NumPy's is pairwise; within a few ulps.
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, njit

_COMPILED = frozenset(np.dtype(name) for name in COMPILED_DTYPES)


@njit
def _log_softmax_rows(x, out):
    rows, width = x.shape
    for r in range(rows):
        top = x[r, 0]
        for j in range(1, width):  # np.max: a NaN wins
            v = x[r, j]
            if v > top or v != v:
                top = v
        total = x.dtype.type(0.0)
        for j in range(width):
            shifted = x[r, j] - top
            out[r, j] = shifted
            total += np.exp(shifted)
        offset = np.log(total)
        for j in range(width):
            out[r, j] = out[r, j] - offset


def log_softmax(x, axis=-1):
    if x.dtype not in _COMPILED or not x.dtype.isnative or not x.ndim or \
            axis not in (-1, x.ndim - 1) or not x.size:
        return NotImplemented
    # NOTE: any other layout copied, not left to the reference: its bits then do not depend
    # on the layout (a transposed batch of logits gets the contiguous one's loss)
    x = np.ascontiguousarray(x)
    width = x.shape[-1]
    out = np.empty(x.shape, x.dtype)
    _log_softmax_rows(x.reshape(-1, width), out.reshape(-1, width))
    return out
