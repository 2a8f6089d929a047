"""Conv2DTranspose (Keras's output sizes) against PyTorch, gradcheck (first and second
derivatives), composites and errors."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_layers.conv_transpose import transpose_output_size
from support.torch_oracle import assert_composite_matches, compare_with_torch, leaf

DTYPES = ["float64", "float32"]


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


@pytest.mark.parametrize("kernel, stride, padding", [(4, 2, "same"), (3, 2, "same"),
                                                     (2, 3, "valid"), ((3, 2), (1, 2), "valid")])
def test_conv2d_transpose_composite_matches_kernel(rng, kernel, stride, padding):
    layer = eo.Conv2DTranspose(3, 2, kernel, stride=stride, padding=padding, seed=0).to("float64")
    assert_composite_matches(layer(eo.tensor(rng.standard_normal((2, 3, 4, 3)),
                                             requires_grad=True)))


def test_conv2d_transpose_refuses_an_input_without_pixels():
    """PyTorch refuses it too; the output size formula would otherwise invent pixels."""
    with pytest.raises(eo.EveryOError, match=r"Conv2DTranspose\(3→4\).*at least one pixel"):
        eo.Conv2DTranspose(3, 4, 3)(eo.ones(1, 0, 5, 3))


def test_conv2d_transpose_second_derivatives(rng):
    assert eo.gradgradcheck(
        lambda x, w, b: eo.conv2d_transpose(x, w, b, stride=(2, 1), out_hw=(6, 4), crop=(1, 0)),
        rng.standard_normal((1, 3, 3, 2)), rng.standard_normal((3, 2, 2, 2)),
        rng.standard_normal(2))


TORCH_PADDING = [  # (H, W, kernel, stride, padding, output_padding): PyTorch's output size
    (5, 4, 3, 2, 1, 1), (4, 4, 4, 2, 1, 0), (3, 4, 3, 1, 2, 0), (3, 3, 2, 3, 0, 2),
    (4, 3, (3, 4), (2, 3), (1, 0), (1, 2)), (2, 2, 5, 2, 2, 1),
]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("h, w, kernel, stride, padding, output_padding", TORCH_PADDING)
def test_integer_padding_and_output_padding_match_torch(torch, rng, dtype, h, w, kernel, stride,
                                                        padding, output_padding):
    layer = eo.Conv2DTranspose(3, 4, kernel, stride=stride, padding=padding,
                               output_padding=output_padding, seed=1).to(dtype)
    ref = torch.nn.ConvTranspose2d(3, 4, kernel, stride=stride, padding=padding,
                                   output_padding=output_padding).to(getattr(torch, dtype))
    with torch.no_grad():  # PyTorch's (in, out, kh, kw) is EveryO's (kh, kw, out, in) permuted
        ref.weight.copy_(torch.from_numpy(layer.weight.data.transpose(3, 2, 0, 1).copy()))
        ref.bias.copy_(torch.from_numpy(layer.bias.data))
    x = rng.standard_normal((2, h, w, 3))
    out = compare_with_torch(torch, layer, lambda t: ref(t.permute(0, 3, 1, 2)).permute(
        0, 2, 3, 1), [x], dtype=dtype)
    assert out.shape[1:3] == tuple(ref(torch.zeros(1, 3, h, w, dtype=ref.weight.dtype)).shape[2:])
    np.testing.assert_allclose(layer.weight.grad, ref.weight.grad.numpy().transpose(2, 3, 1, 0),
                               rtol=1e-4, atol=1e-4)
    np.testing.assert_allclose(layer.bias.grad, ref.bias.grad.numpy(), rtol=1e-4, atol=1e-4)


def test_integer_padding_gradcheck_and_second_derivatives(rng):
    layer = eo.Conv2DTranspose(2, 3, 3, stride=2, padding=1, output_padding=1,
                               seed=0).to("float64")
    x = rng.standard_normal((2, 3, 2, 2))
    assert eo.gradcheck(layer, x, params=list(layer.parameters()))
    assert eo.gradgradcheck(layer, x)
    assert_composite_matches(layer(eo.tensor(x, requires_grad=True)))


def test_transpose_output_size_is_pytorchs_rule():
    for size, kernel, stride, padding, extra in [(5, 3, 2, 1, 1), (7, 4, 3, 2, 2), (1, 1, 1, 0, 0)]:
        expected = (size - 1) * stride - 2 * padding + kernel + extra
        assert transpose_output_size(size, kernel, stride, padding, extra) == (expected, padding)


@pytest.mark.parametrize("build, problem", [
    (lambda: eo.Conv2DTranspose(2, 3, 3, stride=2, padding=1, output_padding=2),
     r"Conv2DTranspose: output_padding \(2, 2\) must be non-negative and smaller than the "
     r"stride \(2, 2\)"),
    (lambda: eo.Conv2DTranspose(2, 3, 3, stride=2, output_padding=1),
     "Conv2DTranspose: output_padding=.* needs an integer padding.*'valid'"),
    (lambda: eo.Conv2DTranspose(2, 3, 3, padding=-1), "Conv2DTranspose: padding must not be "
                                                      "negative"),
    (lambda: eo.Conv2DTranspose(2, 3, 3, padding=1.5), "Conv2DTranspose padding must be"),
    (lambda: eo.Conv2DTranspose(2, 3, 3, padding=2)(eo.ones(1, 1, 1, 2)),
     r"Conv2DTranspose\(2→3\): padding \(2, 2\) leaves no output for input \(1, 1\)"),
])
def test_bad_padding_is_named(build, problem):
    with pytest.raises(eo.EveryOError, match=problem):
        build()
