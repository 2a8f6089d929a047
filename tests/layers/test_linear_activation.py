"""Linear, the activations and Dropout: first and second derivatives in float64 and PyTorch as
the oracle."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.second_order import (
    F,
    away_from_zero,
    normal,
    second_order_tests,
)


def test_linear_gradcheck_input_and_parameters(rng):
    layer = eo.Linear(4, 3, seed=0).to("float64")
    x = rng.standard_normal((2, 5, 4))  # leading batch axes are allowed
    assert eo.gradcheck(layer, x, params=list(layer.parameters()))


def test_linear_without_bias_gradcheck(rng):
    layer = eo.Linear(3, 2, bias=False, seed=0).to("float64")
    assert layer.bias is None
    assert eo.gradcheck(layer, rng.standard_normal((4, 3)), params=[layer.weight])


def test_linear_init_follows_pytorch_bounds():
    layer = eo.Linear(100, 50, seed=0)
    bound = 1 / np.sqrt(100)
    assert layer.weight.shape == (100, 50) and layer.weight.dtype == "float32"
    assert np.abs(layer.weight.data).max() <= bound
    assert np.abs(layer.weight.data).max() > 0.9 * bound  # uniform over the whole range
    assert np.array_equal(eo.Linear(100, 50, seed=0).weight.data, layer.weight.data)
    assert not np.array_equal(eo.Linear(100, 50, seed=1).weight.data, layer.weight.data)


def test_linear_matches_torch(torch, rng):
    layer = eo.Linear(6, 4, seed=3).to("float64")
    ref = torch.nn.Linear(6, 4).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(layer.weight.data.T))
        ref.bias.copy_(torch.from_numpy(layer.bias.data))
    x = rng.standard_normal((5, 6))
    g = rng.standard_normal((5, 4))
    ours_x = eo.tensor(x, requires_grad=True)
    out = layer(ours_x)
    out.backward(g)
    tx = torch.tensor(x, requires_grad=True)
    ref_out = ref(tx)
    ref_out.backward(torch.from_numpy(g))
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours_x.grad, tx.grad.numpy(), rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(layer.weight.grad, ref.weight.grad.numpy().T, rtol=1e-12)
    np.testing.assert_allclose(layer.bias.grad, ref.bias.grad.numpy(), rtol=1e-12)


ACTIVATIONS = [
    (lambda: eo.ReLU(), lambda t, F: F.relu(t)),
    (lambda: eo.Sigmoid(), lambda t, F: torch_sigmoid(t)),
    (lambda: eo.Tanh(), lambda t, F: t.tanh()),
    (lambda: eo.Softmax(), lambda t, F: F.softmax(t, dim=-1)),
    (lambda: eo.Softmax(axis=1), lambda t, F: F.softmax(t, dim=1)),
    (lambda: eo.LogSoftmax(), lambda t, F: F.log_softmax(t, dim=-1)),
    (lambda: eo.GELU(), lambda t, F: F.gelu(t)),
    (lambda: eo.GELU(approximate="tanh"), lambda t, F: F.gelu(t, approximate="tanh")),
    (lambda: eo.LeakyReLU(), lambda t, F: F.leaky_relu(t, 0.01)),
    (lambda: eo.LeakyReLU(0.2), lambda t, F: F.leaky_relu(t, 0.2)),
]
IDS = ["relu", "sigmoid", "tanh", "softmax", "softmax_axis1", "log_softmax", "gelu",
       "gelu_tanh", "leaky_relu", "leaky_relu_0.2"]


def torch_sigmoid(t):
    return t.sigmoid()


def _away_from_kinks(rng, shape):
    x = rng.standard_normal(shape) * 2
    return np.where(np.abs(x) < 1e-3, 0.5, x)  # ReLU-like kinks break finite differences


@pytest.mark.parametrize("make, reference", ACTIVATIONS, ids=IDS)
def test_activation_gradcheck(make, reference, rng):
    assert eo.gradcheck(make(), _away_from_kinks(rng, (3, 4, 5)))


@pytest.mark.parametrize("make, reference", ACTIVATIONS, ids=IDS)
def test_activation_matches_torch(make, reference, torch, rng):
    x = _away_from_kinks(rng, (3, 4, 5))
    g = rng.standard_normal((3, 4, 5))
    ours = eo.tensor(x, requires_grad=True)
    out = make()(ours)
    out.backward(g)
    tx = torch.tensor(x, requires_grad=True)
    ref = reference(tx, torch.nn.functional)
    ref.backward(torch.from_numpy(g))
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours.grad, tx.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("dtype", ["float16", "float32"])
def test_activations_keep_the_input_dtype(dtype):
    x = eo.randn(4, 6, seed=0, dtype=dtype)
    for layer in (eo.ReLU(), eo.GELU(), eo.GELU("tanh"), eo.LeakyReLU(), eo.Softmax()):
        assert layer(x).dtype == dtype


def test_dropout_is_inverted_seeded_and_identity_in_eval():
    x = eo.ones(1000, 50)
    layer = eo.Dropout(0.3, seed=7)
    out = layer(x).data
    kept = out != 0
    assert set(np.unique(out)) == {0.0, np.float32(1 / 0.7)}
    assert abs(kept.mean() - 0.7) < 0.01
    assert abs(out.mean() - 1.0) < 0.02  # the expectation is preserved
    again = eo.Dropout(0.3, seed=7)(x).data
    assert np.array_equal(out, again)
    assert not np.array_equal(out, layer(x).data)  # a new mask on every call
    layer.eval()
    assert layer(x) is x


def test_dropout_gradient_uses_the_forward_mask(rng):
    layer = eo.Dropout(0.5, seed=1)
    x = eo.tensor(rng.standard_normal((6, 7)), requires_grad=True)
    out = layer(x)
    out.sum().backward()
    np.testing.assert_array_equal(x.grad, out.data / x.data)


def test_dropout_gradcheck_with_a_fixed_mask(rng):
    def fixed_mask_dropout(x):
        return eo.Dropout(0.4, seed=3)(x)  # same seed on every evaluation: the same mask

    assert eo.gradcheck(fixed_mask_dropout, rng.standard_normal((4, 5)))


def test_dropout_rejects_bad_p():
    for p in (-0.1, 1.5, float("nan")):  # (p=1 drops everything, as PyTorch's)
        with pytest.raises(eo.EveryOError, match="Dropout: p must be a number in"):
            eo.Dropout(p)


def test_layers_are_reachable_through_the_registry():
    for name in ("Linear", "ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax", "GELU",
                 "LeakyReLU", "Dropout"):
        assert name in eo.registry("layers").items
        assert getattr(eo, name) is eo.registry("layers").items[name]
    assert {"gelu", "leaky_relu", "dropout"} <= set(eo.registry("ops").items)


SECOND_ORDER = [
    ("gelu", lambda x: eo.dispatch("gelu", x), lambda x: F().gelu(x), [normal(3, 4)]),
    ("gelu_tanh", lambda x: eo.dispatch("gelu", x, approximate="tanh"),
     lambda x: F().gelu(x, approximate="tanh"), [normal(3, 4)]),
    ("leaky_relu", lambda x: eo.dispatch("leaky_relu", x, negative_slope=0.2),
     lambda x: F().leaky_relu(x, 0.2), [away_from_zero(3, 4)]),
    ("dropout_same_mask",
     lambda x: eo.dispatch("dropout", x, p=0.4, rng=np.random.default_rng(0)) ** 2,
     None, [normal(3, 4)]),
]

test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))
