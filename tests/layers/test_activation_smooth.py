"""SiLU, Softplus, ELU, Hardswish and Mish against PyTorch, gradcheck (first and second
derivatives) and their composites against the fast kernels."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.torch_oracle import assert_composite_matches, compare_with_torch

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


@pytest.mark.parametrize("layer", [eo.SiLU(), eo.Softplus(beta=1.5, threshold=2.0),
                                   eo.ELU(alpha=0.5), eo.Hardswish(), eo.Mish()],
                         ids=lambda layer: type(layer).__name__)
def test_second_derivatives_pass_gradgradcheck(rng, layer):
    x = rng.uniform(-5, 5, (3, 4))
    x = np.where(np.abs(np.abs(x) - 3) < 0.1, x + 0.3, x)  # off the kinks
    x = np.where(np.abs(x) < 0.1, x + 0.3, x)
    assert eo.gradgradcheck(lambda t: layer(t), x)
