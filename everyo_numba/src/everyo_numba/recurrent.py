"""The LSTM's time loops with each step's gate arithmetic fused into one compiled pass.

The reference (``everyo_layers.recurrent_kernels``) runs ~10 NumPy calls per step on
(batch, hidden) arrays, each a trip through memory and a call's overhead; here each step is the
hidden-state GEMM (NumPy's BLAS, as the reference) and one pass over the batch's gates. The
arithmetic is the reference's, operation by operation; the ``tanh`` calls stay NumPy's
(vectorised; Numba's scalar ``tanh`` is ~20x slower).
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, native, njit


@njit
def _cell_step(a, c_prev, c):
    """The sigmoid gates from their tanh (in place), then ``c = f * c_prev + i * g``."""
    batch, four = a.shape
    hidden = four // 4
    t = a.dtype.type
    one, half = t(1.0), t(0.5)
    for b in range(batch):
        for j in range(3 * hidden):
            a[b, j] = (a[b, j] + one) * half
        for k in range(hidden):
            c[b, k] = a[b, 2 * hidden + k] * c_prev[b, k] + a[b, hidden + k] * a[b, 3 * hidden + k]


@njit
def _output_step(a, tanh_c, h):
    """``h = o * tanh(c)``: the output gate is a strided slice of ``a``, on which NumPy's
    multiply runs row by row (~2x this compiled pass)."""
    batch, hidden = h.shape
    for b in range(batch):
        ab, sb, hb = a[b], tanh_c[b], h[b]
        for k in range(hidden):
            hb[k] = ab[k] * sb[k]


@njit
def _add_step(a, bias, product):
    """``a = (a + bias) + product``: the bias the reference adds to every step beforehand
    (one more pass over all steps' pre-activations), added here on the way."""
    batch, four = a.shape
    for b in range(batch):
        ab, pb = a[b], product[b]
        for j in range(four):
            ab[j] = (ab[j] + bias[j]) + pb[j]


def lstm_forward_steps(acts, scaled_w_hh, hs, cs, tanh_c, bias=None):
    if acts.dtype.name not in COMPILED_DTYPES or not native(acts, scaled_w_hh, hs, cs, tanh_c,
                                                            bias):
        return NotImplemented
    if bias is not None and (bias.dtype != acts.dtype or bias.shape != acts.shape[-1:]):
        return NotImplemented
    steps, batch, four = acts.shape
    product = np.empty((batch, four), acts.dtype)
    for t in range(steps):
        a = acts[t]
        np.matmul(hs[t], scaled_w_hh, out=product)
        if bias is None:
            a += product
        else:
            _add_step(a, bias, product)
        np.tanh(a, out=a)  # (NumPy's vectorised tanh: Numba's scalar one is ~20x slower)
        _cell_step(a, cs[t], cs[t + 1])
        np.tanh(cs[t + 1], out=tanh_c[t])
        _output_step(a, tanh_c[t], hs[t + 1])
    return None


@njit
def _backward_step(a, c_prev, tanh_c, g, dh, dc, d_pre):
    """One step back: ``dh`` (the hidden state's gradient from the step after) gains this
    step's output gradient ``g``; fills this step's ``d_pre``; ``dc`` moves one step back.

    NOTE: one short loop per quantity, each writing one array: a loop that writes two arrays
    and reads five needs more runtime alias checks than LLVM vectorises with (it ran scalar,
    ~6 ns an element); these run in SIMD. The operations are the reference's, in its order.
    """
    batch, four = a.shape
    hidden = four // 4
    one = a.dtype.type(1.0)
    for b in range(batch):
        ab, dpb, dhb, dcb, squashed = a[b], d_pre[b], dh[b], dc[b], tanh_c[b]
        gb, cb = g[b], c_prev[b]
        for k in range(hidden):
            dhb[k] = dhb[k] + gb[k]
        for k in range(hidden):
            o = ab[k]
            dpb[k] = ((one - o) * o * squashed[k]) * dhb[k]
        for k in range(hidden):
            s = squashed[k]
            dcb[k] = dcb[k] + dhb[k] * ((one - s * s) * ab[k])
        for k in range(hidden):
            i, gg = ab[hidden + k], ab[3 * hidden + k]
            dpb[hidden + k] = ((one - i) * i * gg) * dcb[k]
        for k in range(hidden):
            f = ab[2 * hidden + k]
            dpb[2 * hidden + k] = ((one - f) * f * cb[k]) * dcb[k]
        for k in range(hidden):
            i, gg = ab[hidden + k], ab[3 * hidden + k]
            dpb[3 * hidden + k] = ((one - gg * gg) * i) * dcb[k]
        for k in range(hidden):
            dcb[k] = dcb[k] * ab[2 * hidden + k]


@njit
def _transpose_into(w, out):
    """``out[...] = w.T`` in 16x16 tiles (a third of the time of NumPy's strided copy)."""
    rows, columns = w.shape
    for i0 in range(0, rows, 16):
        i1 = min(i0 + 16, rows)
        for j0 in range(0, columns, 16):
            for j in range(j0, min(j0 + 16, columns)):
                for i in range(i0, i1):
                    out[j, i] = w[i, j]


def lstm_backward_steps(gt, acts, cs, tanh_c, w_hh_t, dc, d_pre, work):
    if acts.dtype.name not in COMPILED_DTYPES or gt.dtype != acts.dtype or not native(
            acts, cs, tanh_c, w_hh_t, dc, d_pre, gt):
        return NotImplemented
    steps, batch, four = acts.shape
    # NOTE: the output gradient usually arrives as a strided view (the batch-first output,
    # transposed); one copy makes every step's rows contiguous, which the compiled step
    # needs to run in SIMD (a runtime stride keeps it scalar, ~3x slower).
    gt = np.ascontiguousarray(gt[:steps])
    if not w_hh_t.flags.c_contiguous:  # (BLAS is ~30% slower per step on a transposed view)
        transposed = np.empty(w_hh_t.shape, w_hh_t.dtype)
        _transpose_into(w_hh_t.T, transposed)
        w_hh_t = transposed
    dh = np.zeros((batch, four // 4), acts.dtype)
    for t in range(steps - 1, -1, -1):
        _backward_step(acts[t], cs[t], tanh_c[t], gt[t], dh, dc, d_pre[t])
        np.matmul(d_pre[t], w_hh_t, out=dh)
    return dh
