"""Conv2D and the padding resolver: gradcheck, PyTorch oracle (NHWC <-> NCHW) for first,
second and third derivatives, shape properties and the errors a user meets first."""

from __future__ import annotations

import math

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import everyo as eo
from everyo_layers.padding import output_size, resolve_padding
from support.second_order import (
    F,
    assert_composite_reproduces,
    nchw,
    nhwc,
    normal,
    second_order_tests,
)


def torch_conv_reference(torch, layer, x, g):
    """Forward output and gradients (x, weight, bias) of the same convolution in PyTorch."""
    F = torch.nn.functional
    pads = resolve_padding(layer.padding, x.shape[1:3], layer.kernel_size, layer.stride,
                           layer.dilation)
    (top, bottom), (left, right) = pads
    tx = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    tw = torch.tensor(layer.weight.data.transpose(3, 2, 0, 1), requires_grad=True)
    tb = torch.tensor(layer.bias.data, requires_grad=True)
    out = F.conv2d(F.pad(tx, (left, right, top, bottom)), tw, tb, stride=layer.stride,
                   dilation=layer.dilation)
    out.backward(torch.from_numpy(g.transpose(0, 3, 1, 2)))
    return (out.detach().numpy().transpose(0, 2, 3, 1), tx.grad.numpy().transpose(0, 2, 3, 1),
            tw.grad.numpy().transpose(2, 3, 1, 0), tb.grad.numpy())


CASES = [  # (H, W, kernel, stride, padding, dilation)
    (7, 7, 3, 1, "valid", 1),
    (8, 8, 3, 1, "same", 1),
    (7, 9, 3, 2, "same", 1),
    (8, 8, 4, 2, "same", 1),   # even kernel: the odd pad goes bottom/right
    (8, 6, 2, 2, "valid", 1),
    (9, 9, 3, 1, "same", 2),   # dilation
    (10, 8, (3, 2), (2, 1), "valid", (2, 1)),
    (6, 6, 3, 1, 1, 1),        # explicit symmetric padding
    (6, 7, 3, 2, ((0, 2), (1, 0)), 1),  # explicit asymmetric padding
    (5, 5, 1, 1, "valid", 1),  # 1x1 convolution
]


