"""Layers given dtypes they do not compute in: RMSNorm's default eps in bfloat16 (PyTorch's: the
dtype's machine epsilon) asked NumPy's finfo, which does not know bfloat16 (raw "data type
bfloat16 not inexact"); a complex initial state of a recurrent layer lost its imaginary part."""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import everyo as eo


@pytest.mark.parametrize("dtype", ["bfloat16", "float16", "float32"])
def test_rms_norm_takes_its_default_eps_from_the_inputs_dtype(dtype):
    x = np.linspace(-1e-2, 1e-2, 8).reshape(2, 4)  # small: eps matters
    layer = eo.RMSNorm(4).to(dtype)
    got = layer(eo.tensor(x.astype(getattr(ml_dtypes, dtype, None) or dtype))).data
    eps = float(ml_dtypes.finfo(got.dtype).eps)  # torch.finfo(torch.bfloat16).eps == 2**-7
    x16 = x.astype(got.dtype).astype(np.float64)
    expected = x16 / np.sqrt(np.mean(x16 ** 2, axis=-1, keepdims=True) + eps)
    np.testing.assert_allclose(got.astype(np.float64), expected, rtol=2 ** -7, atol=1e-3)


@pytest.mark.parametrize("kind", ["LSTM", "GRU", "RNN"])
def test_a_complex_initial_state_is_refused_not_cast_to_its_real_part(kind):
    """(NumPy's cast into the float32 state buffer dropped the imaginary part, with only a
    ComplexWarning.)"""
    layer = getattr(eo, kind)(3, 4)
    h0 = np.full((1, 2, 4), 1 + 1j, np.complex64)
    state = (h0, h0.real.astype(np.float32)) if kind == "LSTM" else h0
    with pytest.raises(eo.EveryOError, match=r"complex"):
        layer(eo.ones(2, 5, 3), state)
