"""The transposed convolution's forward and weight gradient without phases: per group of
images one GEMM into every input pixel's ``kh*kw`` output contributions, added into the output
by a compiled loop while they are still in cache (forward); the output gradient's windows
gathered per group and multiplied by the input (weight gradient) or by the weight (input
gradient: no col2im, each input pixel's gradient is one row of that product).

NOTE: the reference's phases share one window matrix over ``(H + A - 1) * (W + A - 1)``
positions (13% more products than pixels for conv_transpose's 16x16 input) and a K of
``A*A*in``; here the products are exactly one per input pixel and tap (K = in), in blocks of
``M * in * kh*kw*out <= 100**3`` (OpenBLAS's SkylakeX small-matrix kernels, which skip packing:
conv_rows.py's NOTE), one group of images at a time so that the contributions (``rows x
kh*kw*out``) are added while in L2. Measured, #25's conv_transpose (16, 16, 16, 64) -> 32
channels, 4x4 stride 2, 1 thread, CPU time: forward 4.3 -> 3.5 ms, weight gradient 3.9 ->
3.0 ms, input gradient 5.2 -> 3.2 ms (the contributions' add is ~0.7 ms of the forward: a
scalar loop; 2-D indexing or array expressions instead of per-pixel slices ran 2.7x slower).
Same products, other summation order: within a few ulp of the reference.
"""

from __future__ import annotations

import functools

import numpy as np

from everyo.kernels import widen
from everyo_numba.conv import _gather
from everyo_numba.jit import COMPILED_DTYPES, native, njit

#: OpenBLAS's SkylakeX small-matrix kernels take a product of ``M*N*K <= 100**3``.
_SMALL_PRODUCT = 100 ** 3
#: Fewer rows a block than this: one plain GEMM per group instead.
_MIN_BLOCK_ROWS = 8
#: Bytes of the per-group contributions (or gathered gradient windows): L2-sized.
_GROUP_BYTES = 512 << 10


