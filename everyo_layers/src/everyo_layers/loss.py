"""Losses: ``MSELoss``, ``L1Loss``, ``CrossEntropyLoss``, ``NLLLoss``, ``BCEWithLogitsLoss``, their
functional forms (``eo.cross_entropy``...) and the fused ops behind them.

Every loss computes in float32 at least (float16 input gives a float32 loss; float64 stays
float64) and takes ``reduction="mean" | "sum" | "none"``. The class axis is the LAST axis.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, Module, Op, dispatch
from everyo.ops.reduction import log_softmax_array
from everyo.ops.unary import stable_sigmoid

from everyo_layers.checks import array_of, check_float

REDUCTIONS = ("mean", "sum", "none")


def _compute_dtype(dtype) -> np.dtype:
    return np.promote_types(dtype, np.float32)


def _reduce(loss: np.ndarray, reduction: str, count) -> np.ndarray:
    if reduction == "none":
        return loss
    total = loss.sum()
    return np.asarray(total / count if reduction == "mean" else total, dtype=loss.dtype)


def _upstream(g: np.ndarray, reduction: str, count, shape: tuple) -> np.ndarray:
    """The incoming gradient spread over the per-element losses of ``shape``."""
    if reduction == "none":
        return g
    scale = g / count if reduction == "mean" else g
    return np.broadcast_to(scale, shape)


class _LossOp(Op):
    __slots__ = ("reduction", "count", "shape")


class CrossEntropyOp(_LossOp):
    """Softmax cross-entropy of ``logits`` (..., C) with class indices (...) or class
    probabilities (..., C); optional label smoothing and an ignored index."""

    def forward(self, logits, target=None, reduction="mean", label_smoothing=0.0,
                ignore_index=-100):
        z = logits.astype(_compute_dtype(logits.dtype), copy=False)
        logp = log_softmax_array(z, -1)
        classes = z.shape[-1]
        eps = label_smoothing
        if target.dtype.kind in "iu":
            kept = target != ignore_index
            safe = np.where(kept, target, 0)
            nll = -np.take_along_axis(logp, safe[..., None], -1)[..., 0]
            loss = (1 - eps) * nll - eps * logp.mean(axis=-1) if eps else nll
            loss = np.where(kept, loss, 0).astype(z.dtype, copy=False)
            count = np.count_nonzero(kept)
            self.saved = (logp, safe, kept)
        else:
            q = target.astype(z.dtype, copy=False)
            if eps:
                q = (1 - eps) * q + eps / classes
            loss = -(q * logp).sum(axis=-1)
            count = loss.size
            self.saved = (logp, q, None)
        self.reduction, self.count, self.shape = reduction, count, loss.shape
        with np.errstate(invalid="ignore", divide="ignore"):
            return _reduce(loss, reduction, count)

    def backward(self, g):
        logp, target, kept = self.saved
        up = _upstream(g, self.reduction, self.count, self.shape)[..., None]
        probs = np.exp(logp)
        if kept is None:  # probability targets
            grad = probs * target.sum(axis=-1, keepdims=True) - target
        else:
            eps = self._smoothing(logp.shape[-1], probs, target)
            grad = eps * kept[..., None]
        return ((grad * up).astype(g.dtype, copy=False),)

    def _smoothing(self, classes, probs, target):
        raise NotImplementedError  # replaced below; kept for readability of backward


def _cross_entropy_index_grad(op: CrossEntropyOp, classes: int, probs, target):
    """``softmax - smoothed one-hot`` for class-index targets."""
    eps = op.smoothing
    grad = probs - eps / classes if eps else probs.copy()
    np.put_along_axis(grad, target[..., None],
                      np.take_along_axis(grad, target[..., None], -1) - (1 - eps), -1)
    return grad