@pytest.mark.parametrize("h, w, kernel, stride, padding, dilation", CASES)
def test_conv2d_matches_torch(torch, rng, h, w, kernel, stride, padding, dilation):
    layer = eo.Conv2D(3, 5, kernel, stride=stride, padding=padding, dilation=dilation,
                      seed=1).to("float64")
    x = rng.standard_normal((2, h, w, 3))
    ours_x = eo.tensor(x, requires_grad=True)
    out = layer(ours_x)
    g = rng.standard_normal(out.shape)
    out.backward(g)
    ref_out, ref_gx, ref_gw, ref_gb = torch_conv_reference(torch, layer, x, g)
    assert out.shape == ref_out.shape
    np.testing.assert_allclose(out.data, ref_out, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ours_x.grad, ref_gx, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(layer.weight.grad, ref_gw, rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(layer.bias.grad, ref_gb, rtol=1e-10, atol=1e-10)


def test_conv2d_float32_matches_torch(torch, rng):
    layer = eo.Conv2D(4, 6, 3, stride=2, padding="same", seed=0)
    x = rng.standard_normal((3, 9, 9, 4)).astype(np.float32)
    out = layer(eo.tensor(x))
    assert out.dtype == "float32"
    ref = torch_conv_reference(torch, layer, x, np.zeros(out.shape, np.float32))[0]
    np.testing.assert_allclose(out.data, ref, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("stride, padding, dilation", [(1, "valid", 1), (2, "same", 1),
                                                        (1, "same", 2), (2, 1, 1)])
def test_conv2d_gradcheck(rng, stride, padding, dilation):
    layer = eo.Conv2D(2, 3, 3, stride=stride, padding=padding, dilation=dilation,
                      seed=0).to("float64")
    x = rng.standard_normal((2, 6, 5, 2))
    assert eo.gradcheck(layer, x, params=list(layer.parameters()))


def test_conv2d_without_bias_gradcheck(rng):
    layer = eo.Conv2D(2, 2, 2, bias=False, seed=0).to("float64")
    assert layer.bias is None
    assert eo.gradcheck(layer, rng.standard_normal((1, 4, 4, 2)), params=[layer.weight])


@pytest.mark.filterwarnings("ignore:Using padding=.same. with even kernel")
@pytest.mark.parametrize("kernel, dilation", [(3, 1), (4, 1), (5, 2), (2, 3)])
def test_same_padding_agrees_with_torch_at_stride_one(torch, rng, kernel, dilation):
    layer = eo.Conv2D(2, 3, kernel, padding="same", dilation=dilation, seed=0).to("float64")
    x = rng.standard_normal((1, 9, 8, 2))
    ref = torch.nn.functional.conv2d(torch.tensor(x.transpose(0, 3, 1, 2)),
                                     torch.tensor(layer.weight.data.transpose(3, 2, 0, 1)),
                                     torch.tensor(layer.bias.data), padding="same",
                                     dilation=dilation)
    np.testing.assert_allclose(layer(eo.tensor(x)).data,
                               ref.numpy().transpose(0, 2, 3, 1), rtol=1e-10, atol=1e-10)


@settings(max_examples=200, deadline=None)
@given(size=st.integers(1, 40), kernel=st.integers(1, 7), stride=st.integers(1, 4),
       dilation=st.integers(1, 3))
def test_same_padding_gives_ceil_of_input_over_stride(size, kernel, stride, dilation):
    (top, bottom), _ = resolve_padding("same", (size, 1), (kernel, 1), (stride, 1),
                                       (dilation, 1))
    assert 0 <= bottom - top <= 1  # the odd pad goes to the bottom
    assert output_size(size, kernel, stride, dilation, (top, bottom)) == math.ceil(size / stride)


@settings(max_examples=60, deadline=None)
@given(h=st.integers(3, 9), w=st.integers(3, 9), kernel=st.integers(1, 3),
       stride=st.integers(1, 3), padding=st.sampled_from(["valid", "same", 0, 1]))
def test_conv2d_output_shape_property(h, w, kernel, stride, padding):
    layer = eo.Conv2D(1, 2, kernel, stride=stride, padding=padding, seed=0)
    out = layer(eo.zeros(1, h, w, 1))
    if padding == "same":
        assert out.shape == (1, math.ceil(h / stride), math.ceil(w / stride), 2)
    else:
        p = 0 if padding == "valid" else padding
        assert out.shape == (1, (h + 2 * p - kernel) // stride + 1,
                             (w + 2 * p - kernel) // stride + 1, 2)


def test_resolve_padding_forms():
    assert resolve_padding("valid", (5, 5), (3, 3)) == ((0, 0), (0, 0))
    assert resolve_padding("SAME", (5, 5), (3, 3)) == ((1, 1), (1, 1))
    assert resolve_padding((1, 2), (5, 5), (3, 3)) == ((1, 1), (2, 2))
    assert resolve_padding(((0, 1), (2, 3)), (5, 5), (3, 3)) == ((0, 1), (2, 3))
    with pytest.raises(eo.EveryOError, match="padding must be"):
        resolve_padding("full", (5, 5), (3, 3))
    with pytest.raises(eo.EveryOError, match="negative"):
        resolve_padding(-1, (5, 5), (3, 3))
    # Regression: NumPy integers (pads computed with NumPy) were refused as not ints.
    assert resolve_padding(np.int64(1), (5, 5), (3, 3)) == ((1, 1), (1, 1))
    pads = resolve_padding((np.int64(1), np.int32(2)), (5, 5), (3, 3))
    assert pads == ((1, 1), (2, 2)) and all(type(p) is int for side in pads for p in side)
    with pytest.raises(eo.EveryOError, match="padding must be"):
        resolve_padding(1.5, (5, 5), (3, 3))


def test_conv2d_weight_layout_and_init():
    layer = eo.Conv2D(3, 8, (3, 5), seed=0)
    assert layer.weight.shape == (3, 5, 3, 8) and layer.bias.shape == (8,)
    assert np.abs(layer.weight.data).max() <= 1 / math.sqrt(3 * 3 * 5)
    assert (layer.kernel_size, layer.stride, layer.dilation) == ((3, 5), (1, 1), (1, 1))
    assert layer.padding == "valid"


def test_conv2d_float16_multiplies_through_float32(rng):
    layer = eo.Conv2D(3, 4, 3, padding="same", seed=0)
    x16 = rng.standard_normal((2, 6, 6, 3)).astype(np.float16)
    w16 = layer.weight.data.astype(np.float16)
    b16 = layer.bias.data.astype(np.float16)
    out = eo.dispatch("conv2d", x16, w16, b16, stride=(1, 1), padding=((1, 1), (1, 1)),
                      dilation=(1, 1))
    assert out.dtype == "float16"
    reference = eo.dispatch("conv2d", x16.astype(np.float32), w16.astype(np.float32),
                            b16.astype(np.float32), stride=(1, 1), padding=((1, 1), (1, 1)),
                            dilation=(1, 1)).data
    # float32 accumulation with the bias, then ONE rounding to float16 (as matmul does)
    np.testing.assert_array_equal(out.data, reference.astype(np.float16))


def test_conv2d_nchw_input_is_refused_with_a_hint():
    layer = eo.Conv2D(3, 8, 3)
    with pytest.raises(eo.EveryOError) as info:
        layer(eo.zeros(2, 3, 8, 8))
    message = str(info.value)
    assert "Conv2D(3→8)" in message and "3 channels" in message
    assert "(2, 3, 8, 8)" in message and "NCHW" in message


def test_conv2d_bad_inputs():
    layer = eo.Conv2D(3, 8, 3)
    with pytest.raises(eo.EveryOError, match=r"expected NHWC input.*\(8, 8, 3\)"):
        layer(eo.zeros(8, 8, 3))
    with pytest.raises(eo.EveryOError, match="floating-point input, got int64"):
        layer(eo.tensor(np.zeros((1, 5, 5, 3), np.int64)))
    with pytest.raises(eo.EveryOError, match="does not fit"):
        layer(eo.zeros(1, 2, 2, 3))
    with pytest.raises(eo.EveryOError, match="kernel_size must be an int or a pair"):
        eo.Conv2D(3, 8, "big")


def test_the_conv2d_op_takes_the_layers_argument_forms(rng):
    # Regression: eo.conv2d(x, w, stride=2) (or padding="same", an int dilation) died in a
    # TypeError inside the op, which only understood the layer's pre-resolved tuples.
    x = eo.tensor(rng.standard_normal((2, 7, 6, 3)))
    w = eo.tensor(rng.standard_normal((3, 3, 3, 4)))
    b = eo.tensor(rng.standard_normal(4))
    for options in ({"stride": 2, "padding": "same"}, {"padding": 1, "dilation": 2},
                    {"stride": (2, 1), "padding": ((1, 0), (0, 1))}):
        layer = eo.Conv2D(3, 4, 3, **options).to("float64")
        layer.weight.data[...], layer.bias.data[...] = w.data, b.data
        np.testing.assert_array_equal(eo.conv2d(x, w, b, **options).data, layer(x).data)
    with pytest.raises(eo.EveryOError, match=r"conv2d: input \(7, 6, 3\) \(NHWC\) and weight"):
        eo.conv2d(x[0], w)
    with pytest.raises(eo.EveryOError, match=r"conv2d: bias of shape \(3,\) does not fit"):
        eo.conv2d(x, w, b[:3])
    with pytest.raises(eo.EveryOError, match="padding must be 'valid', 'same'"):
        eo.conv2d(x, w, padding="full")


def test_float16_conv2d_input_gradient_is_the_float32_sum_rounded_once():
    rng = np.random.default_rng(7)
    x = rng.standard_normal((2, 6, 6, 3)).astype(np.float16)
    w = rng.standard_normal((3, 3, 3, 4)).astype(np.float16)
    g = rng.standard_normal((2, 6, 6, 4)).astype(np.float16)
    b = rng.standard_normal(4).astype(np.float16)
    x16, w16 = eo.tensor(x, requires_grad=True), eo.tensor(w, requires_grad=True)
    y16 = eo.conv2d(x16, w16, eo.tensor(b), stride=2, padding="same")
    y16.backward(g[:, ::2, ::2])
    x32 = eo.tensor(x.astype(np.float32), requires_grad=True)
    w32 = eo.tensor(w.astype(np.float32), requires_grad=True)
    y32 = eo.conv2d(x32, w32, eo.tensor(b.astype(np.float32)), stride=2, padding="same")
    y32.backward(g[:, ::2, ::2].astype(np.float32))
    assert y16.dtype == "float16" and x16.grad.dtype == np.float16 and w16.grad.dtype == np.float16
    # float16 inputs, float32 products and sums (bias included), one rounding at the end
    np.testing.assert_array_equal(y16.data, y32.data.astype(np.float16))
    np.testing.assert_array_equal(x16.grad, x32.grad.astype(np.float16))
    np.testing.assert_array_equal(w16.grad, w32.grad.astype(np.float16))


SAME = ((1, 1), (1, 1))
SECOND_ORDER = [
    ("conv2d_same_bias",
     lambda x, w, b: eo.dispatch("conv2d", x, w, b, stride=(1, 1), padding=SAME),
     lambda x, w, b: nhwc(F().conv2d(nchw(x), w.permute(3, 2, 0, 1), b, padding=1)),
     [normal(2, 4, 4, 2), normal(3, 3, 2, 3), normal(3)]),
    ("conv2d_one_row_dilated_bias",  # (the one-row path, conv_rows.py: Conv1D's)
     lambda x, w, b: eo.dispatch("conv2d", x, w, b, padding=((0, 0), (2, 2)), dilation=(1, 2)),
     lambda x, w, b: nhwc(F().conv2d(nchw(x), w.permute(3, 2, 0, 1), b, padding=(0, 2),
                                     dilation=(1, 2))),
     [normal(2, 1, 7, 2), normal(1, 3, 2, 3), normal(3)]),
    ("conv2d_stride2_dilation",
     lambda x, w: eo.dispatch("conv2d", x, w, stride=(2, 2), dilation=(2, 1)),
     lambda x, w: nhwc(F().conv2d(nchw(x), w.permute(3, 2, 0, 1), stride=2, dilation=(2, 1))),
     [normal(1, 7, 6, 2), normal(2, 2, 2, 2)]),
]

test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))


@pytest.mark.torch
def test_third_order_through_conv2d_and_max_pool_matches_pytorch(torch):
    """The gradient ops of conv2d and max_pool2d are differentiable themselves."""
    rng = np.random.default_rng(5)
    x, w = rng.standard_normal((2, 6, 6, 2)), rng.standard_normal((3, 3, 2, 3)) * 0.5

    def chain(lib, conv, pool, x, w):
        out = lib.tanh(pool(conv(x, w)))
        (gx,) = grad(lib)(out.sum(), [x])
        (gw,) = grad(lib)((gx * gx).sum(), [w])
        return grad(lib, last=True)((gw * gw).sum(), [x])[0]

    def grad(lib, last=False):
        if lib is eo:
            return lambda y, xs: eo.grad(y, xs, create_graph=not last)
        return lambda y, xs: torch.autograd.grad(y, xs, create_graph=not last)

    ours = chain(eo, lambda a, b: eo.dispatch("conv2d", a, b, stride=(1, 1), padding=SAME),
                 lambda a: eo.dispatch("max_pool2d", a, pool_size=(2, 2)),
                 eo.tensor(x, requires_grad=True), eo.tensor(w, requires_grad=True))
    theirs = chain(torch, lambda a, b: nhwc(F().conv2d(nchw(a), b.permute(3, 2, 0, 1),
                                                         padding=1)),
                   lambda a: nhwc(F().max_pool2d(nchw(a), 2)),
                   torch.tensor(x, requires_grad=True), torch.tensor(w, requires_grad=True))
    np.testing.assert_allclose(ours.data, theirs.numpy(), rtol=1e-9, atol=1e-10)


def test_the_conv2d_composite_reproduces_the_fused_forward(rng):
    assert_composite_reproduces(
        "conv2d", {"stride": (2, 1), "padding": SAME, "dilation": (1, 2)},
        [rng.standard_normal((2, 5, 6, 2)), rng.standard_normal((3, 3, 2, 4)),
         rng.standard_normal(4)])
