"""PyTorch's ``dim=[]`` (or ``dim=()``) on ``sum``/``mean`` reduces every axis (a list of axes
built by a comprehension that came out empty); NumPy's ``axis=()`` reduces none. Taken as
NumPy's, ported code got its input back instead of a scalar, silently. EveryO's ``axis=()``
keeps NumPy's meaning; the PyTorch spelling means PyTorch's."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize("empty", [[], ()])
@pytest.mark.parametrize("keepdim", [False, True])
def test_an_empty_dim_reduces_every_axis_as_pytorch(name, empty, keepdim):
    torch = pytest.importorskip("torch")
    x = np.random.default_rng(0).standard_normal((2, 3, 4))
    expected = getattr(torch.from_numpy(x), name)(dim=empty, keepdim=keepdim).numpy()
    for got in (getattr(eo.tensor(x), name)(dim=empty, keepdim=keepdim),
                getattr(eo, name)(eo.tensor(x), dim=empty, keepdim=keepdim)):
        assert got.shape == expected.shape
        np.testing.assert_allclose(got.data, expected, rtol=1e-12)


def test_numpys_empty_axis_still_reduces_none():
    x = np.arange(6.0).reshape(2, 3)
    assert np.array_equal(eo.tensor(x).sum(axis=()).data, x)
