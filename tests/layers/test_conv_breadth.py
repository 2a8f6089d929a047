"""Grouped/depthwise/dilated Conv2D, Conv1D and Conv2DTranspose against PyTorch and gradcheck."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_layers.conv_transpose import transpose_output_size
from everyo_layers.padding import resolve_padding
from support.torch_oracle import assert_composite_matches, compare_with_torch, leaf

DTYPES = ["float64", "float32"]

GROUPED = [  # (cin, cout, kernel, stride, padding, dilation, groups)
    (4, 4, 3, 1, "same", 1, 4),     # depthwise
    (4, 8, 3, 2, "same", 1, 4),     # depthwise, channel multiplier 2
    (6, 6, 3, 1, "same", 2, 6),     # dilated depthwise, TF-style same
    (6, 4, 3, 1, "valid", 1, 2),    # two groups
    (6, 9, (3, 2), (2, 1), 1, (2, 1), 3),
    (4, 6, 3, 1, "same", 2, 1),     # dilated, no groups
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("cin, cout, kernel, stride, padding, dilation, groups", GROUPED)
def test_grouped_conv2d_matches_torch(torch, rng, dtype, cin, cout, kernel, stride, padding,
                                      dilation, groups):
    layer = eo.Conv2D(cin, cout, kernel, stride=stride, padding=padding, dilation=dilation,
                      groups=groups, seed=1).to(dtype)
    x = rng.standard_normal((2, 9, 8, cin))
    F = torch.nn.functional
    (top, bottom), (left, right) = resolve_padding(padding, x.shape[1:3], layer.kernel_size,
                                                   layer.stride, layer.dilation)
    tw = leaf(torch, layer.weight.data.transpose(3, 2, 0, 1), dtype)
    tb = leaf(torch, layer.bias.data, dtype)

    def reference(tx):
        out = F.conv2d(F.pad(tx.permute(0, 3, 1, 2), (left, right, top, bottom)), tw, tb,
                       stride=layer.stride, dilation=layer.dilation, groups=groups)
        return out.permute(0, 2, 3, 1)

    compare_with_torch(torch, layer, reference, [x], dtype=dtype)
    np.testing.assert_allclose(layer.weight.grad, tw.grad.numpy().transpose(2, 3, 1, 0),
                               rtol=1e-4 if dtype == "float32" else 1e-10, atol=1e-4)
    np.testing.assert_allclose(layer.bias.grad, tb.grad.numpy(), rtol=1e-4, atol=1e-4)


@pytest.mark.parametrize("groups", [1, 2, 4])
def test_grouped_conv2d_gradcheck(rng, groups):
    layer = eo.Conv2D(4, 4, 3, stride=2, padding="same", dilation=1, groups=groups,
                      seed=0).to("float64")
    assert eo.gradcheck(layer, rng.standard_normal((2, 5, 6, 4)), params=list(layer.parameters()))


def test_conv_groups_must_divide_channels():
    with pytest.raises(eo.EveryOError, match=r"Conv2D: groups=3 must divide"):
        eo.Conv2D(4, 6, 3, groups=3)
    with pytest.raises(eo.EveryOError, match=r"Conv1D: groups=4 must divide"):
        eo.Conv1D(4, 6, 3, groups=4)
    with pytest.raises(eo.EveryOError, match=r"Conv2D\(4→4\): expected NHWC input with 4"):
        eo.Conv2D(4, 4, 3, groups=4)(eo.zeros(1, 5, 5, 3))


CONV1D = [  # (kernel, stride, padding, dilation, groups)
    (5, 1, "same", 2, 1), (3, 2, "valid", 1, 1), (3, 1, "causal", 2, 1), (3, 1, "same", 1, 4),
    (4, 1, (2, 1), 1, 2),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("kernel, stride, padding, dilation, groups", CONV1D)
def test_conv1d_matches_torch(torch, rng, dtype, kernel, stride, padding, dilation, groups):
    layer = eo.Conv1D(4, 8, kernel, stride=stride, padding=padding, dilation=dilation,
                      groups=groups, seed=2).to(dtype)
    x = rng.standard_normal((3, 11, 4))
    (_, _), (left, right) = layer.pads_2d(padding, x.shape[1])
    F = torch.nn.functional
    tw = leaf(torch, layer.weight.data.transpose(2, 1, 0), dtype)
    tb = leaf(torch, layer.bias.data, dtype)

    def reference(tx):
        out = F.conv1d(F.pad(tx.permute(0, 2, 1), (left, right)), tw, tb, stride=stride,
                       dilation=dilation, groups=groups)
        return out.permute(0, 2, 1)

    compare_with_torch(torch, layer, reference, [x], dtype=dtype)
    np.testing.assert_allclose(layer.weight.grad, tw.grad.numpy().transpose(2, 1, 0),
                               rtol=1e-4, atol=1e-4)


def test_conv1d_gradcheck_and_errors(rng):
    layer = eo.Conv1D(2, 3, 3, padding="causal", dilation=2, seed=0).to("float64")
    assert eo.gradcheck(layer, rng.standard_normal((2, 7, 2)), params=list(layer.parameters()))
    with pytest.raises(eo.EveryOError, match=r"Conv1D\(2→3\): expected NWC input with 2"):
        layer(eo.zeros(2, 2, 7))
    with pytest.raises(eo.EveryOError, match=r"Conv1D\(2→3\): a kernel of 3"):
        eo.Conv1D(2, 3, 3)(eo.zeros(1, 2, 2))


TRANSPOSE = [  # (H, W, kernel, stride, padding)
    (4, 5, 4, 2, "same"), (4, 5, 3, 2, "same"), (3, 3, 3, 2, "valid"), (3, 4, 2, 3, "valid"),
    (3, 4, 2, 3, "same"), (5, 4, (3, 2), (1, 2), "valid"),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h, w, kernel, stride, padding", TRANSPOSE)
def test_conv2d_transpose_matches_torch(torch, rng, dtype, h, w, kernel, stride, padding):
    layer = eo.Conv2DTranspose(3, 5, kernel, stride=stride, padding=padding, seed=3).to(dtype)
    x = rng.standard_normal((2, h, w, 3))
    F = torch.nn.functional
    tw = leaf(torch, layer.weight.data.transpose(3, 2, 0, 1), dtype)
    tb = leaf(torch, layer.bias.data, dtype)
    sizes = [transpose_output_size(n, k, s, padding)
             for n, k, s in zip((h, w), layer.kernel_size, layer.stride)]

    def reference(tx):
        full = F.conv_transpose2d(tx.permute(0, 3, 1, 2), tw, None, stride=layer.stride)
        # the trailing zeros Keras adds when stride > kernel
        extra = [max(c + o - f, 0) for (o, c), f in zip(sizes, full.shape[2:])]
        full = F.pad(full, (0, extra[1], 0, extra[0]))
        (ho, top), (wo, left) = sizes
        return (full[:, :, top:top + ho, left:left + wo] + tb[:, None, None]).permute(0, 2, 3, 1)

    out = compare_with_torch(torch, layer, reference, [x], dtype=dtype)
    assert out.shape == (2, h * layer.stride[0] if padding == "same" else
                         h * layer.stride[0] + max(layer.kernel_size[0] - layer.stride[0], 0),
                         sizes[1][0], 5)
    np.testing.assert_allclose(layer.weight.grad, tw.grad.numpy().transpose(2, 3, 1, 0),
                               rtol=1e-4, atol=1e-4)


def test_conv2d_transpose_gradcheck_and_errors(rng):
    layer = eo.Conv2DTranspose(2, 3, 3, stride=2, padding="same", seed=0).to("float64")
    assert eo.gradcheck(layer, rng.standard_normal((2, 3, 4, 2)), params=list(layer.parameters()))
    with pytest.raises(eo.EveryOError, match=r"Conv2DTranspose\(2→3\): expected NHWC input"):
        layer(eo.zeros(1, 3, 3, 3))
    with pytest.raises(eo.EveryOError, match="Conv2DTranspose: padding must be"):
        eo.Conv2DTranspose(2, 3, 3, padding="full")


@pytest.mark.parametrize("groups, cout", [(4, 4), (4, 8), (2, 6)])
def test_grouped_conv2d_composite_matches_kernel(rng, groups, cout):
    layer = eo.Conv2D(4, cout, 3, stride=2, padding="same", dilation=1, groups=groups,
                      seed=0).to("float64")
    assert_composite_matches(layer(eo.tensor(rng.standard_normal((2, 5, 6, 4)),
                                             requires_grad=True)))


@pytest.mark.parametrize("kernel, stride, padding", [(4, 2, "same"), (3, 2, "same"),
                                                     (2, 3, "valid"), ((3, 2), (1, 2), "valid")])
def test_conv2d_transpose_composite_matches_kernel(rng, kernel, stride, padding):
    layer = eo.Conv2DTranspose(3, 2, kernel, stride=stride, padding=padding, seed=0).to("float64")
    assert_composite_matches(layer(eo.tensor(rng.standard_normal((2, 3, 4, 3)),
                                             requires_grad=True)))


def test_float16_input_computes_in_float32_and_rounds_once(rng):
    """float16 input: the result is the float32 computation rounded to float16 once."""
    x = rng.standard_normal((2, 6, 6, 4)).astype(np.float16)
    for layer in (eo.Conv2D(4, 4, 3, padding="same", groups=4, seed=0),
                  eo.Conv2D(4, 6, 3, groups=2, seed=1),
                  eo.Conv2DTranspose(4, 3, 4, stride=2, padding="same", seed=2)):
        w = [p.data for p in layer.parameters()]
        for p in layer.parameters():
            p.data = p.data.astype(np.float16)
        half = layer(eo.tensor(x)).data
        for p, original in zip(layer.parameters(), w):
            p.data = original.astype(np.float16).astype(np.float32)
        single = layer(eo.tensor(x.astype(np.float32))).data
        assert half.dtype == np.float16
        np.testing.assert_array_equal(half, single.astype(np.float16))


@pytest.mark.parametrize("layer", [eo.Conv2D(4, 6, 3, groups=2, seed=0),
                                   eo.Conv2D(4, 8, 3, groups=4, seed=0)],
                         ids=["grouped", "depthwise"])
def test_grouped_conv2d_takes_an_empty_batch(layer):
    """As PyTorch: an empty batch gives an empty output and zero parameter gradients."""
    x = eo.zeros(0, 5, 5, 4, requires_grad=True)
    out = layer(x)
    assert out.shape == (0, 3, 3, layer.out_channels)
    out.sum().backward()
    assert x.grad.shape == x.shape
    assert layer.weight.grad.shape == layer.weight.shape and not np.any(layer.weight.grad)


def test_grouped_conv1d_takes_an_empty_batch():
    assert eo.Conv1D(4, 6, 3, groups=2, seed=0)(eo.zeros(0, 7, 4)).shape == (0, 5, 6)


def test_conv2d_transpose_refuses_an_input_without_pixels():
    """PyTorch refuses it too; the output size formula would otherwise invent pixels."""
    with pytest.raises(eo.EveryOError, match=r"Conv2DTranspose\(3→4\).*at least one pixel"):
        eo.Conv2DTranspose(3, 4, 3)(eo.ones(1, 0, 5, 3))


@pytest.mark.parametrize("padding", [1.5, None, (1, 2, 3)])
def test_conv1d_refuses_a_padding_it_cannot_read(padding):
    with pytest.raises(eo.EveryOError, match="padding must be"):
        eo.Conv1D(3, 4, 3, padding=padding)
