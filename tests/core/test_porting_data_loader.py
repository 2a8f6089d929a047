"""PyTorch's ``DataLoader`` options port unchanged: the worker options (``num_workers``,
``pin_memory``, ...) are checked and change nothing (batches are slices taken in this
process: the same batches, in the same number, as PyTorch's); options that would change the
batches (``sampler``, ``collate_fn``, ...) are refused by name unless None."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

WORKER_OPTIONS = {"num_workers": 2, "pin_memory": True, "persistent_workers": True,
                  "prefetch_factor": 2, "timeout": 0, "worker_init_fn": None}


@pytest.mark.parametrize("drop_last", [False, True])
def test_worker_options_change_nothing(drop_last, torch):
    data, labels = np.arange(22.0).reshape(11, 2), np.arange(11)
    ours = eo.DataLoader((data, labels), batch_size=4, drop_last=drop_last, **WORKER_OPTIONS)
    plain = eo.DataLoader((data, labels), batch_size=4, drop_last=drop_last)
    dataset = torch.utils.data.TensorDataset(torch.tensor(data), torch.tensor(labels))
    theirs = torch.utils.data.DataLoader(dataset,
                                         batch_size=4, drop_last=drop_last,
                                         **{**WORKER_OPTIONS, "num_workers": 0, "pin_memory": False,
                                            "persistent_workers": False,
                                            "prefetch_factor": None})
    assert len(ours) == len(plain) == len(theirs)
    for (a, y), (b, _), (c, z) in zip(ours, plain, theirs):
        np.testing.assert_array_equal(a.data, b.data)
        np.testing.assert_array_equal(a.data, c.numpy())
        np.testing.assert_array_equal(y.data, z.numpy())


@pytest.mark.parametrize("options, says", [
    ({"num_workers": -1}, "num_workers must be"), ({"pin_memory": "yes"}, "pin_memory must"),
    ({"prefetch_factor": 0}, "prefetch_factor must"), ({"timeout": -1.0}, "timeout must"),
    ({"worker_init_fn": 3}, "worker_init_fn must be"),
    ({"sampler": [0, 1]}, "sampler= is not supported"),
    ({"batch_sampler": [[0, 1]]}, "batch_sampler= is not supported"),
    ({"collate_fn": list}, "collate_fn= is not supported"),
    ({"generator": np.random.default_rng(0)}, "generator= is not supported"),
])
def test_bad_or_unsupported_options_are_refused_by_name(options, says):
    with pytest.raises(EveryOError, match=f"DataLoader: {says}"):
        eo.DataLoader((np.arange(4.0),), batch_size=2, **options)
