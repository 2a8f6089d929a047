"""The depthwise convolution in compiled loops: one pass over the output for the forward, one
over the output gradient for both gradients.

The reference runs kh*kw NumPy passes over the whole batch (a product into a temporary, then
an add), and its weight gradient an ``einsum`` per position over strided copies. Here each
output pixel's channels are one contiguous row, and every kernel position a multiply-add over
it (LLVM vectorises the channel loop).

- forward: the reference's products and additions in its order (positions row-major, from
  0), so the same bits;
- input gradient: the same products, summed per input element in another order (a few ulp);
- weight gradient: each product exact in float64 and summed in float64, rounded once (the
  reference sums in the input's dtype).
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, native, njit


def _supported(*arrays) -> bool:
    dtype = arrays[0].dtype
    return dtype.name in COMPILED_DTYPES and native(*arrays) and all(a.dtype == dtype
                                                                     for a in arrays)


def depthwise_conv2d_forward(xp, w, stride, dilation, out_hw):
    if not _supported(xp, w):
        return NotImplemented
    out = np.empty((xp.shape[0], out_hw[0], out_hw[1], w.shape[3]), xp.dtype)
    _forward(xp, w, stride[0], stride[1], dilation[0], dilation[1], out)
    return out


@njit
def _forward(xp, w, sh, sw, dh, dw, out):
    n, ho, wo, cout = out.shape
    kh, kw = w.shape[0], w.shape[1]
    mult = cout // xp.shape[3]
    zero = out.dtype.type(0.0)
    for b in range(n):
        for y in range(ho):
            for xo in range(wo):
                row = out[b, y, xo]
                row[:] = zero
                for i in range(kh):
                    for j in range(kw):
                        pixel = xp[b, y * sh + i * dh, xo * sw + j * dw]
                        weights = w[i, j, 0]
                        if mult == 1:  # (depthwise proper: a loop LLVM vectorises)
                            for c in range(cout):
                                row[c] += pixel[c] * weights[c]
                        else:
                            for c in range(cout):
                                row[c] += pixel[c // mult] * weights[c]


def depthwise_conv2d_backward(g, xp, w, stride, dilation, out_hw, needs_x, needs_w):
    if not _supported(g, xp, w):
        return NotImplemented
    gx = np.zeros(xp.shape, xp.dtype) if needs_x else None
    gw = None
    if needs_w:
        gw64 = np.zeros(w.shape, np.float64)
        _weight_grad(g, xp, stride[0], stride[1], dilation[0], dilation[1], gw64)
        gw = gw64.astype(xp.dtype, copy=False)
    if needs_x:
        _input_grad(g, w, stride[0], stride[1], dilation[0], dilation[1], gx)
    return gx, gw


@njit
def _input_grad(g, w, sh, sw, dh, dw, gx):
    n, ho, wo, cout = g.shape
    kh, kw = w.shape[0], w.shape[1]
    mult = cout // gx.shape[3]
    for b in range(n):
        for y in range(ho):
            for xo in range(wo):
                grow = g[b, y, xo]
                for i in range(kh):
                    for j in range(kw):
                        target = gx[b, y * sh + i * dh, xo * sw + j * dw]
                        weights = w[i, j, 0]
                        if mult == 1:
                            for c in range(cout):
                                target[c] += grow[c] * weights[c]
                        else:
                            for c in range(cout):
                                target[c // mult] += grow[c] * weights[c]


@njit
def _weight_grad(g, xp, sh, sw, dh, dw, gw64):
    n, ho, wo, cout = g.shape
    kh, kw = gw64.shape[0], gw64.shape[1]
    mult = cout // xp.shape[3]
    for b in range(n):
        for y in range(ho):
            for xo in range(wo):
                grow = g[b, y, xo]
                for i in range(kh):
                    for j in range(kw):
                        pixel = xp[b, y * sh + i * dh, xo * sw + j * dw]
                        acc = gw64[i, j, 0]
                        if mult == 1:
                            for c in range(cout):
                                acc[c] += np.float64(pixel[c]) * np.float64(grow[c])
                        else:
                            for c in range(cout):
                                acc[c] += np.float64(pixel[c // mult]) * np.float64(grow[c])
