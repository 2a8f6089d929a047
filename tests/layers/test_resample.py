"""Global and adaptive pooling and UpSampling2D against PyTorch, gradcheck (first and second
derivatives) and errors."""

from __future__ import annotations

import pytest

import everyo as eo
from support.torch_oracle import compare_with_torch

DTYPES = ["float64", "float32"]


def nchw(fn):
    """A torch function on NCHW wrapped to take and return NHWC."""
    return lambda t: fn(t.permute(0, 3, 1, 2)).permute(0, 2, 3, 1)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("keepdims", [False, True])
def test_global_pools_match_torch(torch, rng, dtype, keepdims):
    x = rng.standard_normal((3, 5, 4, 6))
    axes = (1, 2)
    compare_with_torch(torch, eo.GlobalAvgPool2D(keepdims=keepdims),
                       lambda t: t.mean(dim=axes, keepdim=keepdims), [x], dtype=dtype)
    compare_with_torch(torch, eo.GlobalMaxPool2D(keepdims=keepdims),
                       lambda t: t.amax(dim=axes, keepdim=keepdims), [x], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("size_in, size_out", [((8, 8), (4, 4)), ((7, 9), (3, 4)),
                                               ((5, 5), (1, 1)), ((3, 4), (5, 6))])
def test_adaptive_avg_pool_matches_torch(torch, rng, dtype, size_in, size_out):
    x = rng.standard_normal((2,) + size_in + (3,))
    F = torch.nn.functional
    compare_with_torch(torch, eo.AdaptiveAvgPool2D(size_out),
                       nchw(lambda t: F.adaptive_avg_pool2d(t, size_out)), [x], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("interpolation", ["nearest", "bilinear"])
@pytest.mark.parametrize("size", [2, (3, 2)])
def test_upsampling_matches_torch(torch, rng, dtype, interpolation, size):
    x = rng.standard_normal((2, 4, 5, 3))
    layer = eo.UpSampling2D(size, interpolation=interpolation)
    ref = torch.nn.Upsample(scale_factor=layer.size, mode=interpolation,
                            **({"align_corners": False} if interpolation == "bilinear" else {}))
    compare_with_torch(torch, layer, nchw(ref), [x], dtype=dtype)


def test_resample_gradcheck_and_errors(rng):
    x = rng.standard_normal((2, 3, 5, 2))
    for layer in (eo.UpSampling2D((2, 3), "bilinear"), eo.AdaptiveAvgPool2D((2, 3)),
                  eo.GlobalAvgPool2D(), eo.AvgPool2D(3, 2, "same", count_include_pad=True)):
        assert eo.gradcheck(layer, x)
    with pytest.raises(eo.EveryOError, match="UpSampling2D: interpolation must be"):
        eo.UpSampling2D(2, "cubic")
    with pytest.raises(eo.EveryOError, match=r"AdaptiveAvgPool2D\(2, 2\): expected NHWC input"):
        eo.AdaptiveAvgPool2D(2)(eo.zeros(3, 4, 4))
    with pytest.raises(eo.EveryOError, match=r"GlobalMaxPool2D: expected NHWC input"):
        eo.GlobalMaxPool2D()(eo.zeros(3, 4))


@pytest.mark.parametrize("layer", [eo.UpSampling2D(2, "bilinear"), eo.UpSampling2D(2),
                                   eo.AdaptiveAvgPool2D(2), eo.GlobalAvgPool2D(),
                                   eo.GlobalMaxPool2D()], ids=lambda layer: type(layer).__name__)
def test_resizing_and_global_pools_refuse_an_input_without_pixels(layer):
    """As PyTorch: no pixel means no mean, maximum or interpolation (not NaN, not a NumPy
    error)."""
    with pytest.raises(eo.EveryOError, match=r"at least one pixel, got shape \(1, 0, 4, 3\)"):
        layer(eo.ones(1, 0, 4, 3))


def test_upsampling_second_derivatives(rng):
    up = eo.UpSampling2D((2, 3), "bilinear")
    assert eo.gradgradcheck(lambda x: up(x) * up(x), rng.standard_normal((1, 3, 2, 2)))
