"""LayerNorm, BatchNorm and GroupNorm in two passes for the statistics and one for the output
(forward), one for the sums and one for the input's gradient (backward).

The reference (``everyo_layers.norm_kernels``) makes one NumPy pass per elementwise operation.
These loops keep its rules: 16-bit input computed in float32, the mean and variance summed in
float64 with the float32 mean's rounding residue subtracted, the same elementwise operations
in the same order. Sums are formed in float64 here (the reference sums gradients in the
computation dtype), so results agree to within the reference's own rounding of those sums.
"""

from __future__ import annotations

import math

import numpy as np

from everyo_numba.jit import native, njit

_COMPUTE = {"float16": np.float32, "bfloat16": np.float32, "float32": np.float32,
            "float64": np.float64}


def _compute_dtype(*arrays):
    """The loops' dtype for these operands (None: leave the call to the reference): every
    operand's dtype maps to one compute dtype, and parameters already have it."""
    x = arrays[0]
    compute = _COMPUTE.get(x.dtype.name)
    if compute is None:
        return None
    for a in arrays[1:]:
        if a is not None and a.dtype != compute:
            return None
    return compute


def _rows(a, compute, rows, cols):
    return np.ascontiguousarray(a, dtype=compute).reshape(rows, cols)


@njit
def _row_mean_f64(x, r, square):
    """The float64 mean of row ``r`` of ``x`` (``square``: of its squares, each squared in x's
    dtype as the reference's ``np.square``)."""
    # NOTE: four float64 partial sums, combined in a fixed order: not the reference's pairwise
    # order, but deterministic, and four times shorter a dependency chain.
    d = x.shape[1]
    s0 = s1 = s2 = s3 = 0.0
    k = 0
    while k + 4 <= d:
        a, b, c, e = x[r, k], x[r, k + 1], x[r, k + 2], x[r, k + 3]
        if square:
            a, b, c, e = a * a, b * b, c * c, e * e
        s0 += a
        s1 += b
        s2 += c
        s3 += e
        k += 4
    while k < d:
        a = x[r, k]
        s0 += a * a if square else a
        k += 1
    return ((s0 + s1) + (s2 + s3)) / d


@njit
def _layer_norm_forward(x, weight, bias, eps, has_weight, has_bias, out, xhat, inv_std):
    m, d = x.shape
    t = x.dtype.type
    for r in range(m):
        mean = _row_mean_f64(x, r, False)
        high = t(mean)
        residue = t(mean - high)
        for k in range(d):
            xhat[r, k] = (x[r, k] - high) - residue
        var = t(_row_mean_f64(xhat, r, True))
        inv = t(1.0) / np.sqrt(var + t(eps))
        inv_std[r] = inv
        for k in range(d):
            value = xhat[r, k] * inv
            xhat[r, k] = value
            if has_weight:
                value = value * weight[k]
                if has_bias:
                    value = value + bias[k]
            elif has_bias:
                value = value + bias[k]
            out[r, k] = value


def layer_norm_forward(x, weight, bias, ndims, eps):
    compute = _compute_dtype(x, weight, bias)
    shape = x.shape[x.ndim - ndims:]
    d = math.prod(shape)
    if compute is None or not d or any(p is not None and p.shape != shape
                                       for p in (weight, bias)):
        return NotImplemented
    m = x.size // d
    xc = _rows(x, compute, m, d)
    out = np.empty((m, d), compute)
    xhat = np.empty((m, d), compute)
    inv_std = np.empty(m, compute)
    dummy = np.zeros(1, compute)
    _layer_norm_forward(xc, dummy if weight is None else weight.reshape(d),
                        dummy if bias is None else bias.reshape(d), eps,
                        weight is not None, bias is not None, out, xhat, inv_std)
    kept = x.shape[:x.ndim - ndims] + (1,) * ndims
    return (out.reshape(x.shape).astype(x.dtype, copy=False), xhat.reshape(x.shape),
            inv_std.reshape(kept))


@njit
def _layer_norm_backward(gy, xhat, inv_std, weight, has_weight, need_x, need_w, need_b,
                         gx, gw, gb):
    m, d = gy.shape
    t = gy.dtype.type
    acc_w = np.zeros(d)
    acc_b = np.zeros(d)
    for r in range(m):
        if need_x:
            s_g = 0.0
            s_gx = 0.0
            for k in range(d):
                gk = gy[r, k] * weight[k] if has_weight else gy[r, k]
                s_g += gk
                s_gx += gk * xhat[r, k]
            mean_g = t(s_g / d)
            mean_gx = t(s_gx / d)
            inv = inv_std[r]
            for k in range(d):
                gk = gy[r, k] * weight[k] if has_weight else gy[r, k]
                gx[r, k] = ((gk - mean_g) - xhat[r, k] * mean_gx) * inv
        if need_w:
            for k in range(d):
                acc_w[k] += gy[r, k] * xhat[r, k]
        if need_b:
            for k in range(d):
                acc_b[k] += gy[r, k]
    for k in range(d):
        gw[k] = acc_w[k]
        gb[k] = acc_b[k]


