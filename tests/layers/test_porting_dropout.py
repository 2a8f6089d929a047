"""``eo.dropout`` is PyTorch's ``F.dropout(input, p, training, inplace)``: the Dropout layer's
masks and generator, ``p`` in [0, 1] (1 gives zeros), ``training=False`` the input itself,
``inplace=True`` where a write may be in place and refused by name where it may not."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError


def test_signature_is_pytorchs(torch):
    ours = list(inspect.signature(eo.dropout).parameters.values())[:4]
    theirs = list(inspect.signature(torch.nn.functional.dropout).parameters.values())
    assert [(p.name, p.default) for p in ours[1:]] == [(p.name, p.default) for p in theirs[1:]]
    layer = list(inspect.signature(eo.Dropout).parameters)[:2]
    assert layer == list(inspect.signature(torch.nn.Dropout).parameters)[:2]


def test_same_masks_as_the_layer_from_the_same_generator():
    x = eo.tensor(np.random.default_rng(0).standard_normal((8, 16)))
    eo.manual_seed(3)
    functional = eo.dropout(x, 0.3)
    eo.manual_seed(3)
    layer = eo.Dropout(0.3)(x)
    np.testing.assert_array_equal(functional.data, layer.data)
    own = eo.dropout(x, 0.3, generator=np.random.default_rng(5))
    np.testing.assert_array_equal(own.data, eo.Dropout(0.3, seed=5)(x).data)


@pytest.mark.parametrize("p", [0.1, 0.5, 0.9])
def test_drops_a_fraction_p_and_scales_the_rest(p):
    x = eo.ones(200_000, requires_grad=True)
    y = eo.dropout(x, p, generator=np.random.default_rng(1))
    values = np.unique(y.data)
    np.testing.assert_allclose(values, [0.0, 1.0 / (1.0 - p)], rtol=1e-6)
    assert abs((y.data == 0).mean() - p) < 0.005
    y.sum().backward()
    np.testing.assert_array_equal(x.grad, y.data)  # d(x * mask)/dx = mask


def test_edges_as_pytorch(torch):
    data = np.array([1.0, -2.0, np.inf], np.float32)
    theirs = torch.nn.functional.dropout(torch.tensor(data), 1.0)
    ours = eo.dropout(eo.tensor(data), 1.0)
    np.testing.assert_array_equal(ours.data, theirs.numpy())  # zeros; inf * 0 is NaN there too
    x = eo.tensor(data)
    assert eo.dropout(x, 0.5, training=False) is x
    t = torch.tensor(data)
    assert torch.nn.functional.dropout(t, 0.5, training=False) is t
    assert eo.dropout(x, 0.0) is x
    np.testing.assert_array_equal(eo.Dropout(1.0)(eo.ones(3)).data, np.zeros(3))


@pytest.mark.parametrize("call, name", [
    (lambda x: eo.dropout(x, -0.1), "p"), (lambda x: eo.dropout(x, 1.5), "p"),
    (lambda x: eo.dropout(x, float("nan")), "p"), (lambda x: eo.dropout(x, "0.5"), "p"),
    (lambda x: eo.dropout(x, 0.5, training=1), "training"),
    (lambda x: eo.dropout(x, 0.5, inplace=None), "inplace"),
    (lambda x: eo.Dropout(0.5, inplace="yes"), "inplace"),
])
def test_bad_arguments_are_refused_by_name(call, name):
    with pytest.raises(EveryOError, match=rf"ropout: {name} must be"):
        call(eo.ones(3))


def test_inplace_writes_where_a_write_may_be_in_place():
    x = eo.ones(1000)
    version = x._version
    out = eo.dropout(x, 0.5, inplace=True, generator=np.random.default_rng(2))
    assert out is x and x._version > version
    np.testing.assert_array_equal(x.data, eo.dropout(eo.ones(1000), 0.5,
                                                     generator=np.random.default_rng(2)).data)
    w = eo.ones(10, requires_grad=True)
    with eo.no_grad():
        assert eo.dropout(w, 0.5, inplace=True) is w


def test_inplace_on_a_recorded_tensor_is_refused_and_changes_nothing():
    w = eo.ones(10, requires_grad=True)
    with pytest.raises(EveryOError, match=r"dropout\(inplace=True\).*gradient recording"):
        eo.dropout(w, 0.5, inplace=True)
    np.testing.assert_array_equal(w.data, np.ones(10))
    with pytest.raises(EveryOError, match=r"dropout\(inplace=True\): writes into an eo.Tensor"):
        eo.dropout(np.ones(3, np.float32), 0.5, inplace=True)


def test_the_layer_takes_inplace_and_returns_its_output():
    layer = eo.Dropout(0.5, inplace=True, seed=0)
    x = eo.ones(100, requires_grad=True)
    y = layer(x)  # a training forward: the output is new, the input as it was
    assert y is not x and set(np.unique(y.data)) == {0.0, 2.0}
    np.testing.assert_array_equal(x.data, np.ones(100))
    assert "inplace=True" in repr(layer)


@pytest.mark.parametrize("p", [0.5, 1.0])
def test_an_array_input_gives_a_tensor_whatever_p(p):
    """p=1 is computed apart (zeros): it returns a Tensor as every other p does."""
    out = eo.dropout(np.ones(4, np.float32), p, generator=np.random.default_rng(0))
    assert isinstance(out, eo.Tensor) and out.data.dtype == np.float32
