"""GradScaler's unscale-and-check over all gradients in ONE compiled call: each element is
multiplied and tested while in a register (the reference multiplies and then scans each block
for its minimum and maximum). The multiplication is the reference's (by the inverse in the
gradient's dtype), so the gradients get the same bits and the verdict is the same."""

from __future__ import annotations

from everyo_numba.jit import native, njit


@njit
def _unscale_all_finite(grads, inverse, scaled):
    finite = True
    for p in range(len(grads)):
        g = grads[p]
        factor = g.dtype.type(inverse)
        for i in range(g.size):
            value = g[i] * factor if scaled else g[i]
            g[i] = value
            finite = finite and (value - value == 0)  # inf - inf and NaN - NaN are NaN
    return finite


def unscale_all_finite(grads, inverse):
    if type(inverse) is not float or not grads:
        return NotImplemented
    dtype = grads[0].dtype
    if dtype.name not in ("float32", "float64") or not native(grads[0]) or any(
            g.dtype != dtype or not g.flags.c_contiguous for g in grads):
        return NotImplemented
    return bool(_unscale_all_finite(tuple(g.reshape(-1) for g in grads), inverse,
                                    inverse != 1.0))
