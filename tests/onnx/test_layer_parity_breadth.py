"""The layers added for breadth, each exported on its own and run in ONNX Runtime at batch
sizes 1, 3 and 17 (the export sample has batch 2), against the layer in eval mode."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def randomized(layer, seed=0):
    """Non-trivial scale and shift, so a swapped or ignored parameter would show."""
    rng = np.random.default_rng(seed)
    for param in layer.parameters():
        param.data[...] = rng.uniform(-1.5, 1.5, param.shape)
    return layer

class TracedAvgPool2D(eo.AvgPool2D):
    """A subclass: exported through the ops its forward dispatches, not the layer converter."""


CASES = {
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
}


@pytest.mark.parametrize("opset", [17, 18])
@pytest.mark.parametrize("case", sorted(CASES))
def test_layer_matches_onnxruntime(case, opset, parity):
    layer, input_shape = CASES[case]()
    parity(layer, input_shape, batch_sizes=(1, 3, 17), scale=2.0, opset=opset)
