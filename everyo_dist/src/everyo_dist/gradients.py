"""``average_gradients``: the one line a data-parallel training loop adds."""

from __future__ import annotations

import numpy as np

from everyo_dist.errors import DistributedError


def average_gradients(params, group) -> None:
    """Replace every parameter's gradient by its mean over the ranks of ``group``.

    The gradients of each dtype travel in one flattened buffer through one ``all_reduce_mean``
    (reduced in float64 and rounded once to that dtype, as DistributedDataParallel's buckets
    are), so the cost is one collective per dtype and step whatever the number of
    parameters. A
    parameter whose ``.grad`` is None contributes zeros and receives the average, so every rank
    ends with the same gradients even when a branch of the model was unused on some rank.
    Every rank must pass the same parameters in the same order.

    Args:
        params: the parameters (e.g. ``model.parameters()``), in the same order on every rank.
        group: the :class:`~everyo_dist.group.ProcessGroup` the worker received.

    Example:
        >>> import everyo as eo
        >>> from everyo.distributed import average_gradients, init
        >>> w = eo.Parameter([1.0, 2.0]); w.grad = np.float32([0.5, 1.0])
        >>> with init(backend="shm", rank=0, world_size=1) as group:
        ...     average_gradients([w], group)
        >>> w.grad
        array([0.5, 1. ], dtype=float32)
    """
    params = list(params)
    for index, param in enumerate(params):
        if not hasattr(param, "grad") or not hasattr(param, "data"):
            raise DistributedError(f"average_gradients: item {index} is a "
                                   f"{type(param).__name__}, not a parameter")
        if param.grad is not None and param.grad.shape != param.data.shape:
            raise DistributedError(f"average_gradients: a parameter of shape "
                                   f"{param.data.shape} has a gradient of shape "
                                   f"{param.grad.shape}")
    by_dtype: dict[np.dtype, list] = {}  # first appearance order: the same on every rank
    for param in params:
        target = param.data.dtype if param.grad is None else param.grad.dtype
        by_dtype.setdefault(np.dtype(target), []).append(param)
    for dtype, same in by_dtype.items():
        _average_one_dtype(same, dtype, group)


def _average_one_dtype(params: list, dtype: np.dtype, group) -> None:
    """One flat vector of ``dtype``, one ``all_reduce_mean``, the averages written back."""
    # NOTE: process groups have no bfloat16 collectives; its values are exact in float64,
    # whose mean rounded once to bfloat16 has the canonical reduction's bits (4x the bytes)
    carrier = np.dtype(np.float64) if dtype.name == "bfloat16" else dtype
    sizes = [p.data.size for p in params]
    flat = np.zeros(sum(sizes), dtype=carrier)
    offset = 0
    for param, size in zip(params, sizes):
        if param.grad is not None:
            flat[offset:offset + size] = param.grad.reshape(-1)
        offset += size
    # NOTE: not out=flat: a backend may let peers read this rank's input after it returns
    averaged = group.all_reduce_mean(flat).astype(dtype, copy=False)
    offset = 0
    for param, size in zip(params, sizes):
        # views into one fresh buffer: no copy
        param.grad = averaged[offset:offset + size].reshape(param.data.shape)
        offset += size
