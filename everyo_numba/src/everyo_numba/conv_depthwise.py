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

With stride 1 along the rows (and one output per channel), the forward loops run over whole
output rows (Wo*C contiguous elements per kernel position, against C per pixel: the short
loops' set-up cost more than their arithmetic: 1.4 against 2-2.9 ms on MobileNet's block,
measured), the weights tiled along the row. (The weight gradient's float64 sums per row
position outgrow L1 that way: measured no faster, left per pixel.)
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, native, njit


def _supported(*arrays) -> bool:
    dtype = arrays[0].dtype
    return dtype.name in COMPILED_DTYPES and native(*arrays) and all(a.dtype == dtype
                                                                     for a in arrays)


def _rows(xp, w, stride, out_hw):
    """``(xp as (N, Hp, Wp*C) rows, the weights tiled along an output row (kh, kw, Wo*C))``
    for the whole-row loops, or None where they do not apply (a column stride, or several
    outputs per input channel)."""
    n, hp, wp, c = xp.shape
    if stride[1] != 1 or w.shape[3] != c:
        return None
    rows = np.ascontiguousarray(xp).reshape(n, hp, wp * c)
    tiled = np.tile(np.ascontiguousarray(w).reshape(w.shape[0], w.shape[1], c), (1, 1, out_hw[1]))
    return rows, tiled


def depthwise_conv2d_forward(xp, w, stride, dilation, out_hw):
    if not _supported(xp, w):
        return NotImplemented
    out = np.empty((xp.shape[0], out_hw[0], out_hw[1], w.shape[3]), xp.dtype)
    whole_rows = _rows(xp, w, stride, out_hw)
    if whole_rows is None:
        _forward(xp, w, stride[0], stride[1], dilation[0], dilation[1], out)
    else:
        _forward_rows(*whole_rows, xp.shape[3], stride[0], dilation[0], dilation[1],
                      out.reshape(out.shape[0], out_hw[0], out_hw[1] * w.shape[3]))
    return out


@njit
def _forward_rows(xp, tiled, c, sh, dh, dw, out):
    # NOTE: stride 1 along a row: every kernel position is ONE multiply-add over the whole
    # output row (Wo*C contiguous elements) instead of one per pixel (C elements, too short a
    # loop to pay its set-up: ~3x slower, measured). Same products, same order: same bits.
    n, ho, width = out.shape
    kh, kw = tiled.shape[0], tiled.shape[1]
    zero = out.dtype.type(0.0)
    for b in range(n):
        for y in range(ho):
            row = out[b, y]
            row[:] = zero
            for i in range(kh):
                source = xp[b, y * sh + i * dh]
                for j in range(kw):
                    weights = tiled[i, j]
                    window = source[j * dw * c:j * dw * c + width]
                    for e in range(width):
                        row[e] += window[e] * weights[e]


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

