"""LayerNorm, BatchNorm and GroupNorm, each forward and backward in a few fused passes.

The reference (``everyo_layers.norm_kernels``) makes one NumPy pass per elementwise operation.
These loops keep its rules: 16-bit input computed in float32, the mean and variance summed in
float64 with the float32 mean's rounding residue subtracted, the same elementwise operations
in the same order. The statistics' and the input gradient's sums are formed in float64 here
(the reference sums gradients in the computation dtype), so results agree to within the
reference's own rounding of those sums; a LayerNorm row's sums run in SIMD lanes
(:data:`everyo_numba.jit.njit_sum`). The weight's and bias's gradients are summed in float64
too: the reference's float32 sums, row after row, drift by tens of ulps over 32k rows.

A missing weight is passed to the loops as ones and a missing bias as negative zeros: ``v * 1``
and ``v + (-0.0)`` are ``v`` exactly (signed zeros, infinities and NaN included), and one
branch-free loop vectorises where four specialised ones would not be smaller.

A zero ``inv_std`` (1 / inf: a float32 variance, square or centered value overflowed, at
deviations above ~1.8e19) sends the call to the reference, which computes it again in float64
(``recomputed_in_float64_on_overflow``): one check of the statistics, nothing in the loops.

Every wrapper allocates its results in their final shape and hands the loops reshaped views, so
that it returns arrays that own their memory (autograd copies a gradient that is a view).
"""

from __future__ import annotations

import math

import numpy as np

from everyo_numba.jit import native, njit, njit_sum

_COMPUTE = {"float16": np.float32, "bfloat16": np.float32, "float32": np.float32,
            "float64": np.float64}
#: The same by dtype, for the native ones: ``dtype.name`` costs 2 µs a call.
_COMPUTE_NATIVE = {np.dtype(name): compute for name, compute in _COMPUTE.items()
                   if name != "bfloat16"}
_COMPILED = (np.dtype(np.float32), np.dtype(np.float64))


def _compute_dtype(*arrays):
    """The loops' dtype for these operands (None: leave the call to the reference): every
    operand's dtype maps to one compute dtype, and parameters already have it."""
    x = arrays[0]
    compute = _COMPUTE_NATIVE.get(x.dtype) or _COMPUTE.get(x.dtype.name)
    if compute is None:
        return None
    for a in arrays[1:]:
        if a is not None and a.dtype != compute:
            return None
    return compute


def _rows(a, compute, rows, cols):
    return np.ascontiguousarray(a, dtype=compute).reshape(rows, cols)


def _weight(weight, size, compute):
    """``weight`` as a contiguous vector, ones where there is none (an exact identity)."""
    if weight is None:
        return np.ones(size, compute)
    return np.ascontiguousarray(weight).reshape(size)


def _bias(bias, size, compute):
    """``bias`` as a contiguous vector, negative zeros where there is none (adding -0.0 changes
    no value, not even the sign of a zero)."""
    if bias is None:
        return np.full(size, -0.0, compute)
    return np.ascontiguousarray(bias).reshape(size)


@njit_sum
def _sum(a):
    """The float64 sum of vector ``a``."""
    s = 0.0
    for k in range(a.shape[0]):
        s += a[k]
    return s


@njit_sum
def _sum_of_squares(a):
    """The float64 sum of vector ``a``'s squares, each squared in a's dtype (the reference's
    ``np.square``)."""
    s = 0.0
    for k in range(a.shape[0]):
        s += a[k] * a[k]
    return s


@njit_sum
def _sum_and_dot(a, b):
    """The float64 sums of ``a`` and of ``a * b`` (each product in the vectors' dtype)."""
    s = 0.0
    p = 0.0
    for k in range(a.shape[0]):
        s += a[k]
        p += a[k] * b[k]
    return s, p


