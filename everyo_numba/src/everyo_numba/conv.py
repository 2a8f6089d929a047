"""The convolution's input gradient as ONE GEMM and a one-pass col2im; the window matrix
(im2col) and the transposed convolution's two data movements as one-pass gathers.

The reference multiplies per kernel position (a batched product of kh*kw small GEMMs) and adds
each block into the padded gradient with a strided NumPy add, kh*kw passes over it. Here one
GEMM ``g2 @ w2.T`` gives every window's column gradient (the same products, one BLAS call that
runs ~1.5x faster than the batched one) and a compiled loop adds them into the input in one
pass. Same products, other summation order: within a few ulp of the reference.
"""

from __future__ import annotations

import numpy as np

from everyo.kernels import narrow, widen
from everyo_numba.jit import COMPILED_DTYPES, native, njit


def conv2d_input_grad(g2, w2, x_shape, w_shape, stride, dilation, pads, out_hw):
    n, h, w, c = x_shape
    compute = np.promote_types(np.result_type(g2, w2), np.float32)
    if compute.name not in ("float32", "float64"):
        return NotImplemented
    columns = np.matmul(widen(g2).astype(compute, copy=False),
                        widen(w2).astype(compute, copy=False).T)  # (N*Ho*Wo, kh*kw*in)
    kh, kw = w_shape[:2]
    if (kh, kw) == (1, 1) and tuple(stride) == (1, 1) and not any(pads[0] + pads[1]) \
            and tuple(out_hw) == (h, w):  # (a pointwise convolution: the columns ARE the gradient)
        return narrow(columns.reshape(x_shape), np.result_type(g2, w2))
    grad = np.zeros(x_shape, compute)
    _scatter(columns, n, out_hw[0], out_hw[1], kh, kw, stride[0], stride[1], dilation[0],
             dilation[1], pads[0][0], pads[1][0], grad)
    return narrow(grad, np.result_type(g2, w2))


@njit
def _scatter(columns, n, ho, wo, kh, kw, sh, sw, dh, dw, top, left, grad):
    """``grad[b, y*s + i*d - pad, ...] += columns[window, (i, j, channel)]``, in bounds only."""
    _, h, w, c = grad.shape
    for b in range(n):
        for y in range(ho):
            for xo in range(wo):
                row = (b * ho + y) * wo + xo
                for i in range(kh):
                    yy = y * sh + i * dh - top
                    if yy < 0 or yy >= h:
                        continue
                    for j in range(kw):
                        xx = xo * sw + j * dw - left
                        if xx < 0 or xx >= w:
                            continue
                        base = (i * kw + j) * c
                        for ch in range(c):
                            grad[b, yy, xx, ch] += columns[row, base + ch]


# -- the window matrix (im2col) --------------------------------------------------------------

#: Fewer channels than this: the reference's strided NumPy copy is faster (measured: 3 and 1
#: channels ~1.6x slower here, 16 and more ~1.3-2x faster) — the loop's rows are too short.
_MIN_CHANNELS = 8


def conv2d_columns(x, kernel, stride, dilation, pads, out_hw):
    """The window matrix gathered straight from ``x`` (zeros for the padding): one pass, no
    padded copy of the input; the reference's bits (a copy is exact)."""
    n, _, _, c = x.shape
    kh, kw = kernel
    if (x.dtype.name not in COMPILED_DTYPES or not native(x) or kh * kw == 1
            or c < _MIN_CHANNELS):
        return NotImplemented  # (a 1x1 kernel: the reference's reshape is often free)
    columns = np.empty((n * out_hw[0] * out_hw[1], kh * kw * c), x.dtype)
    _gather(x, kh, kw, stride[0], stride[1], dilation[0], dilation[1], pads[0][0], pads[1][0],
            out_hw[0], out_hw[1], columns)
    return columns


@njit
def _gather(x, kh, kw, sh, sw, dh, dw, top, left, ho, wo, columns):
    """``columns[window, (i, j, channel)] = x[b, y*s + i*d - pad, ...]``, zero outside."""
    n, h, w, c = x.shape
    zero = columns.dtype.type(0.0)
    for b in range(n):
        for y in range(ho):
            for xo in range(wo):
                row = columns[(b * ho + y) * wo + xo]
                for i in range(kh):
                    yy = y * sh + i * dh - top
                    inside = 0 <= yy < h
                    for j in range(kw):
                        xx = xo * sw + j * dw - left
                        base = (i * kw + j) * c
                        if inside and 0 <= xx < w:
                            source = x[b, yy, xx]
                            for ch in range(c):
                                row[base + ch] = source[ch]
                        else:
                            for ch in range(c):
                                row[base + ch] = zero