def layer_norm_backward(g, xhat, inv_std, weight, ndims, needs):
    compute = xhat.dtype
    if compute.name not in ("float32", "float64") or not native(xhat, inv_std) or (
            weight is not None and weight.dtype != compute):
        return NotImplemented
    shape = g.shape[g.ndim - ndims:]
    d = math.prod(shape)
    if not d:
        return NotImplemented
    m = g.size // d
    gy = _rows(g, compute, m, d)
    need = tuple(needs) + (False,) * (3 - len(needs))
    gx = np.empty((m, d), compute)
    gw = np.empty(d, compute)
    gb = np.empty(d, compute)
    w = np.zeros(1, compute) if weight is None else np.ascontiguousarray(weight).reshape(d)
    _layer_norm_backward(gy, _rows(xhat, compute, m, d), inv_std.reshape(m), w,
                         weight is not None, need[0], need[1], need[2], gx, gw, gb)
    return (gx.reshape(g.shape) if need[0] else None, gw.reshape(shape) if need[1] else None,
            gb.reshape(shape) if need[2] else None)


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
    xhat, out = np.empty((m, c), compute), np.empty((m, c), compute)
    _channel_moments(xc, mean, var, xhat)
    inv_std = (1.0 / np.sqrt(var + eps)).astype(compute, copy=False)  # (C values: NumPy's)
    dummy = np.zeros(1, compute)
    _scale_shift(xhat, inv_std, dummy if weight is None else weight,
                 dummy if bias is None else bias, weight is not None, bias is not None, out)
    return (out.reshape(x.shape).astype(x.dtype, copy=False), xhat.reshape(x.shape), inv_std,
            mean, var)


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
    if compute.name not in ("float32", "float64") or not native(xhat) \
            or inv_std.dtype != compute or not g.size or (
            weight is not None and (weight.dtype != compute or weight.shape != (c,))):
        return NotImplemented
    m = g.size // c
    gy = _rows(g, compute, m, c)
    need = tuple(needs) + (False,) * (3 - len(needs))
    scale = inv_std if weight is None else inv_std * weight
    gx = np.empty((m, c), compute)
    sum_gy, sum_gy_xhat = np.empty(c, compute), np.empty(c, compute)
    _batch_norm_backward(gy, _rows(xhat, compute, m, c), scale, bool(training), need[0], gx,
                         sum_gy, sum_gy_xhat)
    return (gx.reshape(g.shape) if need[0] else None, sum_gy_xhat if need[1] else None,
            sum_gy if need[2] else None)


@njit
def _group_means(acc, groups, count, t, high, residue):
    """Per channel: its group's mean (from per-channel float64 sums ``acc``) rounded to ``t``,
    and the rounding residue."""
    per = acc.shape[0] // groups
    for grp in range(groups):
        s = 0.0
        for k in range(grp * per, (grp + 1) * per):
            s += acc[k]
        mean = s / count
        for k in range(grp * per, (grp + 1) * per):
            high[k] = t(mean)
            residue[k] = t(mean - t(mean))


@njit
def _group_norm_forward(x, groups, eps, weight, bias, has_weight, has_bias, out, xhat,
                        inv_std):
    # NOTE: per sample, three passes over its (positions, channels) block, which stays in
    # cache: the sums, the centered values with their squares' sums, the output. Sums per
    # channel over the positions first, then over the group's channels (the reference's order
    # of axes), in float64.
    n, p, c = x.shape
    t = x.dtype.type
    per = c // groups
    count = p * per
    acc = np.zeros(c)
    high = np.empty(c, x.dtype)
    residue = np.empty(c, x.dtype)
    inv = np.empty(c, x.dtype)
    for b in range(n):
        acc[:] = 0.0
        for q in range(p):
            for k in range(c):
                acc[k] += x[b, q, k]
        _group_means(acc, groups, count, t, high, residue)
        acc[:] = 0.0
        for q in range(p):
            for k in range(c):
                value = (x[b, q, k] - high[k]) - residue[k]
                xhat[b, q, k] = value
                acc[k] += value * value
        for grp in range(groups):
            s = 0.0
            for k in range(grp * per, (grp + 1) * per):
                s += acc[k]
            value = t(1.0) / np.sqrt(t(s / count) + t(eps))
            inv_std[b, grp] = value
            for k in range(grp * per, (grp + 1) * per):
                inv[k] = value
        for q in range(p):
            for k in range(c):
                value = xhat[b, q, k] * inv[k]
                xhat[b, q, k] = value
                if has_weight:
                    value = value * weight[k]
                if has_bias:
                    value = value + bias[k]
                out[b, q, k] = value


