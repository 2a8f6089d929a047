"""Module conveniences PyTorch code calls: ``apply(fn)``, ``double``/``float``/``half``,
``to("cpu")`` / ``to(device, dtype)``."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def test_apply_visits_every_module_children_first_even_with_activations():
    model = eo.Sequential(eo.Linear(3, 4), eo.ReLU(), eo.Sequential(eo.GELU(), eo.Linear(4, 2)))

    def init_weights(module):
        if isinstance(module, eo.Linear):
            module.weight.data[...] = 0.5

    assert model.apply(init_weights) is model
    assert all((layer.weight.data == 0.5).all() for layer in (model[0], model[2][1]))
    seen = []
    model.apply(lambda m: seen.append(type(m).__name__))
    assert seen == ["Linear", "ReLU", "GELU", "Linear", "Sequential", "Sequential"]
    np.testing.assert_array_equal(eo.ReLU()(eo.tensor([-1.0, 2.0])).data, [0.0, 2.0])
    with pytest.raises(eo.EveryOError, match="takes a function"):
        model.apply(eo.tensor([1.0]))


def test_double_float_half_and_cpu():
    model = eo.Sequential(eo.Linear(2, 2), eo.BatchNorm1D(2))
    assert model.double() is model
    assert model[0].weight.dtype == "float64" and model[1].running_mean.dtype == np.float64
    assert model.half()[0].weight.dtype == "float16"
    assert model.float()[0].weight.dtype == "float32"
    assert model.to("cpu") is model and model[0].weight.dtype == "float32"
    assert model.to("cpu", "float64")[0].weight.dtype == "float64"
    assert model.to(device="cpu:0", dtype="float32")[1].running_var.dtype == np.float32
    assert model[1].num_batches_tracked.dtype == np.int64  # integers stay integers


def test_other_devices_and_two_dtypes_are_refused():
    model = eo.Linear(2, 2)
    with pytest.raises(eo.EveryOError, match="CPU only; device 'cuda:0'"):
        model.to("cuda:0")
    with pytest.raises(eo.EveryOError, match="two dtypes"):
        model.to("float32", "float64")


def test_a_cast_to_the_same_dtype_keeps_gradients():
    layer = eo.Linear(2, 2)
    layer(eo.ones(1, 2)).sum().backward()
    layer.float()
    assert layer.weight.grad is not None
