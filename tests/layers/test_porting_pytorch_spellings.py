"""PyTorch spellings a ported model uses in its first hour, checked against PyTorch:
``nn.ReLU(inplace=True)`` (and the other activations' ``inplace``), ``nn.Softmax(dim=1)``,
``nn.Flatten(start_dim, end_dim)``, ``x.sum(dim=1, keepdim=True)``, ``F.softmax(x, dim=-1)``;
and the ``dim=`` calls whose PyTorch result differs (``max``/``min`` give (values, indices),
``var`` is the sample variance) refused by name rather than answered differently."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError
from everyo_layers.factory_arguments import LAYERS_TAKING_INPLACE

X = np.random.default_rng(0).standard_normal((2, 3, 4, 5)).astype(np.float32)


@pytest.mark.parametrize("name", [cls.__name__ for cls in LAYERS_TAKING_INPLACE])
def test_activations_take_inplace_as_pytorch(name, torch):
    ours = inspect.signature(getattr(eo, name)).parameters
    theirs = inspect.signature(getattr(torch.nn, name)).parameters
    assert [(p.name, p.default) for p in ours.values()] == \
        [(p.name, p.default) for p in theirs.values()]
    positional = [p.default for p in theirs.values() if p.name != "inplace"]
    layer = getattr(eo, name)(*positional, True)  # nn.ReLU(True), nn.LeakyReLU(0.01, True)
    assert layer.inplace is True
    x = eo.tensor(X)
    expected = getattr(torch.nn, name)(*positional)(torch.tensor(X)).numpy()
    np.testing.assert_allclose(layer(x).data, expected, rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(x.data, X)  # the input is left as it was
    with pytest.raises(EveryOError, match=f"{name}: inplace must be True or False"):
        getattr(eo, name)(inplace=1)


@pytest.mark.parametrize("name", ["Softmax", "LogSoftmax"])
@pytest.mark.parametrize("dim", [0, 1, -1])
def test_softmax_layers_take_dim(name, dim, torch):
    expected = getattr(torch.nn, name)(dim=dim)(torch.tensor(X)).numpy()
    np.testing.assert_allclose(getattr(eo, name)(dim=dim)(X).data, expected, rtol=1e-5,
                               atol=1e-6)
    with pytest.raises(EveryOError, match="both axis=0 and PyTorch's dim=1"):
        getattr(eo, name)(0, dim=1)


@pytest.mark.parametrize("dims", [(), (1,), (0,), (0, 1), (1, 2), (2, -1), (-3, -2), (0, -1)])
def test_flatten_takes_start_and_end_dim(dims, torch):
    expected = torch.nn.Flatten(*dims)(torch.tensor(X)).numpy()
    np.testing.assert_array_equal(eo.Flatten(*dims)(X).data, expected)
    keywords = dict(zip(("start_dim", "end_dim"), dims))
    np.testing.assert_array_equal(eo.Flatten(**keywords)(X).data, expected)


def test_flatten_refuses_dims_that_do_not_fit():
    with pytest.raises(EveryOError, match="start_dim=3, end_dim=1 do not fit"):
        eo.Flatten(3, 1)(X)
    with pytest.raises(EveryOError, match="start_dim must be"):
        eo.Flatten(1.5)


@pytest.mark.parametrize("name", ["sum", "mean"])
@pytest.mark.parametrize("dim, keepdim", [(1, False), (-1, True), ((0, 2), False), (None, False)])
def test_reductions_take_dim_and_keepdim(name, dim, keepdim, torch):
    t = torch.tensor(X)
    expected = getattr(t, name)(dim=dim, keepdim=keepdim) if dim is not None else \
        getattr(t, name)()
    x = eo.tensor(X)
    ours = getattr(x, name)(dim=dim, keepdim=keepdim)
    np.testing.assert_allclose(ours.data, expected.numpy(), rtol=1e-5, atol=1e-5)
    np.testing.assert_allclose(getattr(eo, name)(x, dim=dim, keepdim=keepdim).data,
                               expected.numpy(), rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", ["argmax", "argmin"])
@pytest.mark.parametrize("dim, keepdim", [(0, False), (-1, True), (2, False)])
def test_argmax_takes_dim_and_keepdim(name, dim, keepdim, torch):
    expected = getattr(torch.tensor(X), name)(dim=dim, keepdim=keepdim).numpy()
    np.testing.assert_array_equal(getattr(eo.tensor(X), name)(dim=dim, keepdim=keepdim).data,
                                  expected)


@pytest.mark.parametrize("name", ["softmax", "log_softmax"])
def test_functional_softmax_takes_dim(name, torch):
    expected = getattr(torch.nn.functional, name)(torch.tensor(X), dim=1).numpy()
    np.testing.assert_allclose(getattr(eo, name)(X, dim=1).data, expected, rtol=1e-5,
                               atol=1e-6)
    np.testing.assert_allclose(getattr(eo.tensor(X), name)(dim=1).data, expected, rtol=1e-5,
                               atol=1e-6)


@pytest.mark.parametrize("call, says", [
    (lambda x: x.max(dim=1), r"max: dim= is not taken: .*\(values, indices\).*argmax"),
    (lambda x: x.min(dim=1), r"min: dim= is not taken: .*argmin"),
    (lambda x: x.var(dim=1), r"var: dim= is not taken: .*sample variance.*ddof=1"),
    (lambda x: x.sum(1, dim=1), r"sum: got both axis=1 and PyTorch's dim=1"),
    (lambda x: x.mean(keepdims=True, keepdim=True), r"mean: got both keepdims"),
])
def test_dim_where_pytorch_answers_differently_is_refused_by_name(call, says):
    with pytest.raises(EveryOError, match=says):
        call(eo.tensor(X))