def group_norm_forward(x, weight, bias, groups, eps):
    compute = _compute_dtype(x, weight, bias)
    c = x.shape[-1]
    if compute is None or not x.size or any(p is not None and p.shape != (c,)
                                            for p in (weight, bias)):
        return NotImplemented
    n = x.shape[0]
    p = math.prod(x.shape[1:-1])
    xc = np.ascontiguousarray(x, dtype=compute).reshape(n, p, c)
    out, xhat = np.empty((n, p, c), compute), np.empty((n, p, c), compute)
    inv_std = np.empty((n, groups), compute)
    dummy = np.zeros(1, compute)
    _group_norm_forward(xc, groups, eps, dummy if weight is None else weight,
                        dummy if bias is None else bias, weight is not None, bias is not None,
                        out, xhat, inv_std)
    return (out.reshape(x.shape).astype(x.dtype, copy=False), xhat.reshape(x.shape),
            inv_std.reshape(n, 1, groups, 1))


@njit
def _group_norm_backward(gy, xhat, inv_std, groups, weight, has_weight, need_x, gx, gw, gb):
    n, p, c = gy.shape
    t = gy.dtype.type
    per = c // groups
    count = t(p * per)
    acc_w = np.zeros(c)
    acc_b = np.zeros(c)
    acc_g = np.zeros(c)
    acc_gx = np.zeros(c)
    mean_g = np.empty(c, gy.dtype)
    mean_gx = np.empty(c, gy.dtype)
    inv = np.empty(c, gy.dtype)
    for b in range(n):
        acc_g[:] = 0.0
        acc_gx[:] = 0.0
        for q in range(p):
            for k in range(c):
                gk = gy[b, q, k] * weight[k] if has_weight else gy[b, q, k]
                acc_g[k] += gk
                acc_gx[k] += gk * xhat[b, q, k]
                acc_w[k] += gy[b, q, k] * xhat[b, q, k]
                acc_b[k] += gy[b, q, k]
        if not need_x:
            continue
        for grp in range(groups):
            s_g = 0.0
            s_gx = 0.0
            for k in range(grp * per, (grp + 1) * per):
                s_g += acc_g[k]
                s_gx += acc_gx[k]
            for k in range(grp * per, (grp + 1) * per):
                mean_g[k] = t(s_g) / count
                mean_gx[k] = t(s_gx) / count
                inv[k] = inv_std[b, grp]
        for q in range(p):
            for k in range(c):
                gk = gy[b, q, k] * weight[k] if has_weight else gy[b, q, k]
                gx[b, q, k] = ((gk - mean_g[k]) - xhat[b, q, k] * mean_gx[k]) * inv[k]
    for k in range(c):
        gw[k] = acc_w[k]
        gb[k] = acc_b[k]


def group_norm_backward(g, xhat, inv_std, weight, groups, needs):
    compute = xhat.dtype
    c = g.shape[-1]
    if compute.name not in ("float32", "float64") or not native(xhat) \
            or inv_std.dtype != compute or not g.size or (
            weight is not None and (weight.dtype != compute or weight.shape != (c,))):
        return NotImplemented
    n = g.shape[0]
    p = math.prod(g.shape[1:-1])
    gy = np.ascontiguousarray(g, dtype=compute).reshape(n, p, c)
    need = tuple(needs) + (False,) * (3 - len(needs))
    gx = np.empty((n, p, c), compute)
    gw, gb = np.empty(c, compute), np.empty(c, compute)
    w = np.zeros(1, compute) if weight is None else weight
    _group_norm_backward(gy, np.ascontiguousarray(xhat).reshape(n, p, c),
                         inv_std.reshape(n, groups), groups, w, weight is not None, need[0],
                         gx, gw, gb)
    out = g.dtype
    return (gx.reshape(g.shape).astype(out, copy=False) if need[0] else None,
            gw.astype(out, copy=False) if need[1] else None,
            gb.astype(out, copy=False) if need[2] else None)
