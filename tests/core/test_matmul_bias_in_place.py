"""``blas_matmul`` adds a bias of the product's dtype and trailing shape into the product in
place (no second product-sized array): the same sum, so the same bits and dtype as
``a @ b + bias``; any other bias (a wider dtype, a broadcast leading axis) keeps NumPy's
promotion and broadcasting."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.ops.linalg import blas_matmul

RNG = np.random.default_rng(11)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("bias_shape, bias_dtype", [
    ((7,), None), ((5, 7), None), ((1, 7), None), ((3, 1, 7), None), ((7,), np.float64),
    ((), None)])
def test_a_bias_fused_into_the_product_is_numpys_sum_bit_for_bit(dtype, bias_shape, bias_dtype):
    a = RNG.standard_normal((5, 4)).astype(dtype)
    b = RNG.standard_normal((4, 7)).astype(dtype)
    bias = np.asarray(RNG.standard_normal(bias_shape)).astype(bias_dtype or dtype)
    expected = np.matmul(a, b) + bias
    got = blas_matmul(a, b, bias)
    assert got.dtype == expected.dtype and got.shape == expected.shape
    assert got.tobytes() == expected.tobytes()
    assert not np.shares_memory(got, bias) and not np.shares_memory(got, a)


def test_a_linear_layers_output_does_not_alias_its_bias_or_input():
    layer = eo.Linear(4, 3, seed=0)
    x = eo.tensor(RNG.standard_normal((2, 4)).astype(np.float32))
    out = layer(x)
    expected = x.data @ layer.weight.data + layer.bias.data
    assert out.data.tobytes() == expected.tobytes()
    for operand in (x.data, layer.weight.data, layer.bias.data):
        assert not np.shares_memory(out.data, operand)
