"""``Conv2DTranspose(x, output_size=...)``: PyTorch's ``ConvTranspose2d.forward(input,
output_size)``, which picks the output padding that gives the asked size (a U-Net's decoder
matching its skip connection). Sizes are ``(H, W)`` or an NHWC shape; what PyTorch refuses, and
an NCHW shape, is refused by name."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

CASES = [  # (H, W, kernel, stride, padding, output (H, W))
    (5, 4, 3, 2, 1, (9, 7)), (5, 4, 3, 2, 1, (10, 8)), (4, 4, 4, 2, 1, (8, 9)),
    (3, 3, 2, 3, 0, (8, 10)), (4, 3, (3, 4), (2, 3), (1, 0), (8, 12)), (3, 3, 3, 1, 1, (3, 3)),
]


def _pair(torch, layer, kernel, stride, padding):
    ref = torch.nn.ConvTranspose2d(3, 4, kernel, stride=stride, padding=padding).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(layer.weight.data.transpose(3, 2, 0, 1).copy()))
        ref.bias.copy_(torch.from_numpy(layer.bias.data))
    return ref


@pytest.mark.parametrize("h, w, kernel, stride, padding, size", CASES)
@pytest.mark.parametrize("form", ["hw", "nhwc", "list"])
def test_output_size_matches_pytorch(torch, h, w, kernel, stride, padding, size, form):
    layer = eo.Conv2DTranspose(3, 4, kernel, stride=stride, padding=padding, seed=0).double()
    ref = _pair(torch, layer, kernel, stride, padding)
    x = np.random.default_rng(0).standard_normal((2, h, w, 3))
    asked = {"hw": size, "nhwc": (2, *size, 4), "list": list(size)}[form]
    xe = eo.Parameter(x)
    out = layer(xe, output_size=asked)
    xt = torch.tensor(x.transpose(0, 3, 1, 2), requires_grad=True)
    expected = ref(xt, output_size=list(size))
    assert out.shape == (2, *size, 4)
    np.testing.assert_allclose(out.data, expected.detach().numpy().transpose(0, 2, 3, 1),
                               rtol=1e-12, atol=1e-12)
    g = np.random.default_rng(1).standard_normal(out.shape)
    (out * g).sum().backward()
    (expected * torch.tensor(g.transpose(0, 3, 1, 2))).sum().backward()
    np.testing.assert_allclose(xe.grad, xt.grad.numpy().transpose(0, 2, 3, 1), rtol=1e-12,
                               atol=1e-12)
    np.testing.assert_allclose(layer.weight.grad, ref.weight.grad.numpy().transpose(2, 3, 1, 0),
                               rtol=1e-12, atol=1e-12)
    # the layer's own output_padding is left as it was (PyTorch's: the call overrides it)
    assert layer.output_padding == (0, 0)
    assert layer(eo.tensor(x)).shape[1:3] == tuple(ref(xt).shape[2:])


@pytest.mark.parametrize("size, problem", [
    ((20, 7), "output_size"), ((8, 7), "output_size"),      # out of PyTorch's range
    ((2, 4, 9, 7), "NHWC"),                                 # NCHW sizes: channels second
    ((3, 9, 7, 4), "batch"), ((9,), "output_size"), ((9, 7.0), "output_size"),
    ("9x7", "output_size"), ((9, -7), "output_size"), ((True, 7), "output_size"),
])
def test_bad_output_sizes_are_refused_by_name(size, problem):
    layer = eo.Conv2DTranspose(3, 4, 3, stride=2, padding=1, seed=0)
    with pytest.raises(EveryOError, match=problem):
        layer(np.zeros((2, 5, 4, 3), np.float32), output_size=size)


@pytest.mark.parametrize("padding", ["same", "valid"])
def test_output_size_needs_pytorchs_integer_padding(padding):
    layer = eo.Conv2DTranspose(3, 4, 3, stride=2, padding=padding, seed=0)
    with pytest.raises(EveryOError, match="output_size"):
        layer(np.zeros((2, 5, 4, 3), np.float32), output_size=(10, 8))


def test_output_size_none_is_the_default_size():
    layer = eo.Conv2DTranspose(3, 4, 3, stride=2, padding=1, output_padding=1, seed=0)
    x = np.random.default_rng(0).standard_normal((2, 5, 4, 3)).astype(np.float32)
    np.testing.assert_array_equal(layer(x, output_size=None).data, layer(x).data)
