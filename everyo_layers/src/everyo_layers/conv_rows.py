"""A convolution whose kernel is one row high, stride 1 (``Conv1D``'s, through ``conv2d`` on a
height-1 view): kw GEMMs on shifted views of the padded input instead of a window matrix.

Pad every row (the sequence) and lay the rows end to end as one ``(N*H*Wp, C)`` matrix ``xf``.
Output step ``t`` of row ``r`` is ``sum_j xf[r*Wp + t + j*d] @ w[j]``: for each kernel
position ``j`` the rows ``xf[j*d : j*d + R]`` are a contiguous view, so the whole output is kw
GEMMs accumulated into one ``(R, out)`` matrix, of which the valid rows are read out (the rows
that straddle two sequences are computed and dropped: ``(kw-1)*d`` of every ``Wp``). The weight
gradient is the same views: ``dw[j] = xf[j*d : j*d + R].T @ gp`` with the output gradient
placed at the valid rows of ``gp`` (zeros elsewhere). The input gradient is this convolution
again (``row_input_grad``): of the output gradient, with the taps reversed and transposed.

NOTE: no ``(N*Wo, kw*C)`` window matrix is gathered or kept for backward (kw times the input),
and OpenBLAS runs these shapes no slower than the one im2col GEMM (measured, #25: conv1d's
forward ~6% faster, weight gradient ~2%, same load). The sums run in another order than the
im2col GEMM's (per kernel position, then added), so the result is within a few ulp of it, not
its bits: tests/layers/test_conv_rows.py states the bound.

NOTE: the GEMMs run on blocks of ``block_rows`` rows (``M * C * out <= 100**3``), batched in
one ``np.matmul`` call over a ``(blocks, M, C)`` view: OpenBLAS's SkylakeX (AVX-512) build
sends a product that small to its small-matrix kernels, which skip the packing copies of the
operands: 86 -> 104 GFLOP/s for conv1d's (R, 64) @ (64, 64) (244 rows a block; 248 rows,
just past the limit, fall back to 87). Measured on the rows of conv1d's shape, 1 thread:
forward 4.2 -> 3.6 ms, weight gradient 4.0 -> 3.4 ms; also faster at 32, 90 and 128
channels (a block of 61 rows at 128: 19.0 -> 14.7 ms). The rows computed are rounded up to
whole blocks (``padded_rows`` adds the zero rows they read); where the BLAS has no such
kernels the blocks cost one BLAS call each, in C (the batched loop), no Python loop.
"""

from __future__ import annotations

import numpy as np

#: The dtypes this path runs (BLAS's); 16-bit floats keep the im2col path (through float32).
ROW_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

#: OpenBLAS's SkylakeX small-matrix kernels take a product of ``M*N*K <= 100**3`` (no packing).
_SMALL_PRODUCT = 100 ** 3
#: Fewest rows a block (past ~31000 channel pairs: no small-matrix kernel, packed blocks of 32
#: rows). Measured, 3 taps over 256 steps: 256 channels 18.3 ms in blocks of 2048 rows, 11.1 in
#: 32, 10.2 in 15 (small kernels); 512 channels 33.5 in 2048, 22.6 in 32, 38 in 8.
_MIN_BLOCK_ROWS = 32
#: Output rows per group of blocks in the forward: each group's kw partial products are added
#: while in cache (measured, conv1d (32, 256, 64) k=5: ~10% faster than whole-matrix products).
_GROUP_ROWS = 2048
#: Bytes of the weight gradient's per-block partial products held at once.
_PARTIAL_BYTES = 4 << 20


def rows_apply(x: np.ndarray, weight: np.ndarray, stride: tuple, pads: tuple) -> bool:
    """Whether :func:`row_conv` computes ``conv2d(x, weight)``: a kernel one row high and more
    than one wide, stride 1, no padding above or below, x and weight of one BLAS dtype."""
    return (weight.shape[0] == 1 and weight.shape[1] > 1 and tuple(stride) == (1, 1)
            and tuple(pads[0]) == (0, 0) and x.dtype == weight.dtype
            and x.dtype in ROW_DTYPES)


