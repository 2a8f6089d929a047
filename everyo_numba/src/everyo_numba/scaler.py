"""GradScaler's unscale-and-check over all gradients in ONE compiled call: each element is
multiplied and tested while in a register (the reference multiplies and then scans each block
for its minimum and maximum). The multiplication is the reference's (by the inverse in the
gradient's dtype), so the gradients get the same bits and the verdict is the same."""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import native, njit


@njit
def _unscale_all_finite(grads, inverse, scaled):
    # NOTE: the verdict is an OR of integers, never a short-circuit `and` (a branch per element)
    # nor a float sum (an order LLVM must keep): either kept the loop scalar, ~5x slower.
    found = np.uint32(0)
    for p in range(len(grads)):
        g = grads[p]
        factor = g.dtype.type(inverse)
        if scaled:
            for i in range(g.size):
                value = g[i] * factor
                g[i] = value
                found |= np.uint32(value - value != 0)  # inf - inf and NaN - NaN are NaN
        else:
            for i in range(g.size):
                found |= np.uint32(g[i] - g[i] != 0)
    return found == 0


def unscale_all_finite(grads, inverse):
    if type(inverse) is not float or not grads:
        return NotImplemented
    dtype = grads[0].dtype
    if dtype.name not in ("float32", "float64") or not native(grads[0]) or any(
            g.dtype != dtype or not g.flags.c_contiguous or not g.flags.writeable for g in grads):
        return NotImplemented  # (a read-only array is another Numba type: not one tuple)
    return bool(_unscale_all_finite(tuple(g.reshape(-1) for g in grads), inverse,
                                    inverse != 1.0))
