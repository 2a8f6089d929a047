"""Max pooling in one pass over the input (forward) and over the winners (backward).

The reference (``everyo_layers.pool_kernels``) makes one NumPy pass per kernel position, each
with temporaries; here every window is scanned once, in vectorised loops over the channels.
Both kernels give the reference's bits: a maximum is exact (with np.maximum's choice among
equal values, -0.0 and +0.0, and among NaNs), and backward adds each window's
gradient to its winner in the reference's order (kernel position by kernel position).
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, native, njit


@njit
def _half_order(v, m, nan_above, ties_take_new):
    """``(v wins, v is taken)`` for 16-bit bit patterns: sign and magnitude as an int32 key
    order them as floats do (-0.0 == +0.0); a magnitude above ``nan_above`` is a NaN, never
    greater and never less, taken (propagated) without winning unless ``m`` is a NaN already;
    an equal value is taken when ``ties_take_new`` (np.maximum's rule, see :func:`_forward`)."""
    v, m = np.int32(v), np.int32(m)
    v_mag, m_mag = v & 0x7FFF, m & 0x7FFF
    v_nan = v_mag > nan_above
    m_nan = m_mag > nan_above
    v_key = -v_mag if v & 0x8000 else v_mag
    m_key = -m_mag if m & 0x8000 else m_mag
    wins = (v_key > m_key) & ~v_nan & ~m_nan
    tie = (v_key == m_key) & ~v_nan & ~m_nan & ties_take_new
    return wins, (wins | v_nan | tie) & ~m_nan


@njit
def _forward(x, ph, pw, sh, sw, top, left, half, nan_above, ties_take_new, low, out, winner):
    # NOTE: the channel loops are branch-free (selects, bitwise |) over contiguous rows, and the
    # winners are int32 here (a uint8 array beside float32 values kept LLVM from vectorising:
    # 3x slower), narrowed by the caller. ``half``: x holds 16-bit floats' bits (which Numba
    # cannot compute with), compared by _half_order; ``low`` is -inf (its bits), what a padded
    # position holds. The running maximum follows the reference's np.maximum(running, new)
    # bit for bit: a NaN stays (of two NaNs, the running one); a new NaN is taken; of equal
    # values (-0.0 and +0.0) NumPy keeps the new one for float32, float64 and bfloat16 but the
    # running one for float16 (``ties_take_new``, measured: _ties_take_new). The winner is the
    # first strictly greater value either way.
    n, h, w, c = x.shape
    _, ho, wo, _ = out.shape
    for b in range(n):
        for y in range(ho):
            for xo in range(wo):
                best = out[b, y, xo]
                won = winner[b, y, xo]
                best[:] = low
                won[:] = 0
                for i in range(ph):
                    yy = y * sh + i - top
                    if yy < 0 or yy >= h:
                        continue
                    for j in range(pw):
                        xx = xo * sw + j - left
                        if xx < 0 or xx >= w:
                            continue
                        p = i * pw + j
                        row = x[b, yy, xx]
                        if p == 0:  # (copied as it is, NaN included)
                            best[:] = row
                            continue
                        for ch in range(c):
                            v = row[ch]
                            m = best[ch]
                            if half:
                                wins, takes = _half_order(v, m, nan_above, ties_take_new)
                            else:
                                wins = v > m
                                if ties_take_new:
                                    takes = (m == m) & ~(m > v)
                                else:
                                    takes = (m == m) & (wins | (v != v))
                            best[ch] = v if takes else m
                            won[ch] = p if wins else won[ch]


@njit
def _backward(g, winner, ph, pw, sh, sw, top, left, grad, assign):
    # NOTE: position by position (the reference's order of additions), each window adding its
    # gradient where it won and +0.0 elsewhere, as the reference's masked adds do; a tiled pool
    # (each input element in one window) writes instead, so -0.0 survives alike.
    n, ho, wo, c = g.shape
    _, h, w, _ = grad.shape
    zero = g.dtype.type(0.0)
    for b in range(n):
        for p in range(ph * pw):
            i, j = p // pw, p % pw
            code = winner.dtype.type(p)
            for y in range(ho):
                yy = y * sh + i - top
                if yy < 0 or yy >= h:
                    continue
                for xo in range(wo):
                    xx = xo * sw + j - left
                    if xx < 0 or xx >= w:
                        continue
                    for ch in range(c):
                        value = g[b, y, xo, ch] if winner[b, y, xo, ch] == code else zero
                        if assign:
                            grad[b, yy, xx, ch] = value
                        else:
                            grad[b, yy, xx, ch] += value


#: 16-bit dtype -> (the largest magnitude bits that are not a NaN, -inf's bits).
_HALF_BITS = {"float16": (0x7C00, 0xFC00), "bfloat16": (0x7F80, 0xFF80)}


#: dtype -> whether np.maximum(running, new) returns ``new`` of two equal values.
_TIES: dict = {}


def _ties_take_new(dtype) -> bool:
    """NumPy's choice between equal values in ``np.maximum`` for ``dtype``, measured once (on
    this machine: the new one for float32, float64 and bfloat16, the running one for float16;
    a matter of NumPy's loops and the CPU's max instruction, not of IEEE 754)."""
    known = _TIES.get(dtype)
    if known is None:
        bits = np.dtype(f"u{dtype.itemsize}")
        new = np.maximum(np.full(64, -0.0, dtype), np.zeros(64, dtype)).view(bits)
        known = _TIES[dtype] = not new.any()  # every result +0.0: the new value
    return known


def max_pool2d_forward(x, pool, stride, pads, out_hw, tiled):
    half = _HALF_BITS.get(x.dtype.name)
    if x.dtype.name not in COMPILED_DTYPES and half is None or not native(x):
        return NotImplemented
    winner_code = np.uint8 if pool[0] * pool[1] < 256 else np.int32
    out = np.empty((x.shape[0], out_hw[0], out_hw[1], x.shape[3]), x.dtype)
    winner = np.empty(out.shape, np.int32)
    geometry = (pool[0], pool[1], stride[0], stride[1], pads[0][0], pads[1][0])
    ties_take_new = _ties_take_new(x.dtype)
    if half is None:
        _forward(x, *geometry, False, 0, ties_take_new, x.dtype.type(-np.inf), out, winner)
    else:
        _forward(x.view(np.uint16), *geometry, True, half[0], ties_take_new,
                 np.uint16(half[1]), out.view(np.uint16), winner)
    return out, winner.astype(winner_code, copy=False)


def max_pool2d_backward(g, winner, x_shape, pool, stride, pads, out_hw, tiled):
    bits = g.dtype.name in _HALF_BITS and tiled  # (a tiled pool only moves values: their bits)
    if g.dtype.name not in COMPILED_DTYPES and not bits or not native(g, winner):
        return NotImplemented
    grad = np.empty(x_shape, g.dtype) if tiled else np.zeros(x_shape, g.dtype)
    values, into = (g.view(np.uint16), grad.view(np.uint16)) if bits else (g, grad)
    _backward(values, winner, pool[0], pool[1], stride[0], stride[1], pads[0][0], pads[1][0],
              into, bool(tiled))
    return grad
