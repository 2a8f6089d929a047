"""Registration, the attribute contract other plugins read (every op has a second
derivative), Flatten, and bad-input errors of the dense layers."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_layers import recurrent

LAYER_NAMES = ["Linear", "Conv2D", "MaxPool2D", "AvgPool2D", "Flatten", "Dropout", "BatchNorm1D",
               "BatchNorm2D", "LayerNorm", "ReLU", "Sigmoid", "Tanh", "Softmax", "LogSoftmax",
               "GELU", "LeakyReLU", "MSELoss", "L1Loss", "CrossEntropyLoss", "NLLLoss",
               "BCEWithLogitsLoss", "cross_entropy", "mse_loss", "l1_loss", "nll_loss",
               "binary_cross_entropy_with_logits", "clip_grad_norm_", "RNNCell", "LSTMCell",
               "GRUCell", "BCELoss", "binary_cross_entropy", "InstanceNorm1D", "InstanceNorm2D",
               "ReflectionPad2D", "ReplicationPad2D", "PixelShuffle", "PixelUnshuffle", "interpolate",
               "Upsample", "TransformerDecoder", "Transformer"]
OP_NAMES = ["conv2d", "max_pool2d", "avg_pool2d", "dropout", "layer_norm", "batch_norm", "gelu",
            "leaky_relu", "cross_entropy", "nll_loss", "mse_loss", "l1_loss", "bce_with_logits",
            "binary_cross_entropy", "lstm", "gru", "rnn", "resample2d"]


def test_everything_is_registered_by_the_layers_plugin():
    layers, ops = eo.registry("layers").items, eo.registry("ops").items
    for name in LAYER_NAMES:
        assert name in layers, name
        assert getattr(eo, name) is layers[name]
    for name in OP_NAMES:
        assert name in ops, name
    owned = set(eo.registry("layers").owned_by("everyo_layers"))
    assert set(LAYER_NAMES) <= owned


def test_attribute_contract():
    conv = eo.Conv2D(3, 8, (3, 5), stride=(2, 1), padding=((0, 1), (2, 2)), dilation=(1, 2))
    assert (conv.in_channels, conv.out_channels, conv.kernel_size, conv.stride,
            conv.dilation, conv.padding) == (3, 8, (3, 5), (2, 1), (1, 2), ((0, 1), (2, 2)))
    dense = eo.Linear(4, 2, bias=False)
    assert (dense.in_features, dense.out_features, dense.bias) == (4, 2, None)
    assert eo.Dropout(0.25).p == 0.25
    bn = eo.BatchNorm1D(5, eps=1e-3, momentum=0.2, affine=False, track_running_stats=False)
    assert (bn.num_features, bn.eps, bn.momentum, bn.affine, bn.track_running_stats) == \
        (5, 1e-3, 0.2, False, False)
    assert bn.weight is None and bn.bias is None and bn.running_mean is None
    ln = eo.LayerNorm([2, 3], eps=1e-6)
    assert (ln.normalized_shape, ln.eps, ln.weight.shape) == ((2, 3), 1e-6, (2, 3))
    assert eo.Softmax(axis=1).axis == 1 and eo.LogSoftmax().axis == -1
    assert eo.GELU("tanh").approximate == "tanh" and eo.LeakyReLU(0.3).negative_slope == 0.3


def test_linear_forward_is_one_matmul_with_the_bias_as_operand():
    layer = eo.Linear(3, 2, seed=0)
    out = layer(eo.ones(4, 3, requires_grad=True))
    assert type(out._ctx).__name__ == "MatMul"
    assert len(out._ctx.parents) == 3 and out._ctx.parents[2] is layer.bias


def test_conv_forward_is_one_conv2d_op_with_the_bias_as_operand():
    layer = eo.Conv2D(2, 3, 3, padding="same", seed=0)
    out = layer(eo.ones(1, 4, 4, 2, requires_grad=True))
    assert type(out._ctx).__name__ == "Conv2DOp"
    assert out._ctx.parents[1] is layer.weight and out._ctx.parents[2] is layer.bias


def test_flatten_is_row_major_over_h_w_c(rng):
    x = rng.standard_normal((2, 3, 4, 5))
    out = eo.Flatten()(eo.tensor(x))
    np.testing.assert_array_equal(out.data, x.reshape(2, -1))
    assert eo.gradcheck(eo.Flatten(), x)


def test_linear_bad_inputs():
    layer = eo.Linear(4, 3)
    with pytest.raises(eo.EveryOError,
                       match=r"Linear\(4→3\): expected input with 4 features on the last axis, "
                             r"got shape \(2, 5\)"):
        layer(eo.zeros(2, 5))
    with pytest.raises(eo.EveryOError, match=r"Linear\(4→3\): expected floating-point input, "
                                             r"got int64"):
        layer(eo.tensor(np.zeros((2, 4), np.int64)))
    with pytest.raises(eo.EveryOError, match="Linear: in_features must be a positive int"):
        eo.Linear(0, 3)


def test_activation_refuses_integer_input():
    with pytest.raises(eo.EveryOError, match="ReLU: expected floating-point input, got int32"):
        eo.ReLU()(eo.tensor(np.zeros(3, np.int32)))
    with pytest.raises(eo.EveryOError, match="GELU: approximate must be"):
        eo.GELU("fast")


def test_layers_accept_plain_arrays():
    out = eo.Linear(3, 2, seed=0)(np.ones((1, 3), np.float32))
    assert out.shape == (1, 2)


def test_every_layers_op_has_a_second_derivative():
    ops = eo.registry("ops").items
    assert set(recurrent.OPS) <= set(ops)  # the fused recurrent ones too (their composites)
    missing = [name for name, cls in ops.items()
               if cls.differentiable and cls.backward_graph is None and cls.composite is None]
    assert missing == []
