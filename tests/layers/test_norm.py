"""BatchNorm1D/2D (train and eval, running statistics) and LayerNorm (also without bias) against
PyTorch, first and second derivatives in float64, float16 behaviour, float32 accuracy and
errors."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.second_order import (
    F,
    T,
    normal,
    second_order_tests,
)
from support.torch_oracle import compare_with_torch


def _copy_affine(torch, ours, ref):
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(ours.weight.data))
        ref.bias.copy_(torch.from_numpy(ours.bias.data))


def _to_torch_layout(x):
    """Channel-last (N, ..., C) to PyTorch's channel-second (N, C, ...)."""
    return np.moveaxis(x, -1, 1)


def _forward_backward_both(torch, ours, ref, x, g):
    """Run ``x`` forward and ``g`` backward through our layer and PyTorch's (NCHW) twin."""
    xt = eo.tensor(x, requires_grad=True)
    out = ours(xt)
    out.backward(g)
    tx = torch.tensor(_to_torch_layout(x), requires_grad=True)
    ref_out = ref(tx)
    ref_out.backward(torch.from_numpy(_to_torch_layout(g)))
    return xt, out, tx, ref_out


BATCHNORM_CASES = [("1d", (16, 5)), ("1d", (4, 6, 5)), ("2d", (4, 3, 6, 5))]


