"""Max pooling's kernels: the window scan (maximum and winner) and the scatter back to the
winners. The NumPy references below are what ``MaxPool2DOp`` runs unless a kernel provider
(``everyo.kernels``) supplies faster ones; each provider is tested against them.

Geometry arguments are resolved: ``pool``/``stride`` int pairs, ``pads`` as
``((top, bottom), (left, right))``, ``out_hw`` the output's (Ho, Wo), ``tiled`` True when the
windows cover the input exactly once (no padding, stride == pool, sizes divisible).
"""

from __future__ import annotations

import numpy as np

from everyo.kernels import Kernel, keep_where
from everyo_layers.precision import accumulation_dtype
from everyo_layers.windows import pad_hw, window_slices


def pool_views(padded: np.ndarray, pool: tuple, stride: tuple, out_hw: tuple,
               tiled: bool) -> list:
    """One ``(N, Ho, Wo, C)`` view of ``padded`` per kernel position (writable if it is)."""
    (ph, pw), (ho, wo) = pool, out_hw
    if tiled:
        # NOTE: non-overlapping windows: (N, Ho, ph, Wo, pw, C) is a free reshape.
        blocks = padded.reshape(padded.shape[0], ho, ph, wo, pw, padded.shape[3])
        return [blocks[:, :, i, :, j, :] for i in range(ph) for j in range(pw)]
    return [padded[window_slices((i, j), stride, (1, 1), out_hw)]
            for i in range(ph) for j in range(pw)]


def max_pool2d_forward(x: np.ndarray, pool: tuple, stride: tuple, pads: tuple, out_hw: tuple,
                       tiled: bool) -> tuple:
    """``(out, winner)``: each window's maximum and the kernel position that won it."""
    views = pool_views(pad_hw(x, pads, value=-np.inf), pool, stride, out_hw, tiled)
    out = views[0].copy()
    # NOTE: remember which kernel position won (one byte per output), so that backward
    # needs neither the input nor a full-size mask; ">" keeps the first of tied maxima.
    # The winner is the last position that beat the running maximum, i.e. the largest
    # such position: a maximum of 0/position arrays (much faster than masked writes).
    code = winner_dtype(pool)
    winner = np.zeros(out.shape, code)
    for position, view in enumerate(views[1:], start=1):
        beats = np.greater(view, out).view(np.uint8).astype(code, copy=False)
        np.maximum(winner, beats * code.type(position), out=winner)
        np.maximum(out, view, out=out)
    return out, winner


def winner_dtype(pool: tuple) -> np.dtype:
    """The dtype of the winner codes: one byte while the window has fewer than 256 positions."""
    return np.dtype(np.uint8 if pool[0] * pool[1] < 256 else np.int32)


def max_pool2d_backward(g: np.ndarray, winner: np.ndarray, x_shape: tuple, pool: tuple,
                        stride: tuple, pads: tuple, out_hw: tuple, tiled: bool) -> np.ndarray:
    """The input's gradient: each window's gradient added to the element that won it."""
    if tiled:  # the views cover the input exactly once: write, no zero-fill
        grad = np.empty(x_shape, dtype=g.dtype)
        for position, target in enumerate(pool_views(grad, pool, stride, out_hw, tiled)):
            keep_where(winner == position, g, out=target)
        return grad
    accumulate = accumulation_dtype(g.dtype)  # overlapping windows add up: float16 in float32
    (top, bottom), (left, right) = pads
    padded_shape = (x_shape[0], x_shape[1] + top + bottom, x_shape[2] + left + right,
                    x_shape[3])
    grad = np.zeros(padded_shape, dtype=accumulate)
    for position, target in enumerate(pool_views(grad, pool, stride, out_hw, tiled)):
        target += keep_where(winner == position, g)
    cropped = grad[:, top:top + x_shape[1], left:left + x_shape[2], :]
    return cropped.astype(g.dtype, copy=False)


KERNELS = {
    "max_pool2d_forward": Kernel(max_pool2d_forward, """
        x: NHWC, any floating dtype (float16/bfloat16 included), any strides. Returns
        (out, winner): out (N, Ho, Wo, C) in x's dtype, each window's maximum, padding counting
        as -inf and NaN propagating (np.maximum); winner (N, Ho, Wo, C) of winner_dtype(pool),
        the kernel position (i * pool_w + j) of the window's first maximum (a later equal value
        does not win; a NaN never wins, so a window whose maximum is NaN keeps the winner of
        its values before it). Exact: no rounding. Overwrites nothing."""),
    "max_pool2d_backward": Kernel(max_pool2d_backward, """
        g: (N, Ho, Wo, C) floating, winner as max_pool2d_forward returned it. Returns the
        input's gradient, shape x_shape, g's dtype: zero except at each window's winner, which
        receives the window's gradient (summed where windows overlap, float16/bfloat16 summed
        in float32 and rounded once). Exact where windows do not overlap; +0.0 where no window
        won. Overwrites nothing."""),
}
