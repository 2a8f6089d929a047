"""A PyTorch-style map dataset (a class with ``__len__`` and ``__getitem__``) handed to
``eo.DataLoader`` / ``eo.TensorDataset``: NumPy's array conversion iterated its
``__getitem__`` until an IndexError that such a dataset never raises, allocating without end
(the process was killed for memory). Refused by name at once; array-likes still convert."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError


class Endless:
    """Items for any index, as a computed dataset gives (never an IndexError); stops the test
    after 100 reads instead of filling the machine's memory."""

    def __init__(self):
        self.reads = 0

    def __len__(self):
        return 4

    def __getitem__(self, index):
        self.reads += 1
        assert self.reads < 100, "read far past its length: iterated as a sequence"
        return np.ones(2, np.float32), index


class ArrayLike:
    def __init__(self, values):
        self.values = values

    def __array__(self, dtype=None, copy=None):
        return np.asarray(self.values, dtype=dtype)


@pytest.mark.parametrize("make", [lambda d: eo.DataLoader(d, batch_size=2),
                                  lambda d: eo.TensorDataset(d),
                                  lambda d: eo.DataLoader((d, np.arange(4)))],
                         ids=["DataLoader", "TensorDataset", "DataLoader tuple"])
def test_a_map_style_dataset_object_is_refused_by_name(make):
    with pytest.raises(EveryOError, match=r"Endless.*TensorDataset"):
        make(Endless())


def test_array_likes_and_tensors_still_load():
    rows = [[1.0, 2.0], [3.0, 4.0]]
    for data in (ArrayLike(rows), eo.tensor(rows), np.array(rows), range(2)):
        (batch,) = list(eo.DataLoader(data, batch_size=2))
        np.testing.assert_array_equal(batch.data, rows if not isinstance(data, range) else [0, 1])
    x, y = next(iter(eo.DataLoader(([[1.0, 2.0], [3.0, 4.0]], [0, 1]), batch_size=2)))
    np.testing.assert_array_equal(y.data, [0, 1])  # (nested lists: arrays as before)