@pytest.mark.parametrize("kind, shape", BATCHNORM_CASES)
@pytest.mark.parametrize("momentum", [0.1, None])
def test_batchnorm_matches_torch_in_train_and_eval(torch, rng, kind, shape, momentum):
    ours = (eo.BatchNorm1D if kind == "1d" else eo.BatchNorm2D)(5, momentum=momentum)
    ref = (torch.nn.BatchNorm1d if kind == "1d" else torch.nn.BatchNorm2d)(5, momentum=momentum)
    ours.to("float64")
    ref.double()
    ours.weight.data[:] = rng.standard_normal(5)
    ours.bias.data[:] = rng.standard_normal(5)
    _copy_affine(torch, ours, ref)
    for _ in range(3):  # a few training steps: the running statistics must follow
        x = rng.standard_normal(shape) * 3 + 1
        g = rng.standard_normal(shape)
        xt, out, tx, ref_out = _forward_backward_both(torch, ours, ref, x, g)
        np.testing.assert_allclose(_to_torch_layout(out.data), ref_out.detach().numpy(),
                                   rtol=1e-10, atol=1e-10)
        np.testing.assert_allclose(_to_torch_layout(xt.grad), tx.grad.numpy(), rtol=1e-9,
                                   atol=1e-10)
        np.testing.assert_allclose(ours.weight.grad, ref.weight.grad.numpy(), rtol=1e-10)
        np.testing.assert_allclose(ours.bias.grad, ref.bias.grad.numpy(), rtol=1e-10)
        ours.zero_grad()
        ref.zero_grad()
    np.testing.assert_allclose(ours.running_mean, ref.running_mean.numpy(), rtol=1e-12)
    np.testing.assert_allclose(ours.running_var, ref.running_var.numpy(), rtol=1e-12)
    assert int(ours.num_batches_tracked) == int(ref.num_batches_tracked) == 3

    ours.eval()
    ref.eval()
    x = rng.standard_normal(shape)
    g = rng.standard_normal(shape)
    xt, out, tx, ref_out = _forward_backward_both(torch, ours, ref, x, g)
    np.testing.assert_allclose(_to_torch_layout(out.data), ref_out.detach().numpy(), rtol=1e-10)
    np.testing.assert_allclose(_to_torch_layout(xt.grad), tx.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(ours.weight.grad, ref.weight.grad.numpy(), rtol=1e-10)
    assert int(ours.num_batches_tracked) == 3  # eval does not count


def test_batchnorm_without_affine_or_running_stats_matches_torch(torch, rng):
    ours = eo.BatchNorm2D(4, affine=False, track_running_stats=False).to("float64")
    ref = torch.nn.BatchNorm2d(4, affine=False, track_running_stats=False).double()
    assert ours.weight is None and ours.running_mean is None
    assert list(ours.state_dict()) == []
    x = rng.standard_normal((3, 4, 4, 4))
    ours.eval()
    ref.eval()  # without running statistics even eval normalises by the batch
    np.testing.assert_allclose(
        _to_torch_layout(ours(eo.tensor(x)).data),
        ref(torch.tensor(_to_torch_layout(x))).detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("cls, shape", [(eo.BatchNorm1D, (6, 3)), (eo.BatchNorm1D, (3, 4, 3)),
                                        (eo.BatchNorm2D, (2, 3, 2, 3))])
@pytest.mark.parametrize("training", [True, False])
def test_batchnorm_gradcheck(rng, cls, shape, training):
    layer = cls(3).to("float64")
    layer.weight.data[:] = rng.standard_normal(3)
    layer.running_mean[:] = rng.standard_normal(3)
    layer.running_var[:] = rng.random(3) + 0.5
    layer.train(training)
    assert eo.gradcheck(layer, rng.standard_normal(shape), params=list(layer.parameters()))


def test_batchnorm_state_dict_holds_the_running_statistics():
    layer = eo.BatchNorm2D(3)
    layer(eo.randn(4, 2, 2, 3, seed=0))
    state = layer.state_dict()
    assert set(state) == {"weight", "bias", "running_mean", "running_var",
                          "num_batches_tracked"}
    assert state["running_mean"].dtype == np.float32
    fresh = eo.BatchNorm2D(3)
    fresh.load_state_dict(state)
    np.testing.assert_array_equal(fresh.running_var, layer.running_var)


@pytest.mark.parametrize("normalized_shape, shape", [(5, (4, 5)), (5, (2, 3, 5)),
                                                     ((3, 5), (2, 3, 5))])
def test_layernorm_matches_torch(torch, rng, normalized_shape, shape):
    ours = eo.LayerNorm(normalized_shape).to("float64")
    ref = torch.nn.LayerNorm(normalized_shape).double()
    ours.weight.data[...] = rng.standard_normal(ours.weight.shape)
    ours.bias.data[...] = rng.standard_normal(ours.bias.shape)
    _copy_affine(torch, ours, ref)
    x = rng.standard_normal(shape) * 2 + 3
    g = rng.standard_normal(shape)
    xt = eo.tensor(x, requires_grad=True)
    out = ours(xt)
    out.backward(g)
    tx = torch.tensor(x, requires_grad=True)
    ref_out = ref(tx)
    ref_out.backward(torch.from_numpy(g))
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(xt.grad, tx.grad.numpy(), rtol=1e-9, atol=1e-10)
    np.testing.assert_allclose(ours.weight.grad, ref.weight.grad.numpy(), rtol=1e-10)
    np.testing.assert_allclose(ours.bias.grad, ref.bias.grad.numpy(), rtol=1e-10)


@pytest.mark.parametrize("affine", [True, False])
def test_layernorm_gradcheck(rng, affine):
    layer = eo.LayerNorm((2, 4), elementwise_affine=affine).to("float64")
    if affine:
        layer.weight.data[...] = rng.standard_normal((2, 4))
    assert eo.gradcheck(layer, rng.standard_normal((3, 2, 4)), params=list(layer.parameters()))


@pytest.mark.parametrize("make, shape", [(lambda: eo.LayerNorm(64), (8, 64)),
                                         (lambda: eo.BatchNorm1D(64), (8, 64)),
                                         (lambda: eo.BatchNorm2D(4), (8, 3, 3, 4))])
def test_norm_statistics_in_float32_for_float16_input(rng, make, shape):
    layer = make()
    # Values near 300: their squares (9e4) overflow float16, so float16 statistics would fail.
    x = (rng.standard_normal(shape) * 30 + 300).astype(np.float16)
    out = layer(eo.tensor(x))
    assert out.dtype == "float16"
    reference = make()(eo.tensor(x.astype(np.float32))).data
    assert np.all(np.isfinite(out.data))
    np.testing.assert_allclose(out.data.astype(np.float32), reference, atol=2e-2)
    if hasattr(layer, "running_var") and layer.running_var is not None:
        assert layer.running_var.dtype == np.float32 and np.all(np.isfinite(layer.running_var))


def test_norm_bad_inputs():
    with pytest.raises(eo.EveryOError, match=r"BatchNorm2D\(3\): expected NHWC input with 3 "
                                             r"channels.*\(2, 3, 5, 5\).*channels-first"):
        eo.BatchNorm2D(3)(eo.zeros(2, 3, 5, 5))
    with pytest.raises(eo.EveryOError, match=r"BatchNorm1D\(4\).*got shape \(2, 3\)"):
        eo.BatchNorm1D(4)(eo.zeros(2, 3))
    with pytest.raises(eo.EveryOError, match="more than one value per channel"):
        eo.BatchNorm1D(4)(eo.zeros(1, 4))
    # Regression: without running statistics batch statistics are used in eval mode too, and
    # a single sample silently normalised to zeros.
    untracked = eo.BatchNorm1D(4, track_running_stats=False)
    for layer in (untracked, untracked.eval()):
        with pytest.raises(eo.EveryOError, match=r"BatchNorm1D\(4\).*more than one value per "
                                                 r"channel.*\(1, 4\)"):
            layer(eo.randn(1, 4, seed=0))
    assert eo.BatchNorm1D(4).eval()(eo.randn(1, 4, seed=0)).shape == (1, 4)
    with pytest.raises(eo.EveryOError, match=r"LayerNorm\(8,\): expected input ending in "
                                             r"\(8,\), got shape \(2, 4\)"):
        eo.LayerNorm(8)(eo.zeros(2, 4))
    with pytest.raises(eo.EveryOError, match="floating-point input, got int64"):
        eo.LayerNorm(2)(eo.tensor(np.zeros((2, 2), np.int64)))


def test_an_evaluation_graph_keeps_the_statistics_it_used():
    # A training-mode call updates the running statistics in place; a graph built in
    # evaluation mode before it must still differentiate with the values it normalised by.
    rng = np.random.default_rng(0)
    bn = eo.BatchNorm1D(3)
    bn(eo.tensor(rng.standard_normal((8, 3)).astype(np.float32) * 3 + 2))
    bn.eval()
    data = rng.standard_normal((4, 3)).astype(np.float32)
    g = np.arange(12, dtype=np.float32).reshape(4, 3)
    fresh = eo.tensor(data, requires_grad=True)
    bn(fresh).backward(g)
    x = eo.tensor(data, requires_grad=True)
    out = bn(x)
    twice = eo.tensor(data, requires_grad=True)
    first, = eo.grad((bn(twice) ** 2).sum(), [twice], create_graph=True)
    expected_second = first.data.copy()
    late = eo.tensor(data, requires_grad=True)
    late_out = bn(late)
    bn.train()
    bn(eo.tensor(rng.standard_normal((8, 3)).astype(np.float32) * 10 + 5))
    out.backward(g)
    np.testing.assert_array_equal(x.grad, fresh.grad)
    second, = eo.grad((late_out ** 2).sum(), [late], create_graph=True)
    np.testing.assert_array_equal(second.data, expected_second)


def test_batchnorm_input_gradient_is_rounded_once_with_a_wider_weight():
    # (float16 input, float64 weight: the float64 gradient goes to float16 in one rounding, not
    # through a float32 buffer first; double rounding differs in ~5e-5 of the elements)
    rng = np.random.default_rng(0)
    x = eo.tensor(rng.standard_normal((50000, 8)).astype(np.float16), requires_grad=True)
    w = eo.tensor(rng.standard_normal(8) * 3, requires_grad=True)
    b = eo.tensor(rng.standard_normal(8), requires_grad=True)
    y = eo.dispatch("batch_norm", x, w, b, training=True)
    xhat, inv_std, weight = y._ctx.saved
    g = rng.standard_normal(y.shape).astype(np.float16)
    gy = g.astype(xhat.dtype)
    total = np.einsum("nc,nc->c", gy, xhat)
    expected = (gy - (gy.sum(axis=0) + xhat * total) / x.shape[0]) * (inv_std * weight)
    y.backward(g)
    assert expected.dtype == np.float64
    assert np.array_equal(x.grad, expected.astype(np.float16))


@pytest.mark.parametrize("dtype", ["float64", "float32"])
def test_layer_norm_without_bias_matches_torch(torch, rng, dtype):
    layer = eo.LayerNorm(6, bias=False).to(dtype)
    assert layer.bias is None and [n for n, _ in layer.named_parameters()] == ["weight"]
    layer.weight.data[...] = rng.standard_normal(6)
    ref = torch.nn.LayerNorm(6, bias=False, dtype=getattr(torch, dtype))
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(layer.weight.data))
    compare_with_torch(torch, layer, ref, [rng.standard_normal((4, 6))],
                       params=[(layer.weight, ref.weight)], dtype=dtype)


def _float64_reference(x, axes, groups=None):
    x = x.astype(np.float64)
    if groups:
        x = x.reshape(x.shape[0], -1, groups, x.shape[-1] // groups)
    mean = x.mean(axis=axes, keepdims=True)
    return (x - mean) / np.sqrt(((x - mean) ** 2).mean(axis=axes, keepdims=True) + 1e-5)


def test_float32_norms_within_3e6_of_float64(rng):
    """Channels-last statistics over many rows with a large mean: float32 output close to the
    float64 computation (summing sequentially in float32 misses by 1e-5 here)."""
    x = (rng.standard_normal((64, 8, 8, 16)) + 5).astype(np.float32)
    bn = eo.BatchNorm2D(16)(eo.tensor(x)).data
    assert np.abs(bn - _float64_reference(x, (0, 1, 2))).max() < 3e-6
    gn = eo.GroupNorm(4, 16)(eo.tensor(x)).data
    ref = _float64_reference(x, (1, 3), groups=4).reshape(x.shape)
    assert np.abs(gn - ref).max() < 3e-6
    wide = (rng.standard_normal((16, 4096)) + 100).astype(np.float32)
    ln = eo.LayerNorm(4096)(eo.tensor(wide)).data
    assert np.abs(ln - _float64_reference(wide, (-1,))).max() < 3e-6
    rms = eo.RMSNorm(4096, eps=1e-5)(eo.tensor(wide)).data
    w64 = wide.astype(np.float64)
    assert np.abs(rms - w64 / np.sqrt((w64 ** 2).mean(-1, keepdims=True) + 1e-5)).max() < 3e-6


RUNNING = (np.array([0.1, -0.2, 0.3]), np.array([0.9, 1.3, 0.7]))
SECOND_ORDER = [
    ("layer_norm",
     lambda x, w, b: eo.dispatch("layer_norm", x, w, b, ndims=1, eps=1e-5),
     lambda x, w, b: F().layer_norm(x, (4,), w, b, eps=1e-5),
     [normal(3, 4), normal(4), normal(4)]),
    ("batch_norm_training",
     lambda x, w, b: eo.dispatch("batch_norm", x, w, b, training=True, eps=1e-5),
     lambda x, w, b: F().batch_norm(x, None, None, w, b, training=True, eps=1e-5),
     [normal(5, 3), normal(3), normal(3)]),
    ("batch_norm_eval",
     lambda x, w, b: eo.dispatch("batch_norm", x, w, b, running_mean=RUNNING[0],
                                 running_var=RUNNING[1], training=False, eps=1e-5),
     lambda x, w, b: F().batch_norm(x, T().tensor(RUNNING[0]),
                                     T().tensor(RUNNING[1]), w, b, training=False,
                                     eps=1e-5),
     [normal(5, 3), normal(3), normal(3)]),
]

test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))
