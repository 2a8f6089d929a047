"""MaxPool2D and AvgPool2D: gradcheck, PyTorch oracle (incl. "same" padding and
count_include_pad) for first and second derivatives, and errors."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import everyo as eo
from everyo_layers.padding import resolve_padding
from support.second_order import (
    F,
    assert_composite_reproduces,
    distinct,
    nchw,
    nhwc,
    normal,
    second_order_tests,
)
from support.torch_oracle import compare_with_torch

CASES = [  # (H, W, pool, stride, padding)
    (8, 8, 2, None, "valid"),      # tiles: the reshape path
    (7, 9, 2, None, "valid"),      # remainder rows/columns are dropped
    (7, 7, 3, 2, "valid"),         # overlapping windows
    (7, 8, 3, 1, "same"),
    (7, 7, 2, None, "same"),       # the odd pad on the bottom/right
    (6, 9, (2, 3), (1, 2), "same"),
    (6, 6, 3, 3, 1),
]


def torch_pool_reference(torch, kind, layer, x, g):
    """PyTorch's result with the same (possibly asymmetric) pads applied explicitly."""
    F = torch.nn.functional
    (top, bottom), (left, right) = resolve_padding(layer.padding, x.shape[1:3],
                                                   layer.pool_size, layer.stride)
    tx = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    pads = (left, right, top, bottom)
    if kind == "max":
        out = F.max_pool2d(F.pad(tx, pads, value=-float("inf")), layer.pool_size, layer.stride)
    else:  # Keras semantics: the mean over the real (unpadded) elements of each window
        total = F.avg_pool2d(F.pad(tx, pads), layer.pool_size, layer.stride, divisor_override=1)
        ones = torch.ones_like(tx[:1, :1])
        count = F.avg_pool2d(F.pad(ones, pads), layer.pool_size, layer.stride,
                             divisor_override=1)
        out = total / count
    out.backward(torch.from_numpy(g.transpose(0, 3, 1, 2)))
    return out.detach().numpy().transpose(0, 2, 3, 1), tx.grad.numpy().transpose(0, 2, 3, 1)


@pytest.mark.parametrize("kind", ["max", "avg"])
@pytest.mark.parametrize("h, w, pool, stride, padding", CASES)
def test_pool_matches_torch(torch, rng, kind, h, w, pool, stride, padding):
    cls = eo.MaxPool2D if kind == "max" else eo.AvgPool2D
    layer = cls(pool, stride=stride, padding=padding)
    x = rng.standard_normal((2, h, w, 3))
    ours = eo.tensor(x, requires_grad=True)
    out = layer(ours)
    g = rng.standard_normal(out.shape)
    out.backward(g)
    ref_out, ref_gx = torch_pool_reference(torch, kind, layer, x, g)
    assert out.shape == ref_out.shape
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ours.grad, ref_gx, rtol=1e-12, atol=1e-12)


def test_avg_pool_same_padding_matches_torch_count_exclude_pad(torch, rng):
    # With symmetric pads, torch's own count_include_pad=False is the same rule.
    x = rng.standard_normal((2, 7, 7, 3))
    ours = eo.AvgPool2D(3, stride=1, padding="same")(eo.tensor(x)).data
    ref = torch.nn.functional.avg_pool2d(torch.tensor(x.transpose(0, 3, 1, 2)), 3, 1, 1,
                                         count_include_pad=False)
    np.testing.assert_allclose(ours, ref.numpy().transpose(0, 2, 3, 1), rtol=1e-12)


@pytest.mark.parametrize("cls", [eo.MaxPool2D, eo.AvgPool2D])
@pytest.mark.parametrize("pool, stride, padding", [(2, None, "valid"), (3, 2, "same"),
                                                   (2, 1, "valid")])
def test_pool_gradcheck(rng, cls, pool, stride, padding):
    x = rng.permutation(2 * 5 * 6 * 2).reshape(2, 5, 6, 2) / 7.0  # distinct values: no ties
    assert eo.gradcheck(cls(pool, stride=stride, padding=padding), x)


def test_max_pool_ties_send_the_gradient_to_the_first_maximum(torch):
    x = np.zeros((1, 2, 2, 1))
    ours = eo.tensor(x, requires_grad=True)
    eo.MaxPool2D(2)(ours).sum().backward()
    tx = torch.zeros(1, 1, 2, 2, dtype=torch.float64, requires_grad=True)
    torch.nn.functional.max_pool2d(tx, 2).sum().backward()
    np.testing.assert_array_equal(ours.grad[0, :, :, 0], tx.grad.numpy()[0, 0])
    assert ours.grad.sum() == 1.0


def test_pool_keeps_float16():
    x = eo.randn(2, 4, 4, 3, seed=0, dtype="float16")
    assert eo.MaxPool2D(2)(x).dtype == "float16"
    out = eo.AvgPool2D(2)(x)
    assert out.dtype == "float16"
    expected = x.data.astype(np.float32).reshape(2, 2, 2, 2, 2, 3).mean(axis=(2, 4))
    np.testing.assert_array_equal(out.data, expected.astype(np.float16))


def test_pool_attributes():
    layer = eo.MaxPool2D(3)
    assert (layer.pool_size, layer.stride, layer.padding) == ((3, 3), (3, 3), "valid")
    layer = eo.AvgPool2D((2, 3), stride=1, padding="same")
    assert (layer.pool_size, layer.stride, layer.padding) == ((2, 3), (1, 1), "same")