def block_rows(cin: int, cout: int) -> int:
    """Rows per GEMM block for ``cin`` input and ``cout`` output channels (module NOTE)."""
    return max(_SMALL_PRODUCT // max(cin * cout, 1), _MIN_BLOCK_ROWS)


def _blocks(total: int, reach: int, m: int) -> tuple:
    """``(blocks, rows computed)``: the ``total - reach`` output rows of ``total`` padded rows
    (each output row reads ``reach`` rows on) rounded up to whole blocks of ``m``."""
    blocks = -(-max(total - reach, 0) // m)
    return blocks, blocks * m


def padded_rows(x: np.ndarray, left_right: tuple, w_shape: tuple, dilation: int) -> np.ndarray:
    """NHWC ``x``'s rows padded with zeros by ``(left, right)``, end to end, then the zero rows
    that round the computed rows up to whole blocks: ``(N*H*Wp + tail, C)``."""
    n, h, w, c = x.shape
    left, right = left_right
    _, kw, _, cout = w_shape
    reach = (kw - 1) * dilation
    total = n * h * (w + left + right)
    _, computed = _blocks(total, reach, block_rows(c, cout))
    rows = np.zeros((max(computed + reach, total), c), x.dtype)
    rows[:total].reshape(n * h, w + left + right, c)[:, left:left + w] = x.reshape(n * h, w, c)
    return rows


def row_conv(rows: np.ndarray, weight: np.ndarray, dilation: int, x_shape: tuple,
             width: int) -> np.ndarray:
    """``(N, H, Wo, out)``: the convolution of the padded rows (``padded_rows``, each ``Wp``
    long) with ``weight`` (1, kw, C, out) at ``dilation``; ``width`` = Wo."""
    n, h = x_shape[:2]
    _, kw, cin, cout = weight.shape
    reach = (kw - 1) * dilation
    total = n * h * (width + reach)  # (stride 1)
    m = block_rows(cin, cout)
    blocks, computed = _blocks(total, reach, m)
    full = np.empty((max(computed, total), cout), rows.dtype)
    out = full[:computed].reshape(blocks, m, cout)
    taps = [rows[j * dilation:j * dilation + computed].reshape(blocks, m, cin)
            for j in range(kw)]
    group = max(_GROUP_ROWS // m, 1)
    part = np.empty((min(group, blocks), m, cout), rows.dtype)
    for start in range(0, blocks, group):
        stop = min(start + group, blocks)
        block, products = out[start:stop], part[:stop - start]
        np.matmul(taps[0][start:stop], weight[0, 0], out=block)
        for j in range(1, kw):
            np.matmul(taps[j][start:stop], weight[0, j], out=products)
            block += products
    return full[:total].reshape(n, h, width + reach, cout)[:, :, :width]


def row_weight_grad(rows: np.ndarray, g: np.ndarray, dilation: int, w_shape: tuple) -> np.ndarray:
    """The weight's gradient ``(1, kw, C, out)`` given the padded rows and the output gradient
    ``g`` (N, H, Wo, out)."""
    n, h, width, cout = g.shape
    _, kw, cin, _ = w_shape
    reach = (kw - 1) * dilation
    total = n * h * (width + reach)
    m = block_rows(cin, cout)
    blocks, computed = _blocks(total, reach, m)
    compute = np.result_type(rows, g)  # (a wider output gradient, e.g. a float64 bias's)
    rows = rows.astype(compute, copy=False)
    placed = np.zeros((max(computed, total), cout), compute)
    placed[:total].reshape(n * h, width + reach, cout)[:, :width] = g.reshape(n * h, width, cout)
    placed = placed[:computed].reshape(blocks, m, cout)
    grad = np.zeros((1, kw, cin, cout), compute)
    group = max(_PARTIAL_BYTES // (cin * cout * compute.itemsize), 1)
    part = np.empty((min(group, blocks), cin, cout), compute)
    for start in range(0, blocks, group):
        stop = min(start + group, blocks)
        products = part[:stop - start]
        for j in range(kw):
            tap = rows[j * dilation + start * m:j * dilation + stop * m]
            np.matmul(tap.reshape(stop - start, m, cin).transpose(0, 2, 1), placed[start:stop],
                      out=products)
            grad[0, j] += np.add.reduce(products, axis=0)
    return grad


def row_input_grad(g: np.ndarray, weight: np.ndarray, dilation: int, left_right: tuple,
                   width: int):
    """The input's gradient ``(N, H, W, C)`` given the output gradient ``g`` (N, H, Wo, out):
    the same one-row convolution of ``g`` padded by the kernel's reach less the forward's
    padding, with the kernel reversed and each tap transposed; None where the forward padded
    more than the reach (or ``g`` has another dtype than the weight: a wider bias's)."""
    _, kw, _, _ = weight.shape
    reach = (kw - 1) * dilation
    left, right = left_right
    if left > reach or right > reach or g.dtype != weight.dtype:
        return None
    reversed_taps = np.ascontiguousarray(weight[:, ::-1].transpose(0, 1, 3, 2))
    rows = padded_rows(g, (reach - left, reach - right), reversed_taps.shape, dilation)
    return np.ascontiguousarray(row_conv(rows, reversed_taps, dilation, g.shape, width))