@njit
def _layer_norm_forward(x, weight, bias, eps, out, xhat, inv_std):
    # NOTE: per row (in cache): its sum; the centered values, then their squares' sum (apart:
    # the residue's subtraction must not be reassociated); the output.
    m, d = x.shape
    t = x.dtype.type
    for r in range(m):
        row, centered, result = x[r], xhat[r], out[r]
        mean = _sum(row) / d
        high = t(mean)
        residue = t(mean - high)
        for k in range(d):
            centered[k] = (row[k] - high) - residue
        inv = t(1.0) / np.sqrt(t(_sum_of_squares(centered) / d) + t(eps))
        inv_std[r] = inv
        for k in range(d):
            value = centered[k] * inv
            centered[k] = value
            result[k] = value * weight[k] + bias[k]


def layer_norm_forward(x, weight, bias, ndims, eps):
    compute = _compute_dtype(x, weight, bias)
    shape = x.shape[x.ndim - ndims:]
    d = math.prod(shape)
    if compute is None or not d or any(p is not None and p.shape != shape
                                       for p in (weight, bias)):
        return NotImplemented
    m = x.size // d
    out = np.empty(x.shape, compute)
    xhat = np.empty(x.shape, compute)
    inv_std = np.empty(x.shape[:x.ndim - ndims] + (1,) * ndims, compute)
    _layer_norm_forward(_rows(x, compute, m, d), _weight(weight, d, compute),
                        _bias(bias, d, compute), eps, out.reshape(m, d), xhat.reshape(m, d),
                        inv_std.reshape(m))
    if not inv_std.all():
        return NotImplemented
    return out.astype(x.dtype, copy=False), xhat, inv_std


@njit
def _layer_norm_backward(gy, xhat, inv_std, weight, need_x, gx, gw, gb):
    # NOTE: per row, one pass for the parameters' sums and the input gradient's first factor,
    # the row's two sums, one pass for the input gradient.
    m, d = gy.shape
    t = gy.dtype.type
    acc_w = np.zeros(d)
    acc_b = np.zeros(d)
    for r in range(m):
        g, xh, grad = gy[r], xhat[r], gx[r]
        for k in range(d):
            value = g[k]
            acc_w[k] += value * xh[k]
            acc_b[k] += value
            grad[k] = value * weight[k]
        if need_x:
            s_g, s_gx = _sum_and_dot(grad, xh)
            mean_g = t(s_g / d)
            mean_gx = t(s_gx / d)
            inv = inv_std[r]
            for k in range(d):
                grad[k] = ((grad[k] - mean_g) - xh[k] * mean_gx) * inv
    for k in range(d):
        gw[k] = acc_w[k]
        gb[k] = acc_b[k]


def layer_norm_backward(g, xhat, inv_std, weight, ndims, needs):
    compute = xhat.dtype
    if compute not in _COMPILED or not native(xhat, inv_std) or (
            weight is not None and weight.dtype != compute):
        return NotImplemented
    shape = g.shape[g.ndim - ndims:]
    d = math.prod(shape)
    if not d:
        return NotImplemented
    m = g.size // d
    need = tuple(needs) + (False,) * (3 - len(needs))
    gx = np.empty(g.shape, compute)
    gw = np.empty(shape, compute)
    gb = np.empty(shape, compute)
    _layer_norm_backward(_rows(g, compute, m, d), _rows(xhat, compute, m, d),
                         np.ascontiguousarray(inv_std).reshape(m), _weight(weight, d, compute),
                         need[0], gx.reshape(m, d), gw.reshape(d), gb.reshape(d))
    return gx if need[0] else None, gw if need[1] else None, gb if need[2] else None


@njit
def _channel_moments(x, mean_out, var_out, centered):
    """Per column of ``x`` (rows, C): the mean (float64 sums) rounded to x's dtype, the centered
    values (residue subtracted) into ``centered``, the biased variance (float64 sums)."""
    m, c = x.shape
    t = x.dtype.type
    acc = np.zeros(c)
    for r in range(m):
        for k in range(c):
            acc[k] += x[r, k]
    high = np.empty(c, x.dtype)
    residue = np.empty(c, x.dtype)
    for k in range(c):
        mean = acc[k] / m
        high[k] = t(mean)
        residue[k] = t(mean - high[k])
        acc[k] = 0.0
    for r in range(m):
        for k in range(c):
            value = (x[r, k] - high[k]) - residue[k]
            centered[r, k] = value
            acc[k] += value * value
    for k in range(c):
        mean_out[k] = high[k]
        var_out[k] = acc[k] / m


