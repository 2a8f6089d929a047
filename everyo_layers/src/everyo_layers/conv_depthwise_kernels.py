"""The depthwise convolution's kernels (``Conv2D(groups=in_channels)``, MobileNet's 3x3):
forward, and the input and weight gradients. The NumPy references below are what
``GroupedConv2DOp`` runs unless a kernel provider (``everyo.kernels``) supplies faster ones.

Both are loop-free over pixels: per kernel position, one multiply-add of that position's
window view of the whole batch with the position's weights (no window matrix at all).
"""

from __future__ import annotations

import numpy as np

from everyo.kernels import Kernel
from everyo_layers.windows import window_slices


def _positions(w: np.ndarray) -> list:
    return [(i, j) for i in range(w.shape[0]) for j in range(w.shape[1])]


def depthwise_conv2d_forward(xp: np.ndarray, w: np.ndarray, stride: tuple, dilation: tuple,
                             out_hw: tuple) -> np.ndarray:
    """``out[n, y, x, c*m + k] = sum_ij xp[n, y*s + i*d, x*s + j*d, c] * w[i, j, 0, c*m + k]``
    (``m`` outputs per input channel), the positions summed in row-major order from 0."""
    n, groups = xp.shape[0], xp.shape[3]
    ho, wo = out_hw
    mult = w.shape[3] // groups
    out = np.zeros((n, ho, wo, groups, mult), xp.dtype)
    tmp = np.empty_like(out)
    for i, j in _positions(w):
        view = xp[window_slices((i, j), stride, dilation, out_hw)]
        np.multiply(view[..., None], w[i, j, 0].reshape(groups, mult), out=tmp)
        out += tmp
    return out.reshape(n, ho, wo, groups * mult)


def depthwise_conv2d_backward(g: np.ndarray, xp: np.ndarray, w: np.ndarray, stride: tuple,
                              dilation: tuple, out_hw: tuple, needs_x: bool,
                              needs_w: bool) -> tuple:
    """``(gx, gw)``: the padded input's gradient (``xp``'s shape) and the weight's (``w``'s
    shape), each None when not needed."""
    n, ho, wo, cout = g.shape
    groups = xp.shape[3]
    mult = cout // groups
    g5 = g.reshape(n, ho, wo, groups, mult)
    gx = np.zeros(xp.shape, xp.dtype) if needs_x else None
    gw = np.zeros(w.shape, xp.dtype) if needs_w else None
    for i, j in _positions(w):
        where = window_slices((i, j), stride, dilation, out_hw)
        if gx is not None:
            gx[where] += (g5 * w[i, j, 0].reshape(groups, mult)).sum(axis=-1)
        if gw is not None:
            view = xp[where].reshape(-1, groups)
            gw[i, j, 0] = np.einsum("mg,mgk->gk", view,
                                    g5.reshape(-1, groups, mult)).reshape(cout)
    return gx, gw


KERNELS = {
    "depthwise_conv2d_forward": Kernel(depthwise_conv2d_forward, """
        xp (N, Hp, Wp, C) the padded NHWC input; w (kh, kw, 1, C*m) the weight (m outputs
        per input channel); both float32 or both float64 (16-bit operands are widened by the
        op), any strides. stride, dilation int pairs, out_hw (Ho, Wo) with every window inside
        xp. Returns a new (N, Ho, Wo, C*m) array in xp's dtype: each output the sum of its
        kh*kw products in that dtype, positions in row-major order starting from 0 (the
        reference's bits). Overwrites nothing."""),
    "depthwise_conv2d_backward": Kernel(depthwise_conv2d_backward, """
        g (N, Ho, Wo, C*m) the output gradient; xp, w, stride, dilation, out_hw as the
        forward; all float32 or all float64, any strides; needs_x, needs_w bools. Returns
        (gx, gw): gx new, xp's shape (the padded input's gradient: the caller crops it),
        gw new, w's shape, both in xp's dtype, None where not needed. The weight gradient
        sums N*Ho*Wo products per element: in xp's dtype or wider, in any order. Overwrites
        nothing."""),
}
