"""The norms on float32 input whose deviations from the mean exceed sqrt(float32 max) (~1.8e19):
their squares overflow float32, yet the statistics (float64) and the normalised output are
representable. The oracle is the same layer computed on the float64 input; an input that is
itself infinite gives NaN (what the arithmetic says), never zeros."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def _layers():
    return {
        "LayerNorm": (lambda: eo.LayerNorm(6), (4, 6)),
        "GroupNorm": (lambda: eo.GroupNorm(2, 6), (3, 5, 6)),
        "BatchNorm2D": (lambda: eo.BatchNorm2D(6), (3, 2, 2, 6)),
        "InstanceNorm2D": (lambda: eo.InstanceNorm2D(6, affine=True), (2, 3, 3, 6)),
        "RMSNorm": (lambda: eo.RMSNorm(6), (4, 6)),
    }


def _run(make, x, dtype, rng):
    layer = make()
    for p in layer.parameters():
        p.data[...] = 1 + rng.standard_normal(p.shape) / 4
    layer = layer.to(dtype)
    t = eo.tensor(x.astype(dtype), requires_grad=True)
    out = layer(t)
    g = np.random.default_rng(1).standard_normal(out.shape).astype(dtype)
    (out * eo.tensor(g)).sum().backward()
    return out.numpy(), np.asarray(t.grad), [np.asarray(p.grad) for p in layer.parameters()]


@pytest.mark.parametrize("name", list(_layers()))
@pytest.mark.parametrize("scale", [3e19, 1e25, 1e37])
def test_float32_norm_of_huge_deviations_matches_float64(rng, name, scale):
    make, shape = _layers()[name]
    x = (rng.standard_normal(shape) * scale).astype(np.float32)
    out, gx, gp = _run(make, x, "float32", np.random.default_rng(0))
    out64, gx64, gp64 = _run(make, x, "float64", np.random.default_rng(0))
    assert np.abs(out).max() > 0.1  # not the silent zeros
    np.testing.assert_allclose(out, out64, rtol=1e-5, atol=1e-5)
    # the input gradient scales as 1 / scale; compare relative to its size
    np.testing.assert_allclose(gx, gx64, rtol=1e-4, atol=1e-5 * np.abs(gx64).max())
    for a, b in zip(gp, gp64, strict=True):
        np.testing.assert_allclose(a, b, rtol=1e-4, atol=1e-5)


@pytest.mark.parametrize("name", list(_layers()))
def test_float32_norm_of_deviations_beyond_float32_range_matches_float64(rng, name):
    """x - mean itself overflows float32 (values near +-float32 max of both signs)."""
    make, shape = _layers()[name]
    big = np.finfo(np.float32).max
    x = np.where(rng.standard_normal(shape) > 0, big, -big * 0.75).astype(np.float32)
    out = _run(make, x, "float32", np.random.default_rng(0))[0]
    out64 = _run(make, x, "float64", np.random.default_rng(0))[0]
    np.testing.assert_allclose(out, out64, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("name", list(_layers()))
def test_float32_norm_of_infinite_input_is_nan_not_zero(rng, name):
    make, shape = _layers()[name]
    x = rng.standard_normal(shape).astype(np.float32)
    x[0, ...] = np.inf  # every statistic involving the first sample sees an infinity
    out = _run(make, x, "float32", np.random.default_rng(0))[0]
    assert np.isnan(out[0]).all()
    assert not (out[0] == 0).any()