@njit
def _scale_shift(centered, inv_std, weight, bias, has_weight, has_bias, out):
    """``xhat = centered * inv_std`` in place, ``out = xhat * weight + bias`` per column."""
    m, c = centered.shape
    for r in range(m):
        for k in range(c):
            value = centered[r, k] * inv_std[k]
            centered[r, k] = value
            if has_weight:
                value = value * weight[k]
                if has_bias:
                    value = value + bias[k]
            elif has_bias:
                value = value + bias[k]
            out[r, k] = value


def batch_norm_forward(x, weight, bias, eps):
    compute = _compute_dtype(x, weight, bias)
    c = x.shape[-1]
    if compute is None or not x.size or any(p is not None and p.shape != (c,)
                                            for p in (weight, bias)):
        return NotImplemented
    m = x.size // c
    xc = _rows(x, compute, m, c)
    mean, var = np.empty(c, compute), np.empty(c, compute)
    xhat, out = np.empty(x.shape, compute), np.empty(x.shape, compute)
    _channel_moments(xc, mean, var, xhat.reshape(m, c))
    inv_std = (1.0 / np.sqrt(var + eps)).astype(compute, copy=False)  # (C values: NumPy's)
    if not inv_std.all():
        return NotImplemented
    dummy = np.zeros(1, compute)
    _scale_shift(xhat.reshape(m, c), inv_std, dummy if weight is None else weight,
                 dummy if bias is None else bias, weight is not None, bias is not None,
                 out.reshape(m, c))
    return out.astype(x.dtype, copy=False), xhat, inv_std, mean, var


@njit
def _batch_norm_backward(gy, xhat, scale, training, need_x, gx, sum_gy, sum_gy_xhat):
    m, c = gy.shape
    t = gy.dtype.type
    acc = np.zeros(c)
    acc_x = np.zeros(c)
    for r in range(m):
        for k in range(c):
            acc[k] += gy[r, k]
            acc_x[k] += gy[r, k] * xhat[r, k]
    for k in range(c):
        sum_gy[k] = acc[k]
        sum_gy_xhat[k] = acc_x[k]
    if not need_x:
        return
    count = t(m)
    for r in range(m):
        for k in range(c):
            if training:
                gx[r, k] = (gy[r, k] - ((xhat[r, k] * sum_gy_xhat[k] + sum_gy[k]) / count)) \
                    * scale[k]
            else:
                gx[r, k] = gy[r, k] * scale[k]


def batch_norm_backward(g, xhat, inv_std, weight, training, needs):
    compute = xhat.dtype
    c = g.shape[-1]
    if compute not in _COMPILED or not native(xhat) \
            or inv_std.dtype != compute or not g.size or (
            weight is not None and (weight.dtype != compute or weight.shape != (c,))):
        return NotImplemented
    m = g.size // c
    gy = _rows(g, compute, m, c)
    need = tuple(needs) + (False,) * (3 - len(needs))
    scale = inv_std if weight is None else inv_std * weight
    gx = np.empty(g.shape, compute)
    sum_gy, sum_gy_xhat = np.empty(c, compute), np.empty(c, compute)
    _batch_norm_backward(gy, _rows(xhat, compute, m, c), scale, bool(training), need[0],
                         gx.reshape(m, c), sum_gy, sum_gy_xhat)
    return (gx if need[0] else None, sum_gy_xhat if need[1] else None,
            sum_gy if need[2] else None)


@njit
def _group_sums(acc, groups, per_group):
    """Per channel: the float64 sum of its group's entries of ``acc`` (per-channel sums)."""
    for grp in range(groups):
        s = 0.0
        for k in range(grp * per_group, (grp + 1) * per_group):
            s += acc[k]
        for k in range(grp * per_group, (grp + 1) * per_group):
            acc[k] = s


