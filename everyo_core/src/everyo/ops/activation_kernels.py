"""The activations' kernels: ReLU's forward (output and gradient mask in one go) and the exact
gradient selection ``keep_where``. The NumPy references below are what the ops run unless a
kernel provider (``everyo.kernels``) supplies faster ones.

NOTE: NumPy's float16 arithmetic is ~30x slower than float32 (bfloat16's, from ml_dtypes, ~5x),
so the 16-bit paths work on the integer bits.
"""

from __future__ import annotations

import numpy as np

from everyo.dtypes import BFLOAT16, FLOAT16, is_floating
from everyo.kernel_definitions import Kernel

#: dtype -> (bits of +inf, bits of -inf as int16) of the 16-bit floats: -0.0, negatives and
#: -inf are all <= the second as int16; a negative NaN's bits lie between it and 0.
HALF_INF_BITS = {FLOAT16: (0x7C00, -1024), BFLOAT16: (0x7F80, -128)}

_SAME_SIZE_INT = {2: np.int16, 4: np.int32, 8: np.int64}


def keep_where(mask: np.ndarray, values: np.ndarray, out: np.ndarray | None = None) -> np.ndarray:
    """``values`` where ``mask`` holds, else +0.0, bit for bit: the gradient of a selection.

    NOTE: multiplying the floats' bits (an integer view) by the 0/1 mask is exact, and for
    float16, whose NumPy arithmetic is ~30x slower than float32, it is much faster than
    ``np.where`` or a float multiply.

    Example:
        >>> keep_where(np.array([True, False]), np.array([1.5, -2.0], np.float16))
        array([1.5, 0. ], dtype=float16)
    """
    ints = _SAME_SIZE_INT.get(values.dtype.itemsize) if is_floating(values.dtype) else None
    if ints is None:
        result = np.where(mask, values, values.dtype.type(0))
        if out is None:
            return result
        out[...] = result
        return out
    if out is None:
        return (values.view(ints) * mask).view(values.dtype)
    np.multiply(values.view(ints), mask, out=out.view(ints))
    return out


def relu_forward(x: np.ndarray) -> tuple:
    """``(max(x, 0), passes)``: ReLU and where its gradient passes (``not x <= 0``: NaN passes,
    PyTorch's rule)."""
    limits = HALF_INF_BITS.get(x.dtype)
    if limits is not None:
        # NOTE: on the int16 bits: -0.0, negatives and -inf become +0.0; NaNs of either sign
        # stay NaN, as in float32. Multiplying by the mask is also ~4x faster than an int16
        # maximum.
        _, neg_inf_bits = limits
        bits = x.view(np.int16)
        # NOTE: the gradient passes where not x <= 0: positives and +NaN have bits > 0, -NaN
        # bits lie in (-inf's bits, 0) as int16.
        passes = (bits > neg_inf_bits) & (bits != 0)
        return (bits * (bits > neg_inf_bits)).view(x.dtype), passes
    with np.errstate(invalid="ignore"):
        passes = ~(x <= 0)  # NaN passes the gradient, as in PyTorch
    return np.maximum(x, 0), passes


KERNELS = {
    "relu_forward": Kernel(relu_forward, """
        x: any numeric dtype (float16/bfloat16 included), any strides. Returns (out, passes):
        out = np.maximum(x, 0) in x's dtype (NaN stays NaN, -0.0 becomes +0.0), passes =
        ~(x <= 0) as bool (NaN passes). New arrays; overwrites nothing. Exact."""),
    "keep_where": Kernel(keep_where, """
        mask: bool, broadcastable to values; values: any dtype; out: None or an array of
        values' shape and dtype to write into. Returns values where mask holds, else +0.0, bit
        for bit (NaN payloads, -0.0 kept where selected). Exact."""),
}
