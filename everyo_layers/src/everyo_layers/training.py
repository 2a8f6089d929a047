"""Training utilities: ``clip_grad_norm_`` (the learning-rate schedulers are in
``schedulers.py`` and ``schedulers_composite.py``)."""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Tensor
from everyo_layers.precision import accumulation_dtype


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Scale the gradients of ``parameters`` in place so that their joint norm is at most
    ``max_norm``.

    Args:
        parameters: an iterable of tensors (e.g. ``model.parameters()``) or one tensor;
            those without a gradient are skipped.
        max_norm: the largest allowed norm.
        norm_type: the p of the p-norm (``float("inf")`` for the max-norm).
        error_if_nonfinite: raise if the total norm is nan or inf.

    Returns:
        The total norm of the gradients before clipping, as a Python float.

    Example:
        >>> import everyo as eo, numpy as np
        >>> w = eo.Parameter(np.zeros(2, np.float32))
        >>> w.grad = np.array([3.0, 4.0], np.float32)
        >>> eo.clip_grad_norm_([w], max_norm=1.0)
        5.0
        >>> w.grad.round(4)
        array([0.6, 0.8], dtype=float32)
    """
    if isinstance(parameters, Tensor):
        parameters = [parameters]
    grads = [p.grad for p in parameters if p.grad is not None]
    if not grads:
        return 0.0
    norm_type = float(norm_type)
    # NOTE: float16 gradients are measured in float32: their squares overflow at 256.
    flat = [g.reshape(-1).astype(accumulation_dtype(g.dtype), copy=False)
            for g in grads]
    if math.isinf(norm_type):
        # NOTE: np.max, not Python's max: max(2.0, nan) is 2.0, which hid a NaN gradient
        # that is not in the first tensor (PyTorch's norm is NaN then)
        total = float(np.max([np.max(np.abs(f)) if f.size else 0.0 for f in flat]))
    elif norm_type == 2.0:
        total = math.sqrt(sum(float(np.dot(f, f)) for f in flat))
    else:
        total = sum(float(np.sum(np.abs(f) ** norm_type)) for f in flat) ** (1.0 / norm_type)
    if error_if_nonfinite and not math.isfinite(total):
        raise EveryOError(f"clip_grad_norm_: the total gradient norm is {total}; pass "
                          f"error_if_nonfinite=False to clip anyway")
    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:  # a NaN norm scales by NaN, as PyTorch does: the step shows it
        for g in grads:
            g *= g.dtype.type(coef)
    return total


OPS: dict = {}
LAYERS = {"clip_grad_norm_": clip_grad_norm_}