def test_pool_bad_inputs():
    with pytest.raises(eo.EveryOError, match=r"MaxPool2D\(2, 2\): expected NHWC input"):
        eo.MaxPool2D(2)(eo.zeros(4, 4, 3))
    with pytest.raises(eo.EveryOError, match="does not fit"):
        eo.AvgPool2D(3)(eo.zeros(1, 2, 2, 1))
    with pytest.raises(eo.EveryOError, match="smaller than the pool size"):
        eo.MaxPool2D(2, padding=2)(eo.zeros(1, 4, 4, 1))
    with pytest.raises(eo.EveryOError, match="floating-point input"):
        eo.MaxPool2D(2)(eo.tensor(np.zeros((1, 4, 4, 1), np.int32)))


@settings(max_examples=60, deadline=None)
@given(h=st.integers(1, 9), w=st.integers(1, 9), pool=st.integers(1, 3),
       stride=st.integers(1, 3), value=st.floats(-5, 5))
def test_same_pooling_shape_and_padding_exclusion_property(h, w, pool, stride, value):
    x = eo.full(2, h, w, 3, fill_value=value)
    avg = eo.AvgPool2D(pool, stride=stride, padding="same")(x)
    top = eo.MaxPool2D(pool, stride=stride, padding="same")(x)
    expected_shape = (2, math.ceil(h / stride), math.ceil(w / stride), 3)
    assert avg.shape == top.shape == expected_shape
    # padding never enters a result: a constant image pools to the same constant everywhere
    np.testing.assert_allclose(avg.data, np.float32(value), rtol=1e-6, atol=1e-6)
    np.testing.assert_array_equal(top.data, np.float32(value))


@pytest.mark.parametrize("name, cls", [("max_pool2d", eo.MaxPool2D), ("avg_pool2d", eo.AvgPool2D)])
def test_the_pool_ops_take_the_layers_argument_forms(rng, name, cls):
    # Regression: eo.max_pool2d(x, pool_size=3) died in a TypeError inside the op.
    x = eo.tensor(rng.standard_normal((2, 7, 5, 3)))
    op = getattr(eo, name)
    for pool, options in ((3, {}), (2, {"stride": 1}), (3, {"stride": 2, "padding": "same"}),
                          ((2, 3), {"padding": 1})):
        expected = cls(pool, **options)(x).data
        np.testing.assert_array_equal(op(x, pool_size=pool, **options).data, expected)
    with pytest.raises(eo.EveryOError, match=rf"{name}: padding 2 resolves to .* smaller than "
                                             r"the pool size \(2, 2\)"):
        op(x, pool_size=2, padding=2)


@pytest.mark.parametrize("pool_size,stride", [(2, 2), (3, 2)])
def test_float16_max_pool_gradient_is_the_float32_one_exactly(pool_size, stride):
    rng = np.random.default_rng(5)
    x = rng.standard_normal((2, 7, 7, 3)).astype(np.float16)
    out_side = (7 - pool_size) // stride + 1
    g = rng.standard_normal((2, out_side, out_side, 3)).astype(np.float16)
    grads = []
    for dtype in (np.float16, np.float32):
        t = eo.tensor(x.astype(dtype), requires_grad=True)
        eo.max_pool2d(t, pool_size=pool_size, stride=stride).backward(g.astype(dtype))
        grads.append(t.grad)
    assert grads[0].dtype == np.float16
    np.testing.assert_array_equal(grads[0], grads[1].astype(np.float16))


DTYPES = ["float64", "float32"]


def nchw_function(fn):
    """A torch function on NCHW wrapped to take and return NHWC."""
    return lambda t: fn(t.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("pool, stride, padding", [(3, 2, "same"), (3, 1, 1), (2, 2, "same")])
def test_avg_pool_count_include_pad_matches_torch(torch, rng, dtype, pool, stride, padding):
    x = rng.standard_normal((2, 7, 6, 3))
    layer = eo.AvgPool2D(pool, stride, padding=padding, count_include_pad=True)
    (top, bottom), (left, right) = resolve_padding(padding, x.shape[1:3], layer.pool_size,
                                                   layer.stride)
    F = torch.nn.functional
    ref = nchw_function(lambda t: F.avg_pool2d(F.pad(t, (left, right, top, bottom)), pool, stride))
    compare_with_torch(torch, layer, ref, [x], dtype=dtype)


SAME = ((1, 1), (1, 1))
SECOND_ORDER = [
    ("max_pool2d",
     lambda x: eo.dispatch("max_pool2d", x, pool_size=(2, 2)),
     lambda x: nhwc(F().max_pool2d(nchw(x), 2)), [distinct(2, 4, 4, 2)]),
    ("max_pool2d_overlapping",
     lambda x: eo.dispatch("max_pool2d", x, pool_size=(3, 3), stride=(1, 1)),
     lambda x: nhwc(F().max_pool2d(nchw(x), 3, stride=1)), [distinct(1, 5, 4, 2)]),
    ("avg_pool2d",
     lambda x: eo.dispatch("avg_pool2d", x, pool_size=(2, 2)),
     lambda x: nhwc(F().avg_pool2d(nchw(x), 2)), [normal(2, 4, 4, 2)]),
    ("avg_pool2d_padded",
     lambda x: eo.dispatch("avg_pool2d", x, pool_size=(3, 3), stride=(1, 1), padding=SAME),
     lambda x: nhwc(F().avg_pool2d(nchw(x), 3, stride=1, padding=1, count_include_pad=False)),
     [normal(1, 4, 3, 2)]),
]

test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))


@pytest.mark.parametrize("name, attrs", [
    ("max_pool2d", {"pool_size": (2, 2), "stride": (1, 1), "padding": ((0, 1), (1, 0))}),
    ("avg_pool2d", {"pool_size": (3, 2), "padding": SAME}),
])
def test_the_pool_composites_reproduce_the_fused_forward(rng, name, attrs):
    assert_composite_reproduces(name, attrs, [rng.standard_normal((2, 5, 6, 2))])
