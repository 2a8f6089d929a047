"""Empty inputs (a batch of 0, as the last batch of a filtered dataset gives) through every
layer with a compiled kernel, on both kernel providers: an empty output of the right shape and
empty/zero gradients, as PyTorch gives, never NumPy's raw reshape error."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
import everyo.kernels as K

LAYERS = {
    "Conv2DTranspose stride 2": (lambda: eo.Conv2DTranspose(3, 4, 3, stride=2), (0, 5, 6, 3),
                                 (0, 11, 13, 4)),
    "Conv2DTranspose stride 1": (lambda: eo.Conv2DTranspose(3, 4, 3), (0, 5, 6, 3),
                                 (0, 7, 8, 4)),
    "Conv2DTranspose padding": (lambda: eo.Conv2DTranspose(3, 4, 4, stride=2, padding=1),
                                (0, 5, 6, 3), (0, 10, 12, 4)),
    "Conv2D": (lambda: eo.Conv2D(3, 4, 3, padding=1), (0, 5, 6, 3), (0, 5, 6, 4)),
    "Conv1D dilated": (lambda: eo.Conv1D(3, 4, 3, dilation=2, padding=2), (0, 6, 3),
                       (0, 6, 4)),
    "depthwise": (lambda: eo.Conv2D(3, 3, 3, groups=3), (0, 5, 6, 3), (0, 3, 4, 3)),
    "MaxPool2D": (lambda: eo.MaxPool2D(2), (0, 4, 6, 3), (0, 2, 3, 3)),
}


@pytest.mark.parametrize("provider", ["numpy", "numba"])
@pytest.mark.parametrize("name", list(LAYERS))
def test_an_empty_batch_gives_an_empty_output_and_zero_gradients(name, provider):
    if provider != "numpy" and provider not in K.kernel.registry.providers():
        pytest.skip(f"kernel provider {provider} not installed")
    make, in_shape, out_shape = LAYERS[name]
    with K.use(provider):
        layer = make()
        x = eo.tensor(np.zeros(in_shape, np.float32), requires_grad=True)
        out = layer(x)
        assert out.shape == out_shape
        out.sum().backward()
    assert x.grad.shape == in_shape
    for p in layer.parameters():
        np.testing.assert_array_equal(p.grad, np.zeros(p.shape, p.dtype))
