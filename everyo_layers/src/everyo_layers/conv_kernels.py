"""The convolution's kernels: the input gradient (a transposed convolution: products per kernel
position, added back into the input, col2im). The NumPy reference below is what ``Conv2DOp``
and the gradient ops run unless a kernel provider (``everyo.kernels``) supplies a faster one.
"""

from __future__ import annotations

import numpy as np

from everyo.kernels import Kernel, narrow, widen
from everyo_layers.precision import accumulation_dtype
from everyo_layers.windows import window_slices


def conv2d_input_grad(g2: np.ndarray, w2: np.ndarray, x_shape: tuple, w_shape: tuple,
                      stride: tuple, dilation: tuple, pads: tuple, out_hw: tuple) -> np.ndarray:
    """The input's gradient: one batched matmul gives, per kernel position, the gradient of the
    input elements that position touched; each is added back in place (col2im).

    NOTE: one (N*Ho*Wo, C) block per position keeps each block contiguous, so every add runs
    over long rows; the loop runs over the kh*kw kernel positions, never over pixels.
    """
    n, h, w, c = x_shape
    kh, kw, _, cout = w_shape
    (top, bottom), (left, right) = pads
    ho, wo = out_hw
    # (kh*kw, out, in), contiguous so that NumPy hands each product to BLAS
    # NOTE: float16 blocks are multiplied and summed in float32 and rounded once at the
    # end: one rounding instead of kh*kw, and no slow float16 additions.
    accumulate = accumulation_dtype(np.result_type(g2, w2))
    per_position = np.ascontiguousarray(
        w2.reshape(kh * kw, c, cout).transpose(0, 2, 1), dtype=accumulate)
    blocks = np.matmul(widen(g2).astype(accumulate, copy=False), per_position)
    blocks = blocks.reshape(kh, kw, n, ho, wo, c)
    gxp = np.zeros((n, h + top + bottom, w + left + right, c), dtype=accumulate)
    for i in range(kh):
        for j in range(kw):
            gxp[window_slices((i, j), stride, dilation, out_hw)] += blocks[i, j]
    out_dtype = np.result_type(g2, w2)
    return narrow(gxp[:, top:top + h, left:left + w, :], out_dtype)


KERNELS = {
    "conv2d_input_grad": Kernel(conv2d_input_grad, """
        g2: the output gradient as (N*Ho*Wo, out) rows; w2: the weight as (kh*kw*in, out),
        rows ordered (kernel row, kernel column, input channel); any floating dtypes, any
        strides. x_shape (N, H, W, in) NHWC, w_shape (kh, kw, in, out), stride/dilation int
        pairs, pads ((top, bottom), (left, right)), out_hw (Ho, Wo). Returns the input's
        gradient, shape x_shape, in result_type(g2, w2): products and their sums in at least
        float32 (float16/bfloat16 rounded once at the end), float64 stays float64. May return
        a view of a larger array. Overwrites nothing."""),
}
