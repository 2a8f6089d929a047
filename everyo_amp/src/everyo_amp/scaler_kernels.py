"""GradScaler's kernel: unscale the gradients and check them for inf/NaN in one pass. The NumPy
reference below is what ``GradScaler.unscale_`` runs unless a kernel provider
(``everyo.kernels``) supplies a faster one."""

from __future__ import annotations

import numpy as np

from everyo.kernels import Kernel

#: Gradient elements unscaled and checked at a time: the block stays in cache between the two.
_BLOCK = 1 << 15


def unscale_all_finite(grads, inverse: float) -> bool:
    """Multiply every gradient by ``inverse`` in place; True when none holds an inf or NaN.

    NOTE: one pass over memory: each block is multiplied, then its min and max are taken while
    it is in cache. min and max propagate NaN and are inf iff an inf is present: no mask
    array, and no risk of a sum of large finite values overflowing.
    """
    finite = True
    scaled = inverse != 1.0  # (a scale of 1, e.g. a scaler kept under bfloat16: check only)
    with np.errstate(over="ignore", invalid="ignore"):
        for g in grads:
            # NOTE: the inverse is held in at least float32: rounded to float16 it would
            # reach zero at a scale of 2**25 and wipe out float16 gradients.
            factor = np.asarray(inverse, dtype=np.promote_types(g.dtype, np.float32))
            flat = g.reshape(-1) if g.flags.c_contiguous else None
            if flat is None:  # (a non-contiguous gradient: whole-array passes)
                if scaled:
                    g *= factor
                finite = finite and _block_finite(g)
                continue
            for start in range(0, flat.size, _BLOCK):
                block = flat[start:start + _BLOCK]
                if scaled:
                    np.multiply(block, factor, out=block)
                finite = finite and _block_finite(block)
    return finite


def _block_finite(block: np.ndarray) -> bool:
    return not block.size or bool(np.isfinite(block.min()) and np.isfinite(block.max()))


KERNELS = {
    "unscale_all_finite": Kernel(unscale_all_finite, """
        grads: a list of gradient arrays (any floating dtypes, any strides); inverse: a Python
        float (1 / scale). Multiplies every gradient in place by inverse held in
        promote_types(dtype, float32) (skipped when inverse == 1.0), every gradient even after
        an inf; returns True when no element of any gradient, after the multiplication, is inf
        or NaN. Overflow to inf counts as found."""),
}