def _group_images(image_rows: int, width: int, itemsize: int) -> int:
    return max(_GROUP_BYTES // (image_rows * width * itemsize), 1)


@functools.lru_cache(maxsize=256)
def _block_rows(rows: int, inner: int, cols: int) -> int:
    """Rows per block of a ``(rows, inner) @ (inner, cols)`` product for the small-matrix
    kernels (a divisor of ``rows`` when one comes within half of the largest), or ``rows``
    (one plain product) when the blocks would get shorter than ``_MIN_BLOCK_ROWS``."""
    m = _SMALL_PRODUCT // max(inner * cols, 1)
    if m < _MIN_BLOCK_ROWS or m >= rows:
        return rows
    divisor = max(d for d in range(1, m + 1) if rows % d == 0)
    return divisor if 2 * divisor >= m else m


def _product(a: np.ndarray, b: np.ndarray, out: np.ndarray) -> None:
    """``out = a @ b`` in blocks of rows small enough for the small-matrix kernels (a C-order
    ``a`` and ``out``; the blocks run in one batched ``np.matmul``, plus one for the rest)."""
    rows, k = a.shape
    m = _block_rows(rows, k, b.shape[1])
    whole = rows // m * m
    np.matmul(a[:whole].reshape(-1, m, k), b, out=out[:whole].reshape(-1, m, b.shape[1]))
    if whole < rows:
        np.matmul(a[whole:], b, out=out[whole:])


def conv2d_transpose_forward(x, weight, bias, stride, crop, out_hw, kept):
    dtype = x.dtype
    if (dtype.name not in COMPILED_DTYPES or weight.dtype != dtype or not native(x, weight)
            or x.shape[0] == 0):
        return NotImplemented
    kh, kw, cout, cin = weight.shape
    if bias is None:
        bias_row, with_bias = np.zeros(cout, dtype), False
    else:
        bias_row = widen(bias) if bias.dtype.kind in "fV" and native(bias) else None
        if bias_row is None or np.result_type(dtype, bias_row) != dtype:
            return NotImplemented  # (a wider bias: the reference's sum is wider too)
        bias_row, with_bias = bias_row.astype(dtype, copy=False), True
    n, h, w, _ = x.shape
    width = kh * kw * cout
    taps = np.ascontiguousarray(weight.transpose(3, 0, 1, 2)).reshape(cin, width)
    rows = np.ascontiguousarray(x).reshape(n * h * w, cin)
    out = np.empty((n, out_hw[0], out_hw[1], cout), dtype)
    group = _group_images(h * w, width, dtype.itemsize)
    contributions = np.empty((min(group, n) * h * w, width), dtype)
    for start in range(0, n, group):
        stop = min(start + group, n)
        part = contributions[:(stop - start) * h * w]
        _product(rows[start * h * w:stop * h * w], taps, part)
        _add_contributions(part, h, w, kh, kw, stride[0], stride[1], crop[0], crop[1],
                           bias_row, with_bias, out[start:stop])
    return out


@njit
def _add_contributions(part, h, w, kh, kw, sh, sw, top, left, bias, with_bias, out):
    """``out[b, y, x] = sum of part[(b, i, j), (ki, kj, :)]`` over the taps with ``i*sh + ki
    = y + top`` and ``j*sw + kj = x + left`` (ki, then kj, ascending), plus the bias."""
    # NOTE: one output row at a time, kernel row by kernel row (its source rows are then one
    # input row): 10% faster than gathering each pixel's taps in turn (measured).
    n, ho, wo, c = out.shape
    for b in range(n):
        for y in range(ho):
            yy = y + top
            target = out[b, y]
            target[:, :] = 0.0
            for ki in range(yy % sh, kh, sh):
                i = (yy - ki) // sh
                if i >= h:
                    continue
                if i < 0:
                    break
                source = part[(b * h + i) * w:(b * h + i + 1) * w]
                for xo in range(wo):
                    xx = xo + left
                    pixel = target[xo]
                    for kj in range(xx % sw, kw, sw):
                        j = (xx - kj) // sw
                        if j >= w:
                            continue
                        if j < 0:
                            break
                        tap = source[j, (ki * kw + kj) * c:(ki * kw + kj + 1) * c]
                        for ch in range(c):
                            pixel[ch] += tap[ch]
            if with_bias:
                for xo in range(wo):
                    pixel = target[xo]
                    for ch in range(c):
                        pixel[ch] += bias[ch]


def _exactly_in(g, dtype):
    """``g`` converted to ``dtype`` (a copy only where it differs), or None where that is not
    exact (a wider gradient) or g is not a native float array."""
    if g.dtype.kind not in "fV" or not native(g):
        return None
    g = widen(g)  # (16-bit: float32, exactly)
    return g.astype(dtype, copy=False) if np.promote_types(g.dtype, dtype) == dtype else None


def conv2d_transpose_weight_grad(x, g, kept, w_shape, stride, crop):
    dtype = x.dtype
    if dtype.name not in COMPILED_DTYPES or not native(x) or x.shape[0] == 0:
        return NotImplemented
    g = _exactly_in(g, dtype)
    if g is None:
        return NotImplemented
    kh, kw, cout, cin = w_shape
    n, h, w, _ = x.shape
    width = kh * kw * cout
    rows = np.ascontiguousarray(x).reshape(n * h * w, cin)
    group = _group_images(h * w, width, dtype.itemsize)
    windows = np.empty((min(group, n) * h * w, width), dtype)
    # NOTE: the transposed gradient (kh*kw*out, in) = windows.T @ rows: its rows are the
    # weight's own order (no transposing copy at the end), and its blocks of rows are small
    # products (~10% faster than rows.T @ windows, measured).
    grad = np.zeros((width, cin), dtype)
    part = np.empty((width, cin), dtype)
    for start in range(0, n, group):
        stop = min(start + group, n)
        block = windows[:(stop - start) * h * w]
        _gather(g[start:stop], kh, kw, stride[0], stride[1], 1, 1, crop[0], crop[1], h, w,
                block)
        m = _block_rows(width, block.shape[0], cin)
        if width % m:
            m = width
        np.matmul(block.T.reshape(width // m, m, -1), rows[start * h * w:stop * h * w],
                  out=part.reshape(width // m, m, cin))
        grad += part
    return grad.reshape(kh, kw, cout, cin)


def conv2d_transpose_input_grad(g, weight, kept, x_shape, stride, crop):
    dtype = weight.dtype
    if dtype.name not in COMPILED_DTYPES or not native(weight) or x_shape[0] == 0:
        return NotImplemented
    g = _exactly_in(g, dtype)
    if g is None:
        return NotImplemented
    kh, kw, cout, cin = weight.shape
    n, h, w, _ = x_shape
    width = kh * kw * cout
    taps = np.ascontiguousarray(weight).reshape(width, cin)  # (rows in the windows' order)
    group = _group_images(h * w, width, dtype.itemsize)
    windows = np.empty((min(group, n) * h * w, width), dtype)
    grad = np.empty((n * h * w, cin), dtype)
    for start in range(0, n, group):
        stop = min(start + group, n)
        block = windows[:(stop - start) * h * w]
        _gather(g[start:stop], kh, kw, stride[0], stride[1], 1, 1, crop[0], crop[1], h, w,
                block)
        _product(block, taps, grad[start * h * w:stop * h * w])
    return grad.reshape(x_shape)
