"""SiLU, Softplus, ELU, Hardswish, Mish, GroupNorm, RMSNorm and LayerNorm(bias=False) against
PyTorch, gradcheck, their composites against the fast kernels, and the norms' float32
accuracy against float64."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.torch_oracle import assert_composite_matches, compare_with_torch, leaf

DTYPES = ["float64", "float32"]

ACTIVATIONS = {  # name -> (layer, torch function)
    "SiLU": (lambda: eo.SiLU(), lambda F: F.silu),
    "Softplus": (lambda: eo.Softplus(beta=2.0, threshold=3.0),
                 lambda F: lambda t: F.softplus(t, beta=2.0, threshold=3.0)),
    "ELU": (lambda: eo.ELU(alpha=0.7), lambda F: lambda t: F.elu(t, alpha=0.7)),
    "Hardswish": (lambda: eo.Hardswish(), lambda F: F.hardswish),
    "Mish": (lambda: eo.Mish(), lambda F: F.mish),
}


def _inputs(rng):
    # spread over the kinks (0, +-3) without sitting on them, plus large magnitudes
    x = rng.uniform(-6, 6, (4, 7))
    x[0, :3] = [-40.0, 25.0, 60.0]
    return x


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_matches_torch(torch, rng, name, dtype):
    make, ref = ACTIVATIONS[name]
    compare_with_torch(torch, make(), ref(torch.nn.functional), [_inputs(rng)], dtype=dtype)


@pytest.mark.parametrize("name", sorted(ACTIVATIONS))
def test_activation_gradcheck_and_composite(rng, name):
    layer = ACTIVATIONS[name][0]()
    x = _inputs(rng)
    x = np.where(np.abs(np.abs(x) - 3) < 0.05, x + 0.2, x)  # away from Hardswish's kinks
    x = np.where(np.abs(x) < 0.05, x + 0.2, x)
    assert eo.gradcheck(layer, x)
    assert_composite_matches(layer(eo.tensor(x, requires_grad=True)))


def test_softplus_and_activation_errors():
    with pytest.raises(eo.EveryOError, match="Softplus: beta must be a positive number"):
        eo.Softplus(beta=0)
    with pytest.raises(eo.EveryOError, match="SiLU: expected floating-point input"):
        eo.SiLU()(eo.tensor(np.arange(3)))


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


@pytest.mark.parametrize("dtype", DTYPES)
def test_layer_norm_without_bias_matches_torch(torch, rng, dtype):
    layer = eo.LayerNorm(6, bias=False).to(dtype)
    assert layer.bias is None and [n for n, _ in layer.named_parameters()] == ["weight"]
    layer.weight.data[...] = rng.standard_normal(6)
    ref = torch.nn.LayerNorm(6, bias=False, dtype=getattr(torch, dtype))
    with torch.no_grad():
        ref.weight.copy_(torch.tensor(layer.weight.data))
    compare_with_torch(torch, layer, ref, [rng.standard_normal((4, 6))],
                       params=[(layer.weight, ref.weight)], dtype=dtype)


def test_new_norms_gradcheck(rng):
    gn = eo.GroupNorm(2, 4).to("float64")
    gn.weight.data[...] = rng.standard_normal(4)
    assert eo.gradcheck(gn, rng.standard_normal((2, 3, 4)), params=list(gn.parameters()))
    rms = eo.RMSNorm(5).to("float64")
    rms.weight.data[...] = rng.standard_normal(5)
    assert eo.gradcheck(rms, rng.standard_normal((3, 5)), params=list(rms.parameters()))
    gn.bias.data[...] = rng.standard_normal(4)
    assert_composite_matches(gn(eo.tensor(rng.standard_normal((2, 3, 4)), requires_grad=True)))
    assert_composite_matches(rms(eo.tensor(rng.standard_normal((3, 5)), requires_grad=True)))


def test_new_norm_errors():
    with pytest.raises(eo.EveryOError, match=r"GroupNorm: num_groups \(3\) must be positive"):
        eo.GroupNorm(3, 4)
    with pytest.raises(eo.EveryOError, match=r"GroupNorm\(2, 4\): expected channels-last"):
        eo.GroupNorm(2, 4)(eo.zeros(2, 4, 3))
    with pytest.raises(eo.EveryOError, match=r"RMSNorm\(5,\): expected input ending in"):
        eo.RMSNorm(5)(eo.zeros(2, 4))


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
