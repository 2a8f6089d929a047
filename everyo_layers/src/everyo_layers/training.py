"""Training utilities: ``clip_grad_norm_`` (the learning-rate schedulers are in the core,
beside the optimizers: ``everyo/lr_scheduler.py``)."""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Tensor, applied_in_backward
from everyo.validation import checked_gradients
from everyo_layers.precision import accumulation_dtype


def clip_grad_norm_(parameters, max_norm: float, norm_type: float = 2.0,
                    error_if_nonfinite: bool = False) -> float:
    """Scale the gradients of ``parameters`` in place so that their joint norm is at most
    ``max_norm``.

    Args:
        parameters: an iterable of tensors (e.g. ``model.parameters()``) or one tensor;
            those without a gradient are skipped.
        max_norm: the largest allowed norm.
        norm_type: the p of the p-norm (``float("inf")`` for the max-norm). As in PyTorch,
            the total is the p-norm of the parameters' own p-norms, which for p > 0 is the
            p-norm of all gradients together; p = 0 counts the parameters whose gradient is
            not all zeros, p < 0 and ``-inf`` are 0 once one element is 0. Matrix norms
            ("fro", "nuc") are refused: the default 2-norm is the Frobenius norm of all
            gradients together.
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
    parameters = [parameters] if isinstance(parameters, Tensor) else list(parameters)
    p = _check_norm_type(norm_type)
    if isinstance(max_norm, (bool, np.bool_)) or not isinstance(
            max_norm, (int, float, np.integer, np.floating)) or not max_norm >= 0:
        raise EveryOError(f"clip_grad_norm_: max_norm must be a non-negative number "
                          f"(float('inf') only measures the norm), got {max_norm!r}")
    applied = applied_in_backward(parameters)
    if applied:
        raise EveryOError(f"clip_grad_norm_: the gradients of {len(applied)} parameter(s) "
                          f"(shapes {[a.shape for a in applied[:3]]}...) were already applied "
                          f"by the optimizer DistributedDataParallel(optimizer=) steps inside "
                          f"backward, so clipping them now would change nothing; to clip, "
                          f"build the wrapper without optimizer= and call optimizer.step() "
                          f"after clip_grad_norm_")
    grads = checked_gradients("clip_grad_norm_", [param for param in parameters
                                                  if param.grad is not None], writable=True)
    if not grads:
        return 0.0
    # NOTE: float16 gradients are measured in float32: their squares overflow at 256.
    flat = [g.reshape(-1).astype(accumulation_dtype(g.dtype), copy=False)
            for g in grads]
    total = _total_norm(flat, p)
    if error_if_nonfinite and not math.isfinite(total):
        raise EveryOError(f"clip_grad_norm_: the total gradient norm is {total}; pass "
                          f"error_if_nonfinite=False to clip anyway")
    coef = max_norm / (total + 1e-6)
    if not coef >= 1.0:  # a NaN norm scales by NaN, as PyTorch does: the step shows it
        for g in grads:
            g *= g.dtype.type(coef)
    return total


def _check_norm_type(norm_type) -> float:
    """``norm_type`` as the float p of a p-norm, or an error naming what it is."""
    if isinstance(norm_type, str) and norm_type.lower() in ("fro", "nuc"):
        raise EveryOError(f"clip_grad_norm_: norm_type={norm_type!r} is a matrix norm, which "
                          f"has no meaning over many gradients (PyTorch refuses it too); "
                          f"norm_type=2, the default, is the Frobenius norm of all the "
                          f"gradients together")
    try:
        p = float(norm_type)  # as PyTorch: 2, 2.0, "2", "inf" and True (1) are p-norms
    except (TypeError, ValueError):
        p = math.nan
    if math.isnan(p):
        raise EveryOError(f"clip_grad_norm_: norm_type must be a number (the p of a p-norm, "
                          f"or inf), got {norm_type!r}")
    return p


def _total_norm(flat: list, p: float) -> float:
    """The p-norm of the per-gradient p-norms (PyTorch's), on flattened gradients."""
    if p == math.inf:
        # NOTE: np.max, not Python's max: max(2.0, nan) is 2.0, which hid a NaN gradient
        # that is not in the first tensor (PyTorch's norm is NaN then)
        return float(np.max([np.max(np.abs(f)) if f.size else 0.0 for f in flat]))
    if p == 2.0:
        return math.sqrt(sum(float(np.dot(f, f)) for f in flat))
    if p > 0:  # the norm of the norms is the norm of everything together
        return sum(float(np.sum(np.abs(f) ** p)) for f in flat) ** (1.0 / p)
    if p < 0:
        empty = next((f for f in flat if not f.size), None)
        if empty is not None:
            raise EveryOError(f"clip_grad_norm_: there is no {p} norm of an empty gradient "
                              f"(shape {empty.shape}), as there is no minimum of nothing")
    return float(_vector_norm(np.array([_vector_norm(f, p) for f in flat]), p))


def _vector_norm(values: np.ndarray, p: float):
    """``torch.linalg.vector_norm(values, p)`` for p <= 0: p = 0 counts the nonzero entries,
    ``-inf`` is the smallest magnitude, other p < 0 is 0 as soon as one entry is 0."""
    magnitudes = np.abs(values)
    if p == 0:
        return np.count_nonzero(magnitudes)
    if p == -math.inf:
        return magnitudes.min()
    with np.errstate(divide="ignore"):  # |0| ** p is inf, so the norm is 0
        return np.sum(magnitudes ** p) ** (1.0 / p)


OPS: dict = {}
LAYERS = {"clip_grad_norm_": clip_grad_norm_}
