"""``TensorDataset`` and ``DataLoader``: mini-batches from arrays.

They live in the core, not in everyo-layers, because every training loop needs them whatever
layers it uses (and everyo-dist's examples shard plain arrays with them).
"""

from __future__ import annotations

import numpy as np

from everyo.errors import EveryOError
from everyo.tensor import Tensor


class TensorDataset:
    """Rows of one or more equally long arrays; ``dataset[i]`` is a tuple of rows.

    Example:
        >>> import everyo as eo, numpy as np
        >>> ds = eo.TensorDataset(np.zeros((4, 2)), np.arange(4))
        >>> len(ds), int(ds[1][1])
        (4, 1)
    """

    def __init__(self, *arrays):
        if not arrays:
            raise EveryOError("TensorDataset needs at least one array")
        self.arrays = tuple(np.asarray(a.data if isinstance(a, Tensor) else a) for a in arrays)
        lengths = {len(a) for a in self.arrays}
        if len(lengths) != 1:
            raise EveryOError(f"TensorDataset: arrays have different lengths "
                              f"{[len(a) for a in self.arrays]}")

    def __len__(self) -> int:
        return len(self.arrays[0])

    def __getitem__(self, index):
        return tuple(a[index] for a in self.arrays)


class DataLoader:
    """Iterate over mini-batches of Tensors.

    Args:
        dataset: a ``TensorDataset``, an array, or a tuple of arrays of equal length.
        batch_size: rows per batch.
        shuffle: reshuffle every epoch (with ``seed``, reproducibly).
        drop_last: drop the final short batch.

    Example:
        >>> import everyo as eo, numpy as np
        >>> loader = eo.DataLoader((np.arange(10.0), np.arange(10)), batch_size=4)
        >>> [x.shape for x, y in loader]
        [(4,), (4,), (2,)]
    """

    def __init__(self, dataset, batch_size: int = 1, shuffle: bool = False, seed=None,
                 drop_last: bool = False):
        if isinstance(dataset, (tuple, list)):
            dataset = TensorDataset(*dataset)
        elif not isinstance(dataset, TensorDataset):
            dataset = TensorDataset(dataset)
        if batch_size < 1:
            raise EveryOError(f"DataLoader: batch_size must be >= 1, got {batch_size}")
        self.dataset, self.batch_size = dataset, int(batch_size)
        self.shuffle, self.drop_last = shuffle, drop_last
        self._rng = np.random.default_rng(seed)

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        n = len(self.dataset)
        order = self._rng.permutation(n) if self.shuffle else np.arange(n)
        for batch in range(len(self)):
            rows = order[batch * self.batch_size:(batch + 1) * self.batch_size]
            parts = tuple(Tensor(a[rows]) for a in self.dataset.arrays)
            yield parts if len(parts) > 1 else parts[0]
