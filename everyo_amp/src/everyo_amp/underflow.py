"""Counting gradient elements that are exactly zero: the symptom of float16 underflow."""

from __future__ import annotations

from typing import NamedTuple

import numpy as np

from everyo import EveryOError, Tensor


class ZeroCount(NamedTuple):
    """How many gradient elements are exactly zero (``flushed``) out of ``total``."""

    flushed: int
    total: int

    def __str__(self) -> str:
        return f"{self.flushed} / {self.total}"


def flushed_to_zero(params_or_grads) -> ZeroCount:
    """Count gradient elements that are exactly zero.

    After a backward pass in float16, a gradient below float16's smallest subnormal (~6e-8)
    rounds to zero; a float32 parameter then receives an exact 0. Comparing this count with and
    without a ``GradScaler`` shows how many gradients the scaler rescued.

    Args:
        params_or_grads: tensors whose ``.grad`` to inspect (e.g. ``model.parameters()``) or
            gradient arrays.

    Returns:
        ``ZeroCount(flushed, total)``.

    Example:
        >>> import everyo as eo, everyo_amp
        >>> w = eo.Parameter([1.0, 2.0, 3.0])
        >>> w.grad = eo.tensor([0.0, 1e-3, 0.0]).data
        >>> everyo_amp.flushed_to_zero([w])
        ZeroCount(flushed=2, total=3)
    """
    flushed = total = 0
    for position, item in enumerate(params_or_grads):
        if isinstance(item, Tensor):
            grad = item.grad
            if grad is None:
                raise EveryOError(f"flushed_to_zero: tensor {position} (shape {item.shape}) has "
                                  f"no gradient; call backward() first")
        else:
            grad = np.asarray(item)
        flushed += int(grad.size - np.count_nonzero(grad))
        total += int(grad.size)
    return ZeroCount(flushed, total)
