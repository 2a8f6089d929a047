"""Max pooling in one pass over the input (forward) and over the winners (backward).

The reference (``everyo_layers.pool_kernels``) makes one NumPy pass per kernel position, each
with temporaries; here every window is scanned once, its maximum and winner kept in registers.
Both kernels give the reference's bits: a maximum is exact, and backward adds each window's
gradient to its winner in the reference's order (kernel position by kernel position).
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, njit


@njit
def _forward(x, ph, pw, sh, sw, top, left, out, winner):
    n, h, w, c = x.shape
    _, ho, wo, _ = out.shape
    for b in range(n):
        for y in range(ho):
            for xo in range(wo):
                for ch in range(c):
                    out[b, y, xo, ch] = -np.inf  # a padded position holds -inf
                    winner[b, y, xo, ch] = 0
                for i in range(ph):
                    yy = y * sh + i - top
                    if yy < 0 or yy >= h:
                        continue
                    for j in range(pw):
                        xx = xo * sw + j - left
                        if xx < 0 or xx >= w:
                            continue
                        p = i * pw + j
                        for ch in range(c):
                            v = x[b, yy, xx, ch]
                            m = out[b, y, xo, ch]
                            if p == 0:
                                out[b, y, xo, ch] = v
                            elif v > m:  # a later equal value does not win
                                out[b, y, xo, ch] = v
                                winner[b, y, xo, ch] = p
                            elif v != v:  # NaN propagates, as np.maximum, but never wins
                                out[b, y, xo, ch] = v


@njit
def _backward(g, winner, ph, pw, sh, sw, top, left, grad, assign):
    n, ho, wo, c = g.shape
    _, h, w, _ = grad.shape
    for b in range(n):
        for p in range(ph * pw):  # position by position: the reference's order of additions
            i, j = p // pw, p % pw
            for y in range(ho):
                yy = y * sh + i - top
                if yy < 0 or yy >= h:
                    continue
                for xo in range(wo):
                    xx = xo * sw + j - left
                    if xx < 0 or xx >= w:
                        continue
                    for ch in range(c):
                        if winner[b, y, xo, ch] == p:
                            if assign:
                                grad[b, yy, xx, ch] = g[b, y, xo, ch]
                            else:
                                grad[b, yy, xx, ch] += g[b, y, xo, ch]


def max_pool2d_forward(x, pool, stride, pads, out_hw, tiled):
    if x.dtype.name not in COMPILED_DTYPES:
        return NotImplemented
    winner_code = np.uint8 if pool[0] * pool[1] < 256 else np.int32
    out = np.empty((x.shape[0], out_hw[0], out_hw[1], x.shape[3]), x.dtype)
    winner = np.empty(out.shape, winner_code)
    _forward(x, pool[0], pool[1], stride[0], stride[1], pads[0][0], pads[1][0], out, winner)
    return out, winner


def max_pool2d_backward(g, winner, x_shape, pool, stride, pads, out_hw, tiled):
    if g.dtype.name not in COMPILED_DTYPES:
        return NotImplemented
    # NOTE: the reference writes a tiled pool's gradient (each input element meets one
    # window) and adds overlapping ones into zeros: the same here, so -0.0 survives alike.
    grad = np.zeros(x_shape, g.dtype)
    _backward(g, winner, pool[0], pool[1], stride[0], stride[1], pads[0][0], pads[1][0], grad,
              bool(tiled))
    return grad