@njit
def _position_sums(x, b, acc):
    """``acc[k]``: the float64 sum of sample ``b``'s channel ``k`` over its positions, four
    positions added together at a time (a channel's sums vectorise across the channels)."""
    p, c = x.shape[1], x.shape[2]
    for k in range(c):
        acc[k] = 0.0
    q = 0
    while q + 4 <= p:
        for k in range(c):
            acc[k] += (np.float64(x[b, q, k]) + np.float64(x[b, q + 1, k])) + (
                np.float64(x[b, q + 2, k]) + np.float64(x[b, q + 3, k]))
        q += 4
    while q < p:
        for k in range(c):
            acc[k] += x[b, q, k]
        q += 1


@njit
def _centered_square_sums(x, b, high, residue, acc):
    """``acc[k]``: the float64 sum over sample ``b``'s positions of channel ``k``'s centered
    values squared (each centered and squared in x's dtype), four positions at a time."""
    p, c = x.shape[1], x.shape[2]
    for k in range(c):
        acc[k] = 0.0
    q = 0
    while q + 4 <= p:
        for k in range(c):
            v0 = (x[b, q, k] - high[k]) - residue[k]
            v1 = (x[b, q + 1, k] - high[k]) - residue[k]
            v2 = (x[b, q + 2, k] - high[k]) - residue[k]
            v3 = (x[b, q + 3, k] - high[k]) - residue[k]
            acc[k] += (np.float64(v0 * v0) + np.float64(v1 * v1)) + (
                np.float64(v2 * v2) + np.float64(v3 * v3))
        q += 4
    while q < p:
        for k in range(c):
            v = (x[b, q, k] - high[k]) - residue[k]
            acc[k] += v * v
        q += 1


@njit
def _normalize_block(x, high, residue, inv, weight, bias, xhat, out):
    """One sample's (positions, channels) block: ``xhat`` (centered again, scaled), ``out``."""
    p, c = x.shape
    for q in range(p):
        for k in range(c):
            value = ((x[q, k] - high[k]) - residue[k]) * inv[k]
            xhat[q, k] = value
            out[q, k] = value * weight[k] + bias[k]


@njit
def _group_norm_forward(x, groups, eps, weight, bias, out, xhat, inv_std):
    # NOTE: per sample, two passes over its (positions, channels) block, which stays in cache:
    # the sums, the centered values' squares' sums; sums per channel over the positions first,
    # then over the group's channels (the reference's order of axes), in float64. Then one
    # sweep over all samples recentering and scaling (recomputing the centered values costs
    # less than storing and reloading them): measured 20% faster than finishing each sample
    # before the next (1.0 against 1.26 ms at (32, 1024, 64) float32).
    n, p, c = x.shape
    t = x.dtype.type
    per_group = c // groups
    count = p * per_group
    acc = np.empty(c)
    high = np.empty((n, c), x.dtype)
    residue = np.empty((n, c), x.dtype)
    inv = np.empty((n, c), x.dtype)
    for b in range(n):
        _position_sums(x, b, acc)
        _group_sums(acc, groups, per_group)
        for k in range(c):
            mean = acc[k] / count
            high[b, k] = t(mean)
            residue[b, k] = t(mean - high[b, k])
        _centered_square_sums(x, b, high[b], residue[b], acc)
        _group_sums(acc, groups, per_group)
        for k in range(c):
            inv[b, k] = t(1.0) / np.sqrt(t(acc[k] / count) + t(eps))
        for grp in range(groups):
            inv_std[b, grp] = inv[b, grp * per_group]
    for b in range(n):
        _normalize_block(x[b], high[b], residue[b], inv[b], weight, bias, xhat[b], out[b])


