"""The normalisation layers' kernels: LayerNorm, BatchNorm (batch statistics) and GroupNorm,
forward and backward. The NumPy references below are what the norm ops run unless a kernel
provider (``everyo.kernels``) supplies faster ones.

Shared rules (every implementation keeps them): the computation runs in
``accumulation_dtype(x.dtype)`` (float16/bfloat16 in float32, float64 stays float64); the
statistics are accumulated in float64 (:func:`everyo_layers.norm_stats.moments`); forward
returns ``xhat`` and ``inv_std`` in the computation dtype for backward, and the output in
``x``'s dtype.

Float32 input whose deviations from the mean pass sqrt(float32 max) (~1.8e19) has squares, or
a variance, beyond float32 (the centered values themselves may overflow near float32 max):
``inv_std`` comes out 0 (1 / inf) and so would every output. Such a call is computed again in
float64 and rounded once to the usual dtypes (:func:`recomputed_in_float64_on_overflow`), which
gives the representable answer; ordinary input never takes that path and keeps its bits.
"""

from __future__ import annotations

import functools
import math

import numpy as np

from everyo.kernels import Kernel
from everyo_layers.norm_stats import mean_over, moments
from everyo_layers.precision import accumulation_dtype


def recomputed_in_float64_on_overflow(forward):
    """``forward`` (returning ``(out, xhat, inv_std, ...)``), run again on float64 input when
    an ``inv_std`` is 0: a variance (or a centered value) overflowed the computation dtype.
    The float64 results are rounded to the first run's dtypes (a variance beyond float32
    becomes inf, as the mathematics says). The check costs one pass over ``inv_std``."""
    @functools.wraps(forward)
    def run(x, *args):
        result = forward(x, *args)
        inv_std = result[2]
        if inv_std.dtype == np.float64 or inv_std.all():  # (NaN is truthy: it stays)
            return result
        wide = forward(x.astype(np.float64), *args)
        return tuple(w.astype(r.dtype, copy=False) for w, r in zip(wide, result, strict=True))
    return run


def normalize(x, centered, var, eps, weight, bias) -> tuple:
    """``(out, xhat, inv_std)`` of ``(x - mean) / sqrt(var + eps) * weight + bias``."""
    inv_std = (1.0 / np.sqrt(var + eps)).astype(centered.dtype, copy=False)
    xhat = centered * inv_std
    if weight is not None:
        out = xhat * weight
        if bias is not None:
            out += bias
    else:
        out = xhat if bias is None else xhat + bias
    return out.astype(x.dtype, copy=False), xhat, inv_std


@recomputed_in_float64_on_overflow
def layer_norm_forward(x, weight, bias, ndims: int, eps: float) -> tuple:
    """LayerNorm over the trailing ``ndims`` axes: ``(out, xhat, inv_std)``."""
    xc = x.astype(accumulation_dtype(x.dtype), copy=False)
    _, centered, var = moments(xc, tuple(range(x.ndim - ndims, x.ndim)))
    return normalize(x, centered, var, eps, weight, bias)


def layer_norm_backward(g, xhat, inv_std, weight, ndims: int, needs: tuple) -> tuple:
    """``(gx, gw, gb)`` of LayerNorm; each None where ``needs`` (x, weight, bias) is False."""
    axes = tuple(range(g.ndim - ndims, g.ndim))
    gy = g.astype(xhat.dtype, copy=False)
    lead = tuple(range(g.ndim - ndims))
    gx = gw = gb = None
    if needs[0]:
        gxhat = gy * weight if weight is not None else gy
        mean_g = gxhat.mean(axis=axes, keepdims=True)
        mean_gx = (gxhat * xhat).mean(axis=axes, keepdims=True)
        # inv_std * (gxhat - mean_g - xhat * mean_gx), same operations, one buffer
        gx = np.subtract(gxhat, mean_g)
        gx -= xhat * mean_gx
        gx *= inv_std
    if len(needs) > 1 and needs[1]:
        gw = (gy * xhat).sum(axis=lead)
    if len(needs) > 2 and needs[2]:
        gb = gy.sum(axis=lead)
    return gx, gw, gb


@recomputed_in_float64_on_overflow
def batch_norm_forward(x, weight, bias, eps: float) -> tuple:
    """BatchNorm by the batch's statistics over every axis but the last:
    ``(out, xhat, inv_std, mean, biased variance)``."""
    xc = x.astype(accumulation_dtype(x.dtype), copy=False)
    mean, centered, var = moments(xc, tuple(range(x.ndim - 1)), keepdims=False)
    return normalize(x, centered, var, eps, weight, bias) + (mean, var)


