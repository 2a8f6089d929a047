"""Conv1D (NWC; valid, same, causal and explicit padding; groups) against PyTorch, gradcheck and
errors."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.torch_oracle import compare_with_torch, leaf

DTYPES = ["float64", "float32"]


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


def test_grouped_conv1d_takes_an_empty_batch():
    assert eo.Conv1D(4, 6, 3, groups=2, seed=0)(eo.zeros(0, 7, 4)).shape == (0, 5, 6)


@pytest.mark.parametrize("padding", [1.5, None, (1, 2, 3)])
def test_conv1d_refuses_a_padding_it_cannot_read(padding):
    with pytest.raises(eo.EveryOError, match="padding must be"):
        eo.Conv1D(3, 4, 3, padding=padding)
