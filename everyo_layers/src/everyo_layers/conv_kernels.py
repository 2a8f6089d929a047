"""The convolution's kernels: the window matrix (im2col), the input gradient (a transposed
convolution: products per kernel position, added back into the input, col2im), and the two data
movements around the transposed convolution's one matmul (its phases interleaved into the
output, and the output gradient regrouped by phase). The NumPy references below are what
``Conv2DOp``, ``Conv2DTransposeOp`` and the gradient ops run unless a kernel provider
(``everyo.kernels``) supplies a faster one.
"""

from __future__ import annotations

import numpy as np

from everyo.kernels import HALF_DTYPES, Kernel, narrow, widen
from everyo_layers.precision import accumulation_dtype
from everyo_layers.windows import pad_hw, window_slices, window_view


def conv2d_columns(x: np.ndarray, kernel: tuple, stride: tuple, dilation: tuple, pads: tuple,
                   out_hw: tuple) -> np.ndarray:
    """The ``(N*Ho*Wo, kh*kw*C)`` window matrix of NHWC ``x`` padded with zeros by ``pads``:
    row ``(b, y, x)`` holds the window at output pixel ``(y, x)``, ordered (kernel row, kernel
    column, channel). One gathering copy of the strided window view (a view of ``x`` itself
    when the windows are its pixels: a 1x1 kernel, stride 1, no padding)."""
    views = window_view(pad_hw(x, pads), kernel, stride, dilation, out_hw)
    return views.reshape(-1, kernel[0] * kernel[1] * x.shape[3])


def conv_bias_grad(g2: np.ndarray) -> np.ndarray:
    """A convolution bias's gradient: the column sums of the output gradient's ``(rows,
    channels)`` matrix; 16-bit rows summed in float32 and rounded once."""
    if g2.dtype in HALF_DTYPES:
        return narrow(widen(g2).sum(axis=0), g2.dtype)
    return g2.sum(axis=0)


def _phase_extent(q: tuple, stride: tuple, crop: tuple, out_hw: tuple) -> tuple:
    """The (height, width) of the transposed convolution's full scatter: the phases' span, or
    as far as the crop and output reach (trailing rows no phase reaches are zeros)."""
    return (max(q[0] * stride[0], crop[0] + out_hw[0]), max(q[1] * stride[1], crop[1] + out_hw[1]))


def conv2d_transpose_interleave(phases: np.ndarray, stride: tuple, crop: tuple, out_hw: tuple,
                                bias) -> np.ndarray:
    """The transposed convolution's output from its phases: ``phases[b, qy, qx, (py, px, c)]``
    is output pixel ``(qy*sh + py - top, qx*sw + px - left)`` of the full scatter, cropped by
    ``crop = (top, left)`` to ``out_hw``, plus ``bias`` (in the phases' dtype) where given.
    Pixels no phase reaches are zero (plus the bias)."""
    n, qh, qw, width = phases.shape
    (sh, sw), (top, left), (ho, wo) = stride, crop, out_hw
    cout = width // (sh * sw)
    full = np.zeros((n,) + _phase_extent((qh, qw), stride, crop, out_hw) + (cout,), phases.dtype)
    full[:, :qh * sh, :qw * sw].reshape(n, qh, sh, qw, sw, cout)[...] = \
        phases.reshape(n, qh, qw, sh, sw, cout).transpose(0, 1, 3, 2, 4, 5)
    out = full[:, top:top + ho, left:left + wo, :]
    return out + bias if bias is not None else np.ascontiguousarray(out)


def conv2d_transpose_phase_rows(g: np.ndarray, stride: tuple, crop: tuple, q: tuple,
                                dtype) -> np.ndarray:
    """The inverse movement of :func:`conv2d_transpose_interleave`: the output gradient ``g``
    (N, Ho, Wo, C) as ``(N*qh*qw, sh*sw*C)`` rows in ``dtype``, zeros where the full scatter
    reaches past the crop."""
    n, ho, wo, cout = g.shape
    (sh, sw), (top, left) = stride, crop
    gfull = np.zeros((n,) + _phase_extent(q, stride, crop, (ho, wo)) + (cout,), dtype)
    gfull[:, top:top + ho, left:left + wo, :] = g
    phases = gfull[:, :q[0] * sh, :q[1] * sw].reshape(n, q[0], sh, q[1], sw, cout)
    return np.ascontiguousarray(phases.transpose(0, 1, 3, 2, 4, 5)).reshape(-1, sh * sw * cout)


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
    "conv_bias_grad": Kernel(conv_bias_grad, """
        g2: (rows, channels), any floating dtype, any strides. Returns the (channels,) column
        sums in g2's dtype (float16/bfloat16 summed in float32, rounded once): the reference's
        bits (NumPy adds a C-contiguous matrix's rows one after the other, as a loop can).
        Overwrites nothing."""),
    "conv2d_columns": Kernel(conv2d_columns, """
        x: NHWC, any floating dtype, any strides; kernel, stride, dilation: positive int
        pairs; pads ((top, bottom), (left, right)); out_hw (Ho, Wo), the windows that fit.
        Returns the (N*Ho*Wo, kh*kw*C) window matrix in x's dtype, zeros where a window meets
        the padding: the reference's bits (a copy). May be a view of x (read-only: never
        write into it). Overwrites nothing."""),
    "conv2d_transpose_interleave": Kernel(conv2d_transpose_interleave, """
        phases: (N, qh, qw, sh*sw*C) float32 or float64, any strides; bias: (C,) of a dtype
        that widens exactly to the phases' dtype, or None. Returns a new C-contiguous (N, Ho,
        Wo, C) array in the phases' dtype: the reference's bits (each element one phase value
        or zero, plus the bias in one addition). Overwrites nothing."""),
    "conv2d_transpose_phase_rows": Kernel(conv2d_transpose_phase_rows, """
        g: (N, Ho, Wo, C), any floating dtype that converts exactly to dtype (float32 or
        float64), any strides. Returns a new C-contiguous (N*qh*qw, sh*sw*C) array in dtype:
        the reference's bits. Overwrites nothing."""),
    "conv2d_input_grad": Kernel(conv2d_input_grad, """
        g2: the output gradient as (N*Ho*Wo, out) rows; w2: the weight as (kh*kw*in, out),
        rows ordered (kernel row, kernel column, input channel); any floating dtypes, any
        strides. x_shape (N, H, W, in) NHWC, w_shape (kh, kw, in, out), stride/dilation int
        pairs, pads ((top, bottom), (left, right)), out_hw (Ho, Wo). Returns the input's
        gradient, shape x_shape, in result_type(g2, w2): products and their sums in at least
        float32 (float16/bfloat16 rounded once at the end), float64 stays float64. May return
        a view of a larger array. Overwrites nothing."""),
}
