"""Conv2DTranspose with an infinite input or output gradient: NaN only where the sums
themselves give it, on both kernel selections. (The phase formulation multiplies the taps a
phase lacks by zero too, and inf * 0 is NaN: its reference used to turn outputs that never meet
the infinite input into NaN, which everyo-numba and PyTorch do not.)"""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
import everyo.kernels as K
from everyo_layers import conv_transpose_kernels as ref

SELECTIONS = ["numpy"] + (["numba"] if "numba" in K.kernel.registry.providers() else [])
GEOMETRIES = [(3, 2, 0), (4, 2, 1), (5, 3, 2), (2, 2, 0)]  # kernel, stride, padding


def _layer(k, s, p):
    eo.manual_seed(0)
    return eo.Conv2DTranspose(3, 2, k, stride=s, padding=p)


def _reached(k, s, p, shape, pixel):
    """Output positions (Ho, Wo) the input pixel (row, col) reaches: row*s - p + [0, k)."""
    mask = np.zeros(shape[1:3], bool)
    rows = [pixel[0] * s - p + t for t in range(k) if 0 <= pixel[0] * s - p + t < shape[1]]
    cols = [pixel[1] * s - p + t for t in range(k) if 0 <= pixel[1] * s - p + t < shape[2]]
    mask[np.ix_(rows, cols)] = True
    return mask


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("k, s, p", GEOMETRIES)
def test_an_infinite_input_pixel_reaches_only_its_own_outputs(selection, k, s, p):
    x = np.random.default_rng(1).standard_normal((2, 4, 5, 3)).astype(np.float32)
    x[1, 2, 3, 0] = np.inf
    with K.use(selection):
        layer = _layer(k, s, p)
        out = layer(eo.tensor(x)).data
    reached = _reached(k, s, p, out.shape, (2, 3))
    assert np.isfinite(out[0]).all()
    assert np.isfinite(out[1][~reached]).all()
    assert not np.isfinite(out[1][reached]).any()


@pytest.mark.parametrize("selection", SELECTIONS)
@pytest.mark.parametrize("k, s, p", GEOMETRIES)
def test_an_infinite_output_gradient_reaches_only_the_inputs_under_it(selection, k, s, p):
    x = np.random.default_rng(2).standard_normal((2, 4, 5, 3)).astype(np.float32)
    with K.use(selection):
        layer = _layer(k, s, p)
        t = eo.tensor(x, requires_grad=True)
        out = layer(t)
        g = np.ones(out.shape, np.float32)
        g[1, 3, 4, 1] = np.inf
        out.backward(g)
    under = np.array([[_reached(k, s, p, out.shape, (i, j))[3, 4] for j in range(5)]
                      for i in range(4)])
    assert np.isfinite(t.grad[0]).all()
    assert np.isfinite(t.grad[1][~under]).all()
    assert not np.isfinite(t.grad[1][under]).all(axis=-1).any()


@pytest.mark.parametrize("k, s, p", GEOMETRIES)
def test_the_tap_by_tap_sums_are_the_phases_sums(k, s, p):
    """The reference's recheck path computes what its phase path computes (float64)."""
    rng = np.random.default_rng(3)
    x = rng.standard_normal((2, 4, 5, 3))
    weight, bias = rng.standard_normal((k, k, 2, 3)), rng.standard_normal(2)
    full = ((4 - 1) * s + k, (5 - 1) * s + k)
    crop, out_hw = (p, p), (full[0] - 2 * p, full[1] - 2 * p)
    with K.use("numpy"):
        phases = ref.conv2d_transpose_forward(x, weight, bias, (s, s), crop, out_hw, {})
        g = rng.standard_normal(phases.shape)
        phase_grad = ref.conv2d_transpose_input_grad(g, weight, {}, x.shape, (s, s), crop)
    np.testing.assert_allclose(ref._scatter_forward(x, weight, bias, (s, s), crop, out_hw),
                               phases, rtol=1e-12, atol=1e-12)
    np.testing.assert_allclose(ref._scatter_input_grad(g, weight, x.shape, (s, s), crop),
                               phase_grad, rtol=1e-12, atol=1e-12)
