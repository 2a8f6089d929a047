"""PyTorch's tensor conversions by name — ``t.float()``, ``double()``, ``half()``,
``bfloat16()``, ``long()``, ``int()``, ``bool()``, ``clone()``, ``tolist()``, ``cpu()``,
``contiguous()`` — compared with PyTorch; ``cuda()`` refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

VALUES = np.array([[1.5, -0.0, 2.75], [-3.25, 0.5, 7.0]], np.float32)


@pytest.mark.parametrize("name", ["float", "double", "half", "bfloat16", "long", "int", "bool"])
def test_casts_by_name_give_pytorchs_dtype_and_values(name, torch):
    theirs = getattr(torch.tensor(VALUES), name)()
    ours = getattr(eo.tensor(VALUES), name)()
    assert ours.dtype == str(theirs.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(ours.data.astype(np.float64),
                                  theirs.to(torch.float64).numpy())


def test_accuracy_idiom(torch):
    predicted, labels = np.array([0, 2, 1, 1]), np.array([0, 1, 1, 1])
    theirs = (torch.tensor(predicted) == torch.tensor(labels)).float().mean().item()
    ours = (eo.tensor(predicted) == eo.tensor(labels)).float().mean().item()
    assert ours == pytest.approx(theirs)


def test_clone_copies_and_passes_gradients():
    x = eo.tensor(np.array([1.5, -0.0, np.nan, np.inf], np.float32), requires_grad=True)
    copy = x.clone()
    assert not np.shares_memory(copy.data, x.data)
    np.testing.assert_array_equal(copy.data, x.data)
    assert np.signbit(copy.data[1])
    (copy * 3).sum().backward()
    np.testing.assert_array_equal(x.grad, np.full(4, 3, np.float32))
    ints = eo.tensor([1, 2])
    assert ints.clone().dtype == "int64" and not np.shares_memory(ints.clone().data, ints.data)


def test_cpu_contiguous_tolist_and_cuda(torch):
    x = eo.tensor(VALUES)
    assert x.cpu() is x and x.contiguous() is x
    assert x.tolist() == torch.tensor(VALUES).tolist()
    assert eo.tensor(2.5).tolist() == 2.5
    for call in (lambda: x.cuda(), lambda: x.cuda(1)):
        with pytest.raises(EveryOError, match=r"Tensor.cuda: EveryO computes on the CPU"):
            call()
