"""Grouped, depthwise and dilated Conv2D against PyTorch, gradcheck (first and second
derivatives), composites, float16 and empty batches."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
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


@pytest.mark.parametrize("groups, cout", [(4, 4), (4, 8), (2, 6)])
def test_grouped_conv2d_composite_matches_kernel(rng, groups, cout):
    layer = eo.Conv2D(4, cout, 3, stride=2, padding="same", dilation=1, groups=groups,
                      seed=0).to("float64")
    assert_composite_matches(layer(eo.tensor(rng.standard_normal((2, 5, 6, 4)),
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


def test_grouped_conv2d_second_derivatives(rng):
    assert eo.gradgradcheck(
        lambda x, w, b: eo.grouped_conv2d(x, w, b, stride=(1, 2), padding=((1, 1), (1, 0)),
                                          dilation=(1, 1), groups=2),
        rng.standard_normal((1, 4, 4, 4)), rng.standard_normal((2, 2, 2, 4)),
        rng.standard_normal(4))
