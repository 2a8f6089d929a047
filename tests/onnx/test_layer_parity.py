"""Every supported layer on its own: export, run in ONNX Runtime at two batch sizes that differ
from ``input_shape``, compare with the layer (eval mode) within float32 rounding."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def randomized(layer, seed=0):
    """Give norm layers non-trivial affine parameters and running statistics, so the test would
    catch a swapped or ignored one."""
    rng = np.random.default_rng(seed)
    for param in layer.parameters():
        param.data[...] = rng.uniform(-1.5, 1.5, param.shape).astype(param.dtype)
    if getattr(layer, "running_mean", None) is not None:
        c = layer.running_mean.shape
        layer.running_mean = rng.normal(0.0, 1.0, c).astype(np.float32)
        layer.running_var = rng.uniform(0.2, 3.0, c).astype(np.float32)
    return layer


CASES = {
    "linear": lambda: (eo.Linear(5, 3, seed=0), (2, 5)),
    "linear_no_bias": lambda: (eo.Linear(5, 4, bias=False, seed=1), (2, 5)),
    "linear_3d_input": lambda: (eo.Linear(5, 3, seed=2), (2, 4, 5)),
    "conv_valid": lambda: (eo.Conv2D(3, 4, 3, seed=0), (2, 6, 7, 3)),
    "conv_same_stride2_odd": lambda: (eo.Conv2D(3, 4, 3, stride=2, padding="same", seed=1),
                                      (2, 9, 7, 3)),
    "conv_same_even_kernel": lambda: (eo.Conv2D(2, 3, 4, stride=2, padding="same", seed=2),
                                      (2, 7, 11, 2)),
    "conv_dilated_same": lambda: (eo.Conv2D(2, 3, 3, dilation=2, padding="same", seed=3),
                                  (2, 8, 9, 2)),
    "conv_explicit_pads": lambda: (eo.Conv2D(2, 3, (2, 3), stride=(1, 2),
                                             padding=((1, 0), (2, 1)), seed=4), (2, 6, 7, 2)),
    "conv_int_pad_no_bias": lambda: (eo.Conv2D(2, 5, 3, padding=1, bias=False, seed=5),
                                     (2, 5, 5, 2)),
    "maxpool": lambda: (eo.MaxPool2D(2), (2, 6, 8, 3)),
    "maxpool_same_stride2_odd": lambda: (eo.MaxPool2D(3, stride=2, padding="same"), (2, 7, 9, 2)),
    "maxpool_same_odd": lambda: (eo.MaxPool2D(2, padding="same"), (2, 5, 7, 2)),
    "avgpool": lambda: (eo.AvgPool2D(2), (2, 6, 8, 3)),
    "avgpool_same_stride2_odd": lambda: (eo.AvgPool2D(3, stride=2, padding="same"), (2, 7, 9, 2)),
    "avgpool_same_odd": lambda: (eo.AvgPool2D(2, padding="same"), (2, 5, 7, 2)),
    "avgpool_explicit_pads": lambda: (eo.AvgPool2D(3, stride=1, padding=1), (2, 5, 6, 2)),
    "flatten": lambda: (eo.Flatten(), (2, 3, 4, 5)),
    "dropout": lambda: (eo.Dropout(0.5), (2, 6)),
    "batchnorm1d": lambda: (randomized(eo.BatchNorm1D(6)), (2, 6)),
    "batchnorm1d_sequence": lambda: (randomized(eo.BatchNorm1D(6), 1), (2, 4, 6)),
    "batchnorm1d_no_affine": lambda: (randomized(eo.BatchNorm1D(6, affine=False), 2), (2, 6)),
    "batchnorm2d": lambda: (randomized(eo.BatchNorm2D(3, eps=1e-3), 3), (2, 5, 4, 3)),
    "layernorm": lambda: (randomized(eo.LayerNorm(6)), (2, 6)),
    "layernorm_two_axes": lambda: (randomized(eo.LayerNorm((4, 6), eps=1e-3), 1), (2, 4, 6)),
    "layernorm_no_affine": lambda: (eo.LayerNorm(6, elementwise_affine=False), (2, 3, 6)),
    "relu": lambda: (eo.ReLU(), (2, 7)),
    "sigmoid": lambda: (eo.Sigmoid(), (2, 7)),
    "tanh": lambda: (eo.Tanh(), (2, 7)),
    "softmax": lambda: (eo.Softmax(), (2, 7)),
    "softmax_axis1": lambda: (eo.Softmax(axis=1), (2, 3, 4)),
    "log_softmax": lambda: (eo.LogSoftmax(), (2, 7)),
    "log_softmax_axis1": lambda: (eo.LogSoftmax(axis=1), (2, 3, 4)),
    "leaky_relu": lambda: (eo.LeakyReLU(0.2), (2, 7)),
    "gelu": lambda: (eo.GELU(), (2, 7)),
    "gelu_tanh": lambda: (eo.GELU(approximate="tanh"), (2, 7)),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_onnxruntime(case, parity):
    layer, input_shape = CASES[case]()
    layer.train()  # export must use eval semantics whatever the mode, and restore the mode
    parity(layer, input_shape, scale=2.0)
    assert layer.training


@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_inside_sequential(case, parity):
    layer, input_shape = CASES[case]()
    parity(eo.Sequential(eo.Sequential(layer), eo.Tanh()).eval(), input_shape, batch_sizes=(1, 5))


@pytest.mark.parametrize("approximate", ["none", "tanh"])
@pytest.mark.parametrize("opset", [17, 20])
def test_gelu_native_op_or_formula(approximate, opset, parity, onnx):
    path = parity(eo.GELU(approximate=approximate), (2, 9), opset=opset, scale=3.0)
    op_types = {node.op_type for node in onnx.load(str(path)).graph.node}
    assert ("Gelu" in op_types) == (opset >= 20)
    if opset < 20:
        assert ("Erf" in op_types) == (approximate == "none")


def test_dropout_in_training_mode_is_identity_in_the_export(parity):
    model = eo.Sequential(eo.Linear(4, 8, seed=0), eo.Dropout(0.9, seed=0)).train()
    parity(model, (2, 4))
    assert all(module.training for module in model.modules())