# -- the transposed convolution's data movements ---------------------------------------------

def conv2d_transpose_interleave(phases, stride, crop, out_hw, bias):
    """Each output pixel read from its phase (or zero) plus the bias, in one pass: no zeroed
    full scatter, no cropped copy, no separate bias pass; the reference's bits."""
    if phases.dtype.name not in COMPILED_DTYPES or not native(phases):
        return NotImplemented
    n, _, _, width = phases.shape
    cout = width // (stride[0] * stride[1])
    if bias is None:
        bias_row, with_bias = np.zeros(cout, phases.dtype), False
    else:
        bias_row = widen(bias) if bias.dtype.kind in "fV" and native(bias) else None
        if bias_row is None or np.result_type(phases, bias_row) != phases.dtype:
            return NotImplemented  # (a wider bias: the reference's sum is wider too)
        bias_row, with_bias = bias_row.astype(phases.dtype, copy=False), True
    out = np.empty((n, out_hw[0], out_hw[1], cout), phases.dtype)
    _interleave(phases, stride[0], stride[1], crop[0], crop[1], bias_row, with_bias, out)
    return out


@njit
def _interleave(phases, sh, sw, top, left, bias, with_bias, out):
    # NOTE: the inner loops run over slices (one per pixel): indexing the 4-D arrays there
    # instead kept them scalar, ~2x slower (measured).
    n, ho, wo, c = out.shape
    _, qh, qw, _ = phases.shape
    for b in range(n):
        for y in range(ho):
            qy = (y + top) // sh
            py = y + top - qy * sh
            for xo in range(wo):
                qx = (xo + left) // sw
                px = xo + left - qx * sw
                target = out[b, y, xo]
                if qy < qh and qx < qw:
                    base = (py * sw + px) * c
                    source = phases[b, qy, qx, base:base + c]
                    if with_bias:
                        for ch in range(c):
                            target[ch] = source[ch] + bias[ch]
                    else:
                        for ch in range(c):
                            target[ch] = source[ch]
                elif with_bias:
                    for ch in range(c):
                        target[ch] = 0.0 + bias[ch]
                else:
                    target[:] = 0.0


def conv2d_transpose_phase_rows(g, stride, crop, q, dtype):
    """Every phase row read from the output gradient (or zero) in one pass: no zeroed full
    gradient, no transposing copy; the reference's bits (a conversion to a wider float is
    exact)."""
    dtype = np.dtype(dtype)
    if dtype.name not in COMPILED_DTYPES or g.dtype.kind not in "fV" or not native(g):
        return NotImplemented
    n, _, _, cout = g.shape
    source = widen(g).astype(dtype, copy=False)
    rows = np.empty((n, q[0], q[1], stride[0] * stride[1] * cout), dtype)
    _phase_rows(source, stride[0], stride[1], crop[0], crop[1], rows)
    return rows.reshape(-1, rows.shape[3])


@njit
def _phase_rows(g, sh, sw, top, left, rows):
    n, ho, wo, c = g.shape
    _, qh, qw, _ = rows.shape
    for b in range(n):
        for qy in range(qh):
            for qx in range(qw):
                target = rows[b, qy, qx]
                for py in range(sh):
                    y = qy * sh + py - top
                    for px in range(sw):
                        xo = qx * sw + px - left
                        part = target[(py * sw + px) * c:(py * sw + px + 1) * c]
                        if 0 <= y < ho and 0 <= xo < wo:
                            source = g[b, y, xo]
                            for ch in range(c):
                                part[ch] = source[ch]
                        else:
                            part[:] = 0.0


# -- the bias's gradient ---------------------------------------------------------------------

def conv_bias_grad(g2):
    """Column sums, rows added one after the other to zeros (NumPy's order for a C-contiguous
    matrix, so the reference's bits), ~4x faster than NumPy's axis-0 reduction,
    which walks the few channels of every row as a separate short loop."""
    if g2.ndim != 2 or g2.dtype.kind not in "fV" or not native(g2):
        return NotImplemented
    source = widen(g2)
    if (source.dtype.name not in COMPILED_DTYPES or not source.flags.c_contiguous
            or g2.shape[1] < 2):  # (one channel: NumPy sums the column pairwise)
        return NotImplemented
    sums = np.zeros(g2.shape[1], source.dtype)
    _column_sums(source, sums)
    return narrow(sums, g2.dtype)


@njit
def _column_sums(g, sums):
    """``sums`` (zeros) += every row in turn. (NumPy's reduction starts from its identity 0.0
    too, as a -0.0 alone shows: summed it comes out +0.0.)"""
    rows, c = g.shape
    for i in range(rows):
        row = g[i]
        for j in range(c):
            sums[j] += row[j]
