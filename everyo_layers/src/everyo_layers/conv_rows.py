"""A convolution whose kernel is one row high, stride 1 (``Conv1D``'s, through ``conv2d`` on a
height-1 view): kw GEMMs on shifted views of the padded input instead of a window matrix.

Pad every row (the sequence) and lay the rows end to end as one ``(N*H*Wp, C)`` matrix ``xf``.
Output step ``t`` of row ``r`` is ``sum_j xf[r*Wp + t + j*d] @ w[j]``: for each kernel
position ``j`` the rows ``xf[j*d : j*d + R]`` are a contiguous view, so the whole output is kw
GEMMs accumulated into one ``(R, out)`` matrix, of which the valid rows are read out (the rows
that straddle two sequences are computed and dropped: ``(kw-1)*d`` of every ``Wp``). The weight
gradient is the same views: ``dw[j] = xf[j*d : j*d + R].T @ gp`` with the output gradient
placed at the valid rows of ``gp`` (zeros elsewhere).

NOTE: no ``(N*Wo, kw*C)`` window matrix is gathered or kept for backward (kw times the input),
and OpenBLAS runs these shapes no slower than the one im2col GEMM (measured, #25: conv1d's
forward ~6% faster, weight gradient ~2%, same load). The sums run in another order than the
im2col GEMM's (per kernel position, then added), so the result is within a few ulp of it, not
its bits: tests/layers/test_conv_rows.py states the bound.
"""

from __future__ import annotations

import numpy as np

#: The dtypes this path runs (BLAS's); 16-bit floats keep the im2col path (through float32).
ROW_DTYPES = (np.dtype(np.float32), np.dtype(np.float64))

#: Output rows per block of the forward's kw products: each block's partial products are added
#: while still in cache (measured, conv1d (32, 256, 64) k=5: ~10% faster than whole-matrix
#: products and adds; 512 to 2048 rows alike).
_BLOCK_ROWS = 2048


def rows_apply(x: np.ndarray, weight: np.ndarray, stride: tuple, pads: tuple) -> bool:
    """Whether :func:`row_conv` computes ``conv2d(x, weight)``: a kernel one row high and more
    than one wide, stride 1, no padding above or below, x and weight of one BLAS dtype."""
    return (weight.shape[0] == 1 and weight.shape[1] > 1 and tuple(stride) == (1, 1)
            and tuple(pads[0]) == (0, 0) and x.dtype == weight.dtype
            and x.dtype in ROW_DTYPES)


def padded_rows(x: np.ndarray, left_right: tuple) -> np.ndarray:
    """NHWC ``x``'s rows padded with zeros by ``(left, right)``, end to end: ``(N*H*Wp, C)``."""
    n, h, w, c = x.shape
    left, right = left_right
    rows = np.zeros((n * h, w + left + right, c), x.dtype)
    rows[:, left:left + w] = x.reshape(n * h, w, c)
    return rows.reshape(-1, c)


def row_conv(rows: np.ndarray, weight: np.ndarray, dilation: int, x_shape: tuple,
             width: int) -> np.ndarray:
    """``(N, H, Wo, out)``: the convolution of the padded rows (``padded_rows``, each ``Wp``
    long) with ``weight`` (1, kw, C, out) at ``dilation``; ``width`` = Wo."""
    n, h = x_shape[:2]
    _, kw, _, cout = weight.shape
    padded = width + (kw - 1) * dilation  # (stride 1)
    count = max(rows.shape[0] - (kw - 1) * dilation, 0)  # (0 for an empty batch)
    full = np.empty((n * h * padded, cout), rows.dtype)
    part = np.empty((min(count, _BLOCK_ROWS), cout), rows.dtype)
    for start in range(0, count, _BLOCK_ROWS):
        stop = min(start + _BLOCK_ROWS, count)
        block, products = full[start:stop], part[:stop - start]
        np.matmul(rows[start:stop], weight[0, 0], out=block)
        for j in range(1, kw):
            shift = j * dilation
            np.matmul(rows[start + shift:stop + shift], weight[0, j], out=products)
            block += products
    return full.reshape(n, h, padded, cout)[:, :, :width]


def row_weight_grad(rows: np.ndarray, g: np.ndarray, dilation: int, w_shape: tuple) -> np.ndarray:
    """The weight's gradient ``(1, kw, C, out)`` given the padded rows and the output gradient
    ``g`` (N, H, Wo, out)."""
    n, h, width, cout = g.shape
    _, kw, cin, _ = w_shape
    padded = width + (kw - 1) * dilation
    count = max(rows.shape[0] - (kw - 1) * dilation, 0)
    compute = np.result_type(rows, g)  # (a wider output gradient, e.g. a float64 bias's)
    rows = rows.astype(compute, copy=False)
    placed = np.zeros((n * h, padded, cout), compute)
    placed[:, :width] = g.reshape(n * h, width, cout)
    placed = placed.reshape(-1, cout)[:count]
    grad = np.empty((1, kw, cin, cout), compute)
    for j in range(kw):
        np.matmul(rows[j * dilation:j * dilation + count].T, placed, out=grad[0, j])
    return grad
