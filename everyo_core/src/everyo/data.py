"""``TensorDataset`` and ``DataLoader``: mini-batches from arrays.

They live in the core, not in everyo-layers, because every training loop needs them whatever
layers it uses (and everyo-dist's examples shard plain arrays with them).
"""

from __future__ import annotations

import copy

import numpy as np

from everyo.errors import EveryOError
from everyo.random import default_generator, plain_generator_state
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
        shuffle: reshuffle every epoch: with its own generator seeded by ``seed``, or with
            the global one (``eo.manual_seed``) when ``seed`` is None.
        drop_last: drop the final short batch.

    ``state_dict()`` holds the current epoch's order, how many of its batches were taken and
    the loader's own generator, so a run resumed from a checkpoint gets the same batches.

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
        self._rng = None if seed is None else np.random.default_rng(seed)
        self._order: np.ndarray | None = None  # the order of the epoch in progress
        self._position = 0      # batches of it handed out
        self._resume = False    # the next iter() continues a loaded epoch

    def __len__(self) -> int:
        n = len(self.dataset)
        return n // self.batch_size if self.drop_last else -(-n // self.batch_size)

    def __iter__(self):
        if self._resume and self._order is not None:
            order, start = self._order, self._position
        else:
            n = len(self.dataset)
            rng = self._rng if self._rng is not None else default_generator()
            order, start = (rng.permutation(n) if self.shuffle else np.arange(n)), 0
        self._resume = False
        self._order = order
        for batch in range(start, len(self)):
            self._position = batch + 1
            rows = order[batch * self.batch_size:(batch + 1) * self.batch_size]
            parts = tuple(Tensor(a[rows]) for a in self.dataset.arrays)
            yield parts if len(parts) > 1 else parts[0]

    def state_dict(self) -> dict:
        """Where iteration stands: the epoch in progress and the loader's own generator."""
        in_progress = self._order is not None and self._position < len(self)
        return {"order": np.array(self._order) if in_progress else None,
                "position": self._position if in_progress else 0,
                "generator": None if self._rng is None else copy.deepcopy(
                    self._rng.bit_generator.state)}

    def load_state_dict(self, state: dict) -> None:
        """Continue from :meth:`state_dict`: the next ``iter()`` finishes the saved epoch."""
        order = state.get("order")
        if order is not None and len(order) != len(self.dataset):
            raise EveryOError(f"DataLoader.load_state_dict: the state's epoch has {len(order)} "
                              f"rows, the dataset {len(self.dataset)}")
        if (state.get("generator") is None) != (self._rng is None):
            raise EveryOError("DataLoader.load_state_dict: the state was saved by a loader "
                              + ("without" if state.get("generator") is None else "with")
                              + " its own seed; create this one the same way")
        if self._rng is not None:
            self._rng.bit_generator.state = plain_generator_state(state["generator"])
        self._order = None if order is None else np.asarray(order)
        self._position = int(state.get("position", 0))
        self._resume = order is not None
