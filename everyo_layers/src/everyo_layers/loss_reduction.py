"""How a loss reduces its per-element losses (``reduction="mean" | "sum" | "none"``) and how
its gradient is spread back over them: on arrays (the loss ops' forward and backward) and on
Tensors (their ``composite`` and ``backward_graph``, and the losses built from other ops).

``"mean"`` divides by ``count``: the number of elements, of targets not ignored, or the summed
class weights of those targets. When nothing is counted (every target is ``ignore_index``, a
padding-only batch) the loss is NaN (0 / 0) and its gradient is zero, as in PyTorch: no
gradient flows from a batch that holds nothing, so one such batch cannot poison the weights
(or, under data-parallel training, every rank's).
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, dispatch
from everyo.kernels import broadcast_tensor

REDUCTIONS = ("mean", "sum", "none")


def check_reduction(name: str, reduction: str) -> None:
    """Refuse a ``reduction`` other than "mean", "sum" and "none", naming the loss ``name``."""
    if reduction not in REDUCTIONS:
        raise EveryOError(f"{name}: reduction must be one of {REDUCTIONS}, got {reduction!r}")


def reduce_array(loss: np.ndarray, reduction: str, count) -> np.ndarray:
    """Per-element losses (an array) reduced; ``"mean"`` divides by ``count``."""
    if reduction == "none":
        return loss
    value = np.add.reduce(loss, axis=None)  # (loss.sum(): the same, through a Python wrapper)
    if reduction == "mean":
        if count:
            value = value / count
        else:  # (np.errstate costs microseconds: entered only for this 0 / 0)
            with np.errstate(invalid="ignore", divide="ignore"):  # nothing counted: nan, as
                value = value / count  # PyTorch
    return np.asarray(value, dtype=loss.dtype)


def spread_factor(g: np.ndarray, reduction: str, count) -> np.ndarray:
    """What each per-element loss's gradient is (``g`` itself for ``"none"``, else one value
    that broadcasts against them): :func:`spread_array` without the broadcast view."""
    if reduction == "mean":
        return g / count if count else np.zeros_like(g)  # nothing counted: no gradient
    return g


def spread_array(g: np.ndarray, reduction: str, count, shape: tuple) -> np.ndarray:
    """A loss's output gradient (an array) spread over its per-element losses of ``shape``."""
    if reduction == "none":
        return g
    return np.broadcast_to(spread_factor(g, reduction, count), shape)


def reduce_tensor(loss, reduction: str, count):
    """Per-element losses (a Tensor) reduced; ``"mean"`` divides by ``count``."""
    if reduction == "none":
        return loss
    total = dispatch("sum", loss)
    if reduction == "sum":
        return total
    if not count:
        # NOTE: NaN, as 0 / 0, but attached to ``total`` by a where that never picks it, so
        # its gradient (and every higher one) is zero rather than 0 * inf.
        return dispatch("where", np.zeros((), bool), total, np.nan)
    return total / float(count)


def spread_tensor(g, reduction: str, count, shape: tuple):
    """A loss op's output gradient (a Tensor) spread over its per-element losses of ``shape``."""
    if reduction == "none":
        return g
    if reduction == "mean":
        g = g / float(count) if count else g * 0.0  # nothing counted: no gradient
    return broadcast_tensor(g, shape)
