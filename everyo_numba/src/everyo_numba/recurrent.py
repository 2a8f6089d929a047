"""The LSTM's time loops with each step's gate arithmetic fused into one compiled pass.

The reference (``everyo_layers.recurrent_kernels``) runs ~10 NumPy calls per step on
(batch, hidden) arrays, each a trip through memory and a call's overhead; here each step is the
hidden-state GEMM (NumPy's BLAS, as the reference; in row blocks where a probe finds that
faster and bit for bit the same, see ``_probe_block_rows``) and one pass over the batch's
gates. The arithmetic is the reference's, operation by operation; the ``tanh`` calls stay
NumPy's (vectorised; Numba's scalar ``tanh`` is ~20x slower).
"""

from __future__ import annotations

import time

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


#: Rows per call of a per-step hidden product (forward and backward), by the operands' shapes
#: and dtype (0: one call), decided once per key by ``_probe_block_rows``.
_BLOCK_ROWS: dict = {}
_PROBE_ROWS = 8


def _hidden_product(h, w, out, rows: int) -> None:
    """``out[...] = h @ w``, in calls of ``rows`` rows (0: one call)."""
    if not rows:
        np.matmul(h, w, out=out)
        return
    for start in range(0, h.shape[0], rows):
        np.matmul(h[start:start + rows], w, out=out[start:start + rows])


def _probe_block_rows(batch: int, w) -> int:
    """``_PROBE_ROWS`` when the hidden product in blocks of that many rows gives the one-call
    product's bits and runs faster, else 0.

    NOTE: OpenBLAS (SkylakeX kernels) multiplies small products (M*N*K up to ~1e6) without
    packing the weight: at the benchmarks' shapes (batch 32, hidden 128) four calls of 8 rows
    took ~43 us against ~51-55 us for one call of 32, the same bits (both paths accumulate
    each element over K in order when K fits one block). Whether a BLAS build does so is
    its own business, so it is checked here, on random operands of the real shapes: a
    different accumulation order shows in most elements of the product, and a build without
    the small path (or a larger weight: 1.5-2x slower at hidden 256) is slower in blocks.
    Either way the bits are the one call's: only the speed depends on the timing.
    """
    if batch <= _PROBE_ROWS:
        return 0
    rng = np.random.default_rng(0)
    h = rng.standard_normal((batch, w.shape[0])).astype(w.dtype)
    probe = rng.standard_normal(w.shape).astype(w.dtype)
    whole, blocked = np.empty((2, batch, w.shape[1]), w.dtype)
    _hidden_product(h, probe, whole, 0)
    _hidden_product(h, probe, blocked, _PROBE_ROWS)
    bits = np.dtype(f"u{w.dtype.itemsize}")
    if not np.array_equal(whole.view(bits), blocked.view(bits)):
        return 0
    best = [np.inf, np.inf]
    for _ in range(5):
        for k, rows in enumerate((0, _PROBE_ROWS)):
            start = time.perf_counter()
            for _ in range(8):
                _hidden_product(h, probe, whole, rows)
            best[k] = min(best[k], time.perf_counter() - start)
    return _PROBE_ROWS if best[1] < 0.95 * best[0] else 0


def _block_rows(h, w) -> int:
    """Rows per call for ``h @ w`` (into an array of their one dtype); 0 for mixed dtypes,
    whose product NumPy casts before BLAS (a probe in one dtype says nothing of another),
    and for operands not C-contiguous: the probe multiplies C-ordered ones, and another
    layout is another BLAS call (a column-major weight at hidden 32 gives other bits in
    8-row calls where the C-ordered one does not)."""
    if h.dtype != w.dtype or not (h.flags.c_contiguous and w.flags.c_contiguous):
        return 0
    key = (h.shape, w.shape, h.dtype.char)
    rows = _BLOCK_ROWS.get(key)
    if rows is None:
        rows = _BLOCK_ROWS[key] = _probe_block_rows(h.shape[0], w)
    return rows


def lstm_forward_steps(acts, scaled_w_hh, hs, cs, tanh_c, bias=None):
    if acts.dtype.name not in COMPILED_DTYPES or not native(acts, scaled_w_hh, hs, cs, tanh_c,
                                                            bias):
        return NotImplemented
    if bias is not None and (bias.dtype != acts.dtype or bias.shape != acts.shape[-1:]):
        return NotImplemented
    steps, batch, four = acts.shape
    product = np.empty((batch, four), acts.dtype)
    rows = _block_rows(hs[0], scaled_w_hh) if steps and batch else 0
    for t in range(steps):
        a = acts[t]
        _hidden_product(hs[t], scaled_w_hh, product, rows)
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
    rows = _block_rows(d_pre[0], w_hh_t) if steps and batch else 0
    for t in range(steps - 1, -1, -1):
        _backward_step(acts[t], cs[t], tanh_c[t], gt[t], dh, dc, d_pre[t])
        _hidden_product(d_pre[t], w_hh_t, dh, rows)
    return dh
