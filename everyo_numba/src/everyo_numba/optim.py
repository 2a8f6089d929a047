"""SGD and Adam over a whole parameter group in ONE compiled call.

The reference (``everyo.optim_kernels``) makes 3-8 NumPy calls per parameter, each with its
own temporaries; for small models that per-parameter Python is most of an optimizer step. Here
the group's parameters arrive as one tuple of flat views, and one loop updates every element
in one pass (weight, gradient and buffers read once). The arithmetic is the reference's,
operation by operation, with the scalars converted to the parameters' dtype once, as NumPy
converts a Python float meeting a float32 array (a NumPy scalar, which NumPy would not
convert, leaves the call to the reference): the same bits.
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, njit

#: COMPILED_DTYPES as dtypes: ``dtype.name`` is Python code in NumPy (~1 us a read).
_COMPILED = frozenset(np.dtype(name) for name in COMPILED_DTYPES)


def _flat(arrays, dtype, like=None):
    """``arrays`` as a tuple of flat views, or None when one is not a writeable C-contiguous
    ``dtype`` array (no copy: the kernels write through these views; and Numba types a
    read-only array apart, so one read-only gradient among writeable ones is a typing error),
    or (``like``: the weights) not of its weight's shape."""
    flat = []
    for i, a in enumerate(arrays):
        if a.dtype != dtype or not a.flags.c_contiguous or not a.flags.writeable or (
                like is not None and a.shape != like[i].shape):
            return None
        flat.append(a.reshape(-1))
    return tuple(flat)


@njit
def _sgd(weights, grads, buffers, has_buffer, lr, momentum, dampening, nesterov, decay):
    for p in range(len(weights)):
        w, g, buf = weights[p], grads[p], buffers[p]
        t = w.dtype.type
        lr_, momentum_, keep, decay_ = t(lr), t(momentum), t(1 - dampening), t(decay)
        for i in range(w.size):
            step = g[i]
            if decay != 0.0:
                step = step + decay_ * w[i]
            if momentum != 0.0:
                b = buf[i] * momentum_ + keep * step if has_buffer[p] else step
                buf[i] = b
                step = step + momentum_ * b if nesterov else b
            w[i] = w[i] - lr_ * step


def _python_numbers(*values) -> bool:
    """True when every value is a Python int or float: NumPy then converts it to the array's
    dtype (a NumPy float64 scalar would widen the reference's arithmetic instead)."""
    for v in values:
        if type(v) not in _PYTHON_NUMBERS:
            return False
    return True


_PYTHON_NUMBERS = frozenset({int, float, bool})


#: ``has_buffer`` without momentum (not read then).
_NO_BUFFERS = np.zeros(0, np.bool_)


def sgd_step(weights, grads, buffers, lr, momentum, dampening, nesterov, weight_decay):
    dtype = weights[0].dtype if weights else None
    if dtype not in _COMPILED or not dtype.isnative or \
            not _python_numbers(lr, momentum, dampening, weight_decay):
        return NotImplemented
    flat_w, flat_g = _flat(weights, dtype), _flat(grads, dtype, like=weights)
    if flat_w is None or flat_g is None:
        return NotImplemented
    if momentum:
        fresh = [np.empty_like(w) if buf is None else buf for w, buf in zip(weights, buffers)]
        flat_b = _flat(fresh, dtype, like=weights)
        if flat_b is None:
            return NotImplemented
        has_buffer = np.array([buf is not None for buf in buffers], np.bool_)
    else:  # (the buffers are not read: the weights stand in for them)
        flat_b, has_buffer = flat_w, _NO_BUFFERS
    _sgd(flat_w, flat_g, flat_b, has_buffer, float(lr), float(momentum), float(dampening),
         bool(nesterov), float(weight_decay))
    return fresh if momentum else list(buffers)


@njit
def _adam(weights, grads, exp_avgs, exp_avg_sqs, maxima, amsgrad, step_sizes, corrections,
          lr, beta1, beta2, eps, decay, decoupled):
    for p in range(len(weights)):
        w, g, m, v, top = weights[p], grads[p], exp_avgs[p], exp_avg_sqs[p], maxima[p]
        t = w.dtype.type
        b1, b2, keep1, keep2 = t(beta1), t(beta2), t(1 - beta1), t(1 - beta2)
        shrink, decay_ = t(1 - lr * decay), t(decay)
        step_size, correction = t(step_sizes[p]), corrections[p]
        for i in range(w.size):
            wi, gi = w[i], g[i]
            if decay != 0.0:
                if decoupled:
                    wi = wi * shrink
                else:
                    gi = gi + decay_ * wi
            mi = m[i] * b1 + keep1 * gi
            vi = v[i] * b2 + keep2 * (gi * gi)
            m[i], v[i] = mi, vi
            if amsgrad:
                if top[i] > vi or top[i] != top[i]:  # np.maximum(top, v): a NaN wins
                    vi = top[i]
                top[i] = vi
            # NOTE: the reference's denominator is float64 (sqrt(v) over a NumPy float64
            # scalar), its quotient rounded to the weight's dtype once.
            denominator = np.float64(np.sqrt(vi)) / correction + eps
            w[i] = wi - t(np.float64(step_size * mi) / denominator)


def adam_step(weights, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs, steps, lr, beta1, beta2,
              eps, weight_decay, decoupled):
    dtype = weights[0].dtype if weights else None
    if dtype not in _COMPILED or not dtype.isnative or not _python_numbers(
            lr, beta1, beta2, eps, weight_decay):
        return NotImplemented
    amsgrad = max_exp_avg_sqs is not None
    groups = [_flat(arrays, dtype, like=weights) for arrays in (
        weights, grads, exp_avgs, exp_avg_sqs, max_exp_avg_sqs if amsgrad else exp_avgs)]
    if any(g is None for g in groups):
        return NotImplemented
    # NOTE: per parameter, the Python scalars the reference computes (its own step count).
    step_sizes = np.array([lr / (1 - beta1 ** t) for t in steps])
    corrections = np.array([np.sqrt(1 - beta2 ** t) for t in steps])
    _adam(*groups, amsgrad, step_sizes, corrections, float(lr), float(beta1), float(beta2),
          float(eps), float(weight_decay), bool(decoupled))
    return None
