"""The LSTM's time loops with each step's gate arithmetic fused into one compiled pass.

The reference (``everyo_layers.recurrent_kernels``) runs ~10 NumPy calls per step on
(batch, hidden) arrays, each a trip through memory and a call's overhead; here each step is the
hidden-state GEMM (NumPy's BLAS, as the reference) and one pass over the batch's gates. The
arithmetic is the reference's, operation by operation; ``tanh`` is the C library's rather
than NumPy's vectorised one (within an ulp or two).
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, njit


@njit
def _forward_step(a, product, c_prev, c, tanh_c, h):
    batch, four = a.shape
    hidden = four // 4
    t = a.dtype.type
    one, half = t(1.0), t(0.5)
    for b in range(batch):
        for j in range(four):
            value = np.tanh(a[b, j] + product[b, j])
            a[b, j] = (value + one) * half if j < 3 * hidden else value
        for k in range(hidden):
            o, i, f, g = a[b, k], a[b, hidden + k], a[b, 2 * hidden + k], a[b, 3 * hidden + k]
            cell = f * c_prev[b, k] + i * g
            c[b, k] = cell
            squashed = np.tanh(cell)
            tanh_c[b, k] = squashed
            h[b, k] = o * squashed


def lstm_forward_steps(acts, scaled_w_hh, hs, cs, tanh_c):
    if acts.dtype.name not in COMPILED_DTYPES:
        return NotImplemented
    steps, batch, four = acts.shape
    product = np.empty((batch, four), acts.dtype)
    for t in range(steps):
        np.matmul(hs[t], scaled_w_hh, out=product)
        _forward_step(acts[t], product, cs[t], cs[t + 1], tanh_c[t], hs[t + 1])
    return None


@njit
def _backward_step(a, c_prev, tanh_c, g, dh, dc, d_pre):
    """One step back: ``dh`` (the hidden state's gradient from the step after) gains this
    step's output gradient; fills this step's ``d_pre``; ``dc`` moves one step back."""
    batch, four = a.shape
    hidden = four // 4
    one = a.dtype.type(1.0)
    for b in range(batch):
        for k in range(hidden):
            o, i, f, gg = a[b, k], a[b, hidden + k], a[b, 2 * hidden + k], a[b, 3 * hidden + k]
            squashed = tanh_c[b, k]
            grad_h = dh[b, k] + g[b, k]
            grad_c = dc[b, k] + grad_h * ((one - squashed * squashed) * o)
            d_pre[b, k] = ((one - o) * o * squashed) * grad_h
            d_pre[b, hidden + k] = ((one - i) * i * gg) * grad_c
            d_pre[b, 2 * hidden + k] = ((one - f) * f * c_prev[b, k]) * grad_c
            d_pre[b, 3 * hidden + k] = ((one - gg * gg) * i) * grad_c
            dc[b, k] = grad_c * f


def lstm_backward_steps(gt, acts, cs, tanh_c, w_hh_t, dc, d_pre, work):
    if acts.dtype.name not in COMPILED_DTYPES or gt.dtype != acts.dtype:
        return NotImplemented
    steps, batch, four = acts.shape
    dh = np.zeros((batch, four // 4), acts.dtype)
    for t in range(steps - 1, -1, -1):
        _backward_step(acts[t], cs[t], tanh_c[t], gt[t], dh, dc, d_pre[t])
        np.matmul(d_pre[t], w_hh_t, out=dh)
    return dh
