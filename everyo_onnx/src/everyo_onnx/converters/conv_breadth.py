"""Conv1D (NWC around ONNX's NCW Conv) and Conv2DTranspose (ConvTranspose with Keras's output
size written as explicit pads and output_padding)."""

from __future__ import annotations

import numpy as np

from everyo_layers.conv1d import Conv1D
from everyo_layers.conv_transpose import Conv2DTranspose, transpose_output_size
from everyo_onnx.converters.conv import in_nchw


def convert_conv1d(layer, ctx, x: str) -> str:
    (_, _), (left, right) = layer.pads_2d(layer.padding, ctx.shape(x)[1])
    inputs = [ctx.constant(np.transpose(layer.weight.data, (2, 1, 0)), "weight")]
    if layer.bias is not None:
        inputs.append(ctx.constant(layer.bias.data, "bias"))
    ncw = ctx.node("Transpose", [x], perm=[0, 2, 1])
    y = ctx.node("Conv", [ncw, *inputs], kernel_shape=[layer.kernel_size],
                 strides=[layer.stride], dilations=[layer.dilation], pads=[left, right],
                 group=layer.groups)
    return ctx.node("Transpose", [y], perm=[0, 2, 1])


def convert_conv2d_transpose(layer, ctx, x: str) -> str:
    """ONNX's output is ``(in - 1) * stride + kernel + output_padding - begin - end``: the
    leading crop is ``begin``; a longer Keras output (stride > kernel) is ``output_padding``."""
    begins, ends, extra = [], [], []
    for size, k, s in zip(ctx.shape(x)[1:3], layer.kernel_size, layer.stride):
        out, crop = transpose_output_size(size, k, s, layer.padding)
        full = (size - 1) * s + k
        begins.append(crop)
        ends.append(max(full - crop - out, 0))
        extra.append(max(out + crop - full, 0))
    inputs = [ctx.constant(np.transpose(layer.weight.data, (3, 2, 0, 1)), "weight")]
    if layer.bias is not None:
        inputs.append(ctx.constant(layer.bias.data, "bias"))
    return in_nchw(ctx, x, "ConvTranspose", inputs, kernel_shape=list(layer.kernel_size),
                   strides=list(layer.stride), pads=begins + ends, output_padding=extra)


CONVERTERS = {Conv1D: convert_conv1d, Conv2DTranspose: convert_conv2d_transpose}
