"""``shard_indices``: which rows of a dataset each rank trains on."""

from __future__ import annotations

import numpy as np

from everyo_dist.errors import DistributedError


def _check_int(name: str, value, minimum: int) -> int:
    if isinstance(value, bool) or not isinstance(value, (int, np.integer)) or value < minimum:
        raise DistributedError(f"shard_indices: {name} must be an integer >= {minimum}, "
                               f"got {value!r}")
    return int(value)


def shard_indices(count: int, rank: int, world_size: int, drop_last: bool = False) -> np.ndarray:
    """The indices of ``range(count)`` that rank ``rank`` of ``world_size`` owns.

    Shards are contiguous, disjoint and in rank order; together they cover every index. Their
    sizes differ by at most one (the first ``count % world_size`` ranks get one more), unless
    ``drop_last=True``, which drops the ``count % world_size`` trailing indices so every rank
    gets exactly ``count // world_size`` (equal batch sizes keep a mean over ranks a mean over
    rows).

    Args:
        count: number of rows in the dataset.
        rank: this rank, ``0 <= rank < world_size``.
        world_size: number of ranks.
        drop_last: make every shard the same size.
    Returns:
        A 1-D int64 array of indices, usable as ``inputs[indices]``.

    Example:
        >>> shard_indices(10, 0, 3), shard_indices(10, 2, 3)
        (array([0, 1, 2, 3]), array([7, 8, 9]))
        >>> shard_indices(10, 2, 3, drop_last=True)
        array([6, 7, 8])
    """
    count = _check_int("count", count, 0)
    world_size = _check_int("world_size", world_size, 1)
    rank = _check_int("rank", rank, 0)
    if rank >= world_size:
        raise DistributedError(f"shard_indices: rank {rank} is not below world_size {world_size}")
    base, extra = divmod(count, world_size)
    if drop_last:
        return np.arange(rank * base, (rank + 1) * base, dtype=np.int64)
    start = rank * base + min(rank, extra)
    return np.arange(start, start + base + (rank < extra), dtype=np.int64)
