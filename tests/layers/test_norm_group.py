"""GroupNorm and RMSNorm against PyTorch, gradcheck (first and second derivatives), composites
and errors."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.torch_oracle import assert_composite_matches, compare_with_torch, leaf

DTYPES = ["float64", "float32"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, groups", [((3, 5, 4, 6), 3), ((2, 7, 8), 2), ((4, 6), 3)])
def test_group_norm_matches_torch(torch, rng, dtype, shape, groups):
    layer = eo.GroupNorm(groups, shape[-1]).to(dtype)
    layer.weight.data[...] = rng.standard_normal(shape[-1])
    layer.bias.data[...] = rng.standard_normal(shape[-1])
    tw, tb = leaf(torch, layer.weight.data, dtype), leaf(torch, layer.bias.data, dtype)
    perm = (0, len(shape) - 1) + tuple(range(1, len(shape) - 1))
    back = (0,) + tuple(range(2, len(shape))) + (1,)

    def reference(t):
        return torch.nn.functional.group_norm(t.permute(*perm), groups, tw, tb).permute(*back)

    compare_with_torch(torch, layer, reference, [rng.standard_normal(shape) * 2 + 1],
                       params=[(layer.weight, tw), (layer.bias, tb)], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("shape, normalized", [((3, 5, 8), 8), ((2, 3, 4), (3, 4))])
def test_rms_norm_matches_torch(torch, rng, dtype, shape, normalized):
    layer = eo.RMSNorm(normalized, eps=1e-6).to(dtype)
    layer.weight.data[...] = rng.standard_normal(layer.weight.shape)
    tw = leaf(torch, layer.weight.data, dtype)
    compare_with_torch(torch, layer, lambda t: torch.nn.functional.rms_norm(
        t, layer.normalized_shape, tw, eps=1e-6), [rng.standard_normal(shape)],
        params=[(layer.weight, tw)], dtype=dtype)


def test_group_and_rms_norm_gradcheck_and_composites(rng):
    gn = eo.GroupNorm(2, 4).to("float64")
    gn.weight.data[...] = rng.standard_normal(4)
    assert eo.gradcheck(gn, rng.standard_normal((2, 3, 4)), params=list(gn.parameters()))
    rms = eo.RMSNorm(5).to("float64")
    rms.weight.data[...] = rng.standard_normal(5)
    assert eo.gradcheck(rms, rng.standard_normal((3, 5)), params=list(rms.parameters()))
    gn.bias.data[...] = rng.standard_normal(4)
    assert_composite_matches(gn(eo.tensor(rng.standard_normal((2, 3, 4)), requires_grad=True)))
    assert_composite_matches(rms(eo.tensor(rng.standard_normal((3, 5)), requires_grad=True)))


def test_group_and_rms_norm_errors():
    with pytest.raises(eo.EveryOError, match=r"GroupNorm: num_groups \(3\) must be positive"):
        eo.GroupNorm(3, 4)
    with pytest.raises(eo.EveryOError, match=r"GroupNorm\(2, 4\): expected channels-last"):
        eo.GroupNorm(2, 4)(eo.zeros(2, 4, 3))
    with pytest.raises(eo.EveryOError, match=r"RMSNorm\(5,\): expected input ending in"):
        eo.RMSNorm(5)(eo.zeros(2, 4))


def test_group_norm_takes_an_empty_batch():
    """As PyTorch: an empty batch gives an empty output and zero parameter gradients."""
    norm = eo.GroupNorm(2, 4)
    x = eo.zeros(0, 3, 4, requires_grad=True)
    out = norm(x)
    assert out.shape == (0, 3, 4)
    out.sum().backward()
    assert x.grad.shape == x.shape and not np.any(norm.weight.grad)


@pytest.mark.parametrize("shape", [-4, 0, (), (3, -1), None, 2.5j])
def test_rms_norm_refuses_a_shape_that_is_no_positive_sizes(shape):
    with pytest.raises(eo.EveryOError, match="RMSNorm: normalized_shape must be a positive"):
        eo.RMSNorm(shape)


def test_group_and_rms_norm_second_derivatives(rng):
    gn = eo.GroupNorm(2, 4).to("float64")
    rms = eo.RMSNorm(4).to("float64")
    gn.weight.data[...] = rng.standard_normal(4)
    rms.weight.data[...] = rng.standard_normal(4)
    assert eo.gradgradcheck(lambda x, w, b: eo.group_norm(x, w, b, groups=2, eps=1e-5),
                            rng.standard_normal((2, 3, 4)), rng.standard_normal(4),
                            rng.standard_normal(4))
    assert eo.gradgradcheck(lambda x, w: eo.rms_norm(x, w, ndims=1, eps=1e-6),
                            rng.standard_normal((3, 4)), rng.standard_normal(4))