def batch_norm_backward(g, xhat, inv_std, weight, training: bool, needs: tuple) -> tuple:
    """``(gx, gw, gb)`` of BatchNorm (``training``: by batch statistics, whose own gradient
    enters ``gx``); each None where ``needs`` (x, weight, bias) is False."""
    gy = g.astype(xhat.dtype, copy=False)
    axes = tuple(range(g.ndim - 1))
    sum_gy = gy.sum(axis=axes)
    channels = g.shape[-1]
    sum_gy_xhat = np.einsum("nc,nc->c", gy.reshape(-1, channels), xhat.reshape(-1, channels))
    gx = None
    if needs[0]:
        scale = inv_std if weight is None else inv_std * weight
        if training:
            # (gy - (sum_gy + xhat * sum_gy_xhat) / count) * scale, the same operations
            # in the same order, in one buffer: a quarter faster than five temporaries
            gx = np.multiply(xhat, sum_gy_xhat)
            gx += sum_gy
            gx /= g.size // g.shape[-1]
            np.subtract(gy, gx, out=gx)
            # (a wider scale, e.g. a float64 weight: a wider result, rounded once later)
            gx = np.multiply(gx, scale, out=gx if scale.dtype == gx.dtype else None)
        else:
            gx = gy * scale
    gw = sum_gy_xhat if len(needs) > 1 and needs[1] else None
    gb = sum_gy if len(needs) > 2 and needs[2] else None
    return gx, gw, gb


def group_shape(shape: tuple, groups: int) -> tuple:
    """``(N, positions, groups, C / groups)`` of a channels-last ``shape``; explicit sizes,
    as NumPy cannot infer an axis (-1) when the batch is empty."""
    n, c = shape[0], shape[-1]
    return n, math.prod(shape[1:-1]), groups, c // groups


@recomputed_in_float64_on_overflow
def group_norm_forward(x, weight, bias, groups: int, eps: float) -> tuple:
    """GroupNorm of channels-last ``x`` (N, ..., C): ``(out, xhat, inv_std)``; ``inv_std`` is
    ``(N, 1, groups, 1)``."""
    xc = x.astype(accumulation_dtype(x.dtype), copy=False).reshape(group_shape(x.shape, groups))
    _, centered, var = moments(xc, (1, 3))
    inv_std = (1.0 / np.sqrt(var + eps)).astype(xc.dtype)
    xhat = (centered * inv_std).reshape(x.shape)
    out = xhat if weight is None else xhat * weight
    if bias is not None:
        out = out + bias
    return out.astype(x.dtype, copy=False), xhat, inv_std


def group_norm_backward(g, xhat, inv_std, weight, groups: int, needs: tuple) -> tuple:
    """``(gx, gw, gb)`` of GroupNorm, each in ``g``'s dtype (None where not needed)."""
    gy = g.astype(xhat.dtype, copy=False)
    lead = tuple(range(g.ndim - 1))
    gx = gw = gb = None
    if needs[0]:
        gxhat = gy * weight if weight is not None else gy
        grouped = group_shape(g.shape, groups)
        gxhat, xh = gxhat.reshape(grouped), xhat.reshape(grouped)
        mean_g = mean_over(gxhat, (1, 3))
        mean_gx = mean_over(gxhat * xh, (1, 3))
        # inv_std * (gxhat - mean_g - xh * mean_gx), the same operations in one buffer
        gx = np.subtract(gxhat, mean_g)
        gx -= xh * mean_gx
        gx *= inv_std
        gx = gx.reshape(g.shape).astype(g.dtype, copy=False)
    if len(needs) > 1 and needs[1]:
        gw = (gy * xhat).sum(axis=lead).astype(g.dtype, copy=False)
    if len(needs) > 2 and needs[2]:
        gb = gy.sum(axis=lead).astype(g.dtype, copy=False)
    return gx, gw, gb


_FORWARD = """x: any floating dtype, any strides; weight/bias None or broadcastable to the
        normalised shape (any floating dtype). The computation runs in
        accumulation_dtype(x.dtype) (at least float32), the mean and variance accumulated in
        float64 (the float32 mean's rounding residue subtracted from the centered values).
        Returns new arrays; overwrites nothing."""
_BACKWARD = """g: the output's gradient, any floating dtype; xhat/inv_std as forward returned them;
        needs (x, weight, bias) booleans (a missing entry: False). Gradients are None where not
        needed; sums in at least float32. Returns new arrays; overwrites nothing."""

KERNELS = {
    "layer_norm_forward": Kernel(layer_norm_forward, "LayerNorm over the trailing ndims axes: "
                                 "(out in x's dtype, xhat, inv_std with the normalised axes "
                                 "kept as size 1). " + _FORWARD),
    "layer_norm_backward": Kernel(layer_norm_backward, "(gx, gw, gb) of LayerNorm; gw/gb summed "
                                  "over the leading axes. " + _BACKWARD),
    "batch_norm_forward": Kernel(batch_norm_forward, "BatchNorm by batch statistics over every "
                                 "axis but the last (channels): (out in x's dtype, xhat, "
                                 "inv_std (C,), mean (C,), biased variance (C,)). " + _FORWARD),
    "batch_norm_backward": Kernel(batch_norm_backward, "(gx, gw, gb) of BatchNorm; training: "
                                  "through the batch statistics, else by the fixed inv_std "
                                  "(and weight). " + _BACKWARD),
    "group_norm_forward": Kernel(group_norm_forward, "GroupNorm of channels-last x (N, ..., C) "
                                 "over each sample's groups: (out in x's dtype, xhat, inv_std "
                                 "(N, 1, groups, 1)). " + _FORWARD),
    "group_norm_backward": Kernel(group_norm_backward, "(gx, gw, gb) of GroupNorm, each in g's "
                                  "dtype. " + _BACKWARD),
}
