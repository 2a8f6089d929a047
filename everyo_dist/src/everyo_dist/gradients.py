"""``average_gradients``: the one line a data-parallel training loop adds."""

from __future__ import annotations

import numpy as np

from everyo_dist.errors import DistributedError


def average_gradients(params, group) -> None:
    """Replace every parameter's gradient by its mean over the ranks of ``group``.

    All gradients travel in one flattened buffer through one ``all_reduce_mean`` (reduced in
    float64), so the cost is one collective per step whatever the number of parameters. A
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
    if not params:
        return
    for index, param in enumerate(params):
        if not hasattr(param, "grad") or not hasattr(param, "data"):
            raise DistributedError(f"average_gradients: item {index} is a "
                                   f"{type(param).__name__}, not a parameter")
    sizes = [p.data.size for p in params]
    targets = [p.data.dtype if p.grad is None else p.grad.dtype for p in params]
    flat = np.zeros(sum(sizes), dtype=np.result_type(*targets))
    offset = 0
    for param, size in zip(params, sizes):
        if param.grad is not None:
            if param.grad.shape != param.data.shape:
                raise DistributedError(f"average_gradients: a parameter of shape "
                                       f"{param.data.shape} has a gradient of shape "
                                       f"{param.grad.shape}")
            flat[offset:offset + size] = param.grad.reshape(-1)
        offset += size
    # NOTE: not out=flat: a backend may let peers read this rank's input after it returns
    averaged = group.all_reduce_mean(flat)
    offset = 0
    for param, size, target in zip(params, sizes, targets):
        # views into one fresh buffer: no copy when the dtype already matches
        param.grad = averaged[offset:offset + size].reshape(param.data.shape).astype(
            target, copy=False)
        offset += size