def group_norm_forward(x, weight, bias, groups, eps):
    compute = _compute_dtype(x, weight, bias)
    c = x.shape[-1]
    if compute is None or not x.size or any(p is not None and p.shape != (c,)
                                            for p in (weight, bias)):
        return NotImplemented
    n = x.shape[0]
    p = math.prod(x.shape[1:-1])
    out, xhat = np.empty(x.shape, compute), np.empty(x.shape, compute)
    inv_std = np.empty((n, 1, groups, 1), compute)
    _group_norm_forward(np.ascontiguousarray(x, dtype=compute).reshape(n, p, c), groups, eps,
                        _weight(weight, c, compute), _bias(bias, c, compute),
                        out.reshape(n, p, c), xhat.reshape(n, p, c), inv_std.reshape(n, groups))
    if not inv_std.all():
        return NotImplemented
    return out.astype(x.dtype, copy=False), xhat, inv_std


@njit
def _input_grad_block(gy, xhat, weight, mean_g, mean_gx, inv, gx):
    """One sample's (positions, channels) block of the input gradient."""
    p, c = gy.shape
    for q in range(p):
        for k in range(c):
            value = gy[q, k] * weight[k]
            gx[q, k] = ((value - mean_g[k]) - xhat[q, k] * mean_gx[k]) * inv[k]


@njit
def _group_norm_backward(gy, xhat, inv_std, groups, weight, need_x, gx, gw, gb):
    # NOTE: one pass over each sample's block for its per-channel float64 sums of gy and of
    # gy * xhat, which give the parameters' gradients (summed over the samples) and, times the
    # weight, the groups' sums of gy * weight and of gy * weight * xhat (PyTorch's
    # factoring; the reference multiplies before summing, the same up to the sums' rounding).
    # Then one sweep for the input gradient, as the forward.
    n, p, c = gy.shape
    t = gy.dtype.type
    per_group = c // groups
    count = t(p * per_group)
    acc_g = np.empty(c)
    acc_gx = np.empty(c)
    total_g = np.zeros(c)
    total_gx = np.zeros(c)
    mean_g = np.empty((n, c), gy.dtype)
    mean_gx = np.empty((n, c), gy.dtype)
    inv = np.empty((n, c), gy.dtype)
    for b in range(n):
        for k in range(c):
            acc_g[k] = 0.0
            acc_gx[k] = 0.0
        for q in range(p):
            for k in range(c):
                acc_g[k] += gy[b, q, k]
                acc_gx[k] += gy[b, q, k] * xhat[b, q, k]
        for k in range(c):
            total_g[k] += acc_g[k]
            total_gx[k] += acc_gx[k]
            acc_g[k] *= weight[k]
            acc_gx[k] *= weight[k]
        _group_sums(acc_g, groups, per_group)
        _group_sums(acc_gx, groups, per_group)
        for k in range(c):
            mean_g[b, k] = t(acc_g[k]) / count
            mean_gx[b, k] = t(acc_gx[k]) / count
            inv[b, k] = inv_std[b, k // per_group]
    for k in range(c):
        gw[k] = total_gx[k]
        gb[k] = total_g[k]
    if need_x:
        for b in range(n):
            _input_grad_block(gy[b], xhat[b], weight, mean_g[b], mean_gx[b], inv[b], gx[b])


def group_norm_backward(g, xhat, inv_std, weight, groups, needs):
    compute = xhat.dtype
    c = g.shape[-1]
    if compute not in _COMPILED or not native(xhat, inv_std) \
            or inv_std.dtype != compute or not g.size or (
            weight is not None and (weight.dtype != compute or weight.shape != (c,))):
        return NotImplemented
    n = g.shape[0]
    p = math.prod(g.shape[1:-1])
    need = tuple(needs) + (False,) * (3 - len(needs))
    gx = np.empty(g.shape, compute)
    gw, gb = np.empty(c, compute), np.empty(c, compute)
    _group_norm_backward(np.ascontiguousarray(g, dtype=compute).reshape(n, p, c),
                         np.ascontiguousarray(xhat).reshape(n, p, c),
                         np.ascontiguousarray(inv_std).reshape(n, groups), groups,
                         _weight(weight, c, compute), need[0], gx.reshape(n, p, c), gw, gb)
    out = g.dtype
    return (gx.astype(out, copy=False) if need[0] else None,
            gw.astype(out, copy=False) if need[1] else None,
            gb.astype(out, copy=False) if need[2] else None)
