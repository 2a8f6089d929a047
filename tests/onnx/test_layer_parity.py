"""Every supported layer on its own: export at opsets 17 and 18, run in ONNX Runtime at batch
sizes 1, 3 and 17 (the export sample has batch 2), compare with the layer (eval mode) within
float32 rounding; and each inside nested containers."""

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


class TracedAvgPool2D(eo.AvgPool2D):
    """A subclass: exported through the ops its forward dispatches, not the layer converter."""


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

    "avgpool_count_include_pad_traced": lambda: (TracedAvgPool2D(3, 2, "same",
                                                                 count_include_pad=True),
                                                 (2, 7, 6, 2)),
    "conv_depthwise_same": lambda: (eo.Conv2D(4, 4, 3, padding="same", groups=4, seed=0),
                                    (2, 7, 6, 4)),
    "conv_depthwise_multiplier": lambda: (eo.Conv2D(3, 6, 3, stride=2, padding="same", groups=3,
                                                    seed=1), (2, 7, 8, 3)),
    "conv_grouped_dilated": lambda: (eo.Conv2D(4, 6, 3, dilation=2, padding="same", groups=2,
                                               seed=2), (2, 9, 8, 4)),
    "conv1d_same_dilated": lambda: (eo.Conv1D(3, 5, 5, dilation=2, padding="same", seed=0),
                                    (2, 12, 3)),
    "conv1d_causal_groups": lambda: (eo.Conv1D(4, 4, 3, padding="causal", groups=2, seed=1),
                                     (2, 9, 4)),
    "conv1d_stride_valid": lambda: (eo.Conv1D(3, 2, 4, stride=2, bias=False, seed=2),
                                    (2, 11, 3)),
    "conv_transpose_same_k4s2": lambda: (eo.Conv2DTranspose(4, 3, 4, stride=2, padding="same",
                                                            seed=0), (2, 5, 6, 4)),
    "conv_transpose_same_k3s2": lambda: (eo.Conv2DTranspose(2, 3, 3, stride=2, padding="same",
                                                            seed=1), (2, 5, 4, 2)),
    "conv_transpose_valid_s_gt_k": lambda: (eo.Conv2DTranspose(2, 3, 2, stride=3, seed=2),
                                            (2, 3, 4, 2)),
    "conv_transpose_valid": lambda: (eo.Conv2DTranspose(2, 2, (3, 2), stride=(1, 2),
                                                        bias=False, seed=3), (2, 4, 4, 2)),
    "global_avg_pool": lambda: (eo.GlobalAvgPool2D(), (2, 5, 4, 3)),
    "global_avg_pool_keepdims": lambda: (eo.GlobalAvgPool2D(keepdims=True), (2, 5, 4, 3)),
    "global_max_pool": lambda: (eo.GlobalMaxPool2D(), (2, 5, 4, 3)),
    "adaptive_avg_pool": lambda: (eo.AdaptiveAvgPool2D((3, 2)), (2, 7, 5, 3)),
    "avgpool_count_include_pad": lambda: (eo.AvgPool2D(3, stride=2, padding="same",
                                                       count_include_pad=True), (2, 7, 6, 2)),
    "upsampling_nearest": lambda: (eo.UpSampling2D((2, 3)), (2, 3, 4, 2)),
    "upsampling_bilinear": lambda: (eo.UpSampling2D(2, "bilinear"), (2, 3, 4, 2)),
    "group_norm": lambda: (randomized(eo.GroupNorm(2, 6)), (2, 4, 3, 6)),
    "group_norm_sequence": lambda: (randomized(eo.GroupNorm(3, 6), 1), (2, 5, 6)),
    "rms_norm": lambda: (randomized(eo.RMSNorm(6, eps=1e-5)), (2, 3, 6)),
    "rms_norm_default_eps": lambda: (randomized(eo.RMSNorm((3, 6)), 1), (2, 3, 6)),
    "layer_norm_no_bias": lambda: (randomized(eo.LayerNorm(6, bias=False)), (2, 3, 6)),
    "silu": lambda: (eo.SiLU(), (2, 7)),
    "softplus": lambda: (eo.Softplus(beta=2.0, threshold=1.5), (2, 7)),
    "elu": lambda: (eo.ELU(alpha=0.7), (2, 7)),
    "hardswish": lambda: (eo.Hardswish(), (2, 7)),
    "mish": lambda: (eo.Mish(), (2, 7)),
    "instance_norm1d_affine": lambda: (randomized(eo.InstanceNorm1D(4, affine=True)), (2, 5, 4)),
    "instance_norm2d": lambda: (eo.InstanceNorm2D(3, eps=1e-3), (2, 4, 5, 3)),
    "instance_norm2d_running_stats": lambda: (randomized(eo.InstanceNorm2D(
        3, affine=True, track_running_stats=True), 1), (2, 4, 5, 3)),
    "pixel_shuffle": lambda: (eo.PixelShuffle(2), (2, 3, 4, 8)),
    "pixel_unshuffle_traced": lambda: (eo.PixelUnshuffle(2), (2, 4, 6, 3)),
    "reflection_pad_traced": lambda: (eo.ReflectionPad2D((1, 2, 2, 0)), (2, 4, 5, 3)),
    "replication_pad_traced": lambda: (eo.ReplicationPad2D(2), (2, 4, 5, 3)),
    "upsample_nearest_traced": lambda: (eo.Upsample(scale_factor=1.5), (2, 4, 5, 3)),
    "upsample_bilinear_align_corners_traced": lambda: (
        eo.Upsample(size=(7, 3), mode="bilinear", align_corners=True), (2, 4, 5, 3)),
    "conv_transpose_torch_padding": lambda: (eo.Conv2DTranspose(
        2, 3, 3, stride=2, padding=1, output_padding=1, seed=4), (2, 4, 5, 2)),
    "conv_transpose_torch_padding_pair": lambda: (eo.Conv2DTranspose(
        2, 3, (4, 3), stride=(2, 3), padding=(1, 0), output_padding=(0, 2), seed=5),
        (2, 4, 3, 2)),
}


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_onnxruntime(case, opset, parity):
    layer, input_shape = CASES[case]()
    layer.train()  # export must use eval semantics whatever the mode, and restore the mode
    parity(layer, input_shape, batch_sizes=(1, 3, 17), scale=2.0, opset=opset)
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


def test_a_linear_tied_to_a_table_exports_its_transposed_use(parity):
    decoder = eo.Linear(6, 10, seed=0)
    decoder.tie_weight(eo.Embedding(10, 6, seed=1).weight)  # (10, 6), used transposed
    parity(eo.Sequential(eo.Linear(4, 6, seed=2), decoder), (2, 4))


class CircularPad(eo.Module):
    def forward(self, x):
        return eo.pad(x, ((0, 0), (1, 2), (2, 0), (0, 0)), mode="circular")


class CroppingReflectPad(eo.Module):
    def forward(self, x):
        return eo.pad(x, ((0, 0), (1, -1), (0, 0), (0, 0)), mode="reflect")


def test_circular_padding_exports_from_opset_19_and_is_refused_before(parity, tmp_path):
    parity(CircularPad(), (2, 4, 5, 3), opset=19)
    with pytest.raises(eo.EveryOSerializationError, match="circular.*opset 19"):
        eo.export_onnx(CircularPad(), tmp_path / "m.onnx", input_shape=(2, 4, 5, 3), opset=18)


def test_a_mode_padding_that_crops_is_refused_by_name(tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match="pad_mode: negative pad widths"):
        eo.export_onnx(CroppingReflectPad(), tmp_path / "m.onnx", input_shape=(2, 4, 5, 3))
