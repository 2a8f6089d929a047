"""How a loss reduces its per-element losses (``reduction="mean" | "sum" | "none"``) and how
its gradient is spread back over them: on arrays (the loss ops' forward and backward) and on
Tensors (their ``composite`` and ``backward_graph``, and the losses built from other ops).

``"mean"`` divides by ``count``: the number of elements, of targets not ignored, or the summed
class weights of those targets.
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
    total = loss.sum()
    with np.errstate(invalid="ignore", divide="ignore"):  # nothing counted: nan, as PyTorch
        value = total / count if reduction == "mean" else total
    return np.asarray(value, dtype=loss.dtype)


def spread_array(g: np.ndarray, reduction: str, count, shape: tuple) -> np.ndarray:
    """A loss's output gradient (an array) spread over its per-element losses of ``shape``."""
    if reduction == "none":
        return g
    return np.broadcast_to(g / count if reduction == "mean" else g, shape)


def reduce_tensor(loss, reduction: str, count):
    """Per-element losses (a Tensor) reduced; ``"mean"`` divides by ``count``."""
    if reduction == "none":
        return loss
    total = dispatch("sum", loss)
    if reduction == "sum":
        return total
    with np.errstate(invalid="ignore", divide="ignore"):  # nothing counted: nan, as PyTorch
        return total / float(count)


def spread_tensor(g, reduction: str, count, shape: tuple):
    """A loss op's output gradient (a Tensor) spread over its per-element losses of ``shape``."""
    if reduction == "none":
        return g
    return broadcast_tensor(g / float(count) if reduction == "mean" else g, shape)
