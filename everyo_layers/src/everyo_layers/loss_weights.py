"""Per-class weights of ``cross_entropy``/``nll_loss`` and per-element weights of
``binary_cross_entropy_with_logits``, with PyTorch's reductions.

The weighted losses are built from the unweighted ops' per-element losses (reduction "none")
and core ops, so they differentiate (to any order) wherever the ops do:

- class indices: each sample's loss times ``weight[target]``; ``"mean"`` divides by the sum of
  those weights over the targets not ignored. Label smoothing's uniform part weighs each class
  by its own weight: ``-(eps / C) * sum_c weight[c] * log p[c]``.
- class probabilities: ``-sum_c weight[c] * q[c] * log p[c]``; ``"mean"`` divides by the number
  of samples.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, dispatch
from everyo_layers.checks import check_float
from everyo_layers.loss_reduction import reduce_tensor


def class_weights(name: str, weight, classes: int, dtype) -> np.ndarray:
    """``weight`` as a float array of one entry per class, or an error naming ``name``."""
    w = check_float(f"{name} (weight)", weight)
    if w.shape != (classes,):
        raise EveryOError(f"{name}: weight must have one entry per class, shape ({classes},), "
                          f"got {w.shape}")
    return w.astype(dtype, copy=False)


def weighted_class_loss(op: str, input, target: np.ndarray, weight: np.ndarray, reduction: str,
                        ignore_index: int, label_smoothing: float = 0.0):
    """``op`` ("cross_entropy" or "nll_loss") with per-class ``weight``; see the module doc."""
    compute = np.result_type(input.dtype, np.float32)
    w = weight.astype(compute, copy=False)
    if target.dtype.kind == "f":  # class probabilities, smoothed before weighing
        eps = label_smoothing
        q = (1 - eps) * target + eps / input.shape[-1] if eps else target
        per = dispatch(op, input, target=q * w, reduction="none")
        return reduce_tensor(per, reduction, per.size)
    kept = target != ignore_index
    w_target = np.where(kept, w[np.where(kept, target, 0)], 0).astype(compute)
    plain = dispatch(op, input, target=target, reduction="none", ignore_index=ignore_index)
    per = plain * w_target
    if label_smoothing:
        uniform = np.broadcast_to(w / input.shape[-1], input.shape)
        smooth = dispatch(op, input, target=np.ascontiguousarray(uniform), reduction="none")
        per = (1 - label_smoothing) * per + label_smoothing * (smooth * kept.astype(compute))
    return reduce_tensor(per, reduction, w_target.sum())


def weighted_elementwise_loss(op: str, input, target, weight: np.ndarray, reduction: str,
                              **attrs):
    """An elementwise loss times ``weight`` (broadcast to the input), then reduced; ``"mean"``
    divides by the number of elements (PyTorch's rule)."""
    per = dispatch(op, input, target, reduction="none", **attrs) * weight
    return reduce_tensor(per, reduction, per.size)
