"""Convolution and pooling: NHWC layers around ONNX's NCHW Conv/ConvTranspose/MaxPool/
AveragePool, and Conv1D (NWC) around ONNX's NCW Conv.

Each node is wrapped in a pair of real Transpose nodes (NHWC -> NCHW -> NHWC) and the kernel
is permuted ``(kh, kw, in, out) -> (out, in, kh, kw)``. Padding is always written as explicit
``pads`` from the layers' own resolver, never ``auto_pad``: TensorFlow's "same" puts the odd
extra pad on the bottom/right, and the exported graph must pad exactly like the layer did.
Conv2DTranspose writes its output size (Keras's or PyTorch's) as explicit pads and
``output_padding``.
"""

from __future__ import annotations

import numpy as np

from everyo_layers.geometry import resolve_padding
from everyo_onnx.converters.by_name import by_layer_name

NHWC_TO_NCHW = [0, 3, 1, 2]
NCHW_TO_NHWC = [0, 2, 3, 1]
KERNEL_HWIO_TO_OIHW = (3, 2, 0, 1)


def onnx_pads(layer, ctx, x: str, kernel, dilation=(1, 1)) -> list[int]:
    """``[top, left, bottom, right]`` (ONNX's begin-then-end order) for this input's H, W."""
    (top, bottom), (left, right) = resolve_padding(layer.padding, ctx.shape(x)[1:3], kernel,
                                                   layer.stride, dilation)
    return [top, left, bottom, right]


def in_nchw(ctx, x: str, op_type: str, extra_inputs=(), **attributes) -> str:
    """Apply an NCHW op to an NHWC value: transpose in, op, transpose back."""
    nchw = ctx.node("Transpose", [x], perm=NHWC_TO_NCHW)
    y = ctx.node(op_type, [nchw, *extra_inputs], **attributes)
    return ctx.node("Transpose", [y], perm=NCHW_TO_NHWC)


def convert_conv2d(layer, ctx, x: str) -> str:
    inputs = [ctx.constant(np.transpose(layer.weight.data, KERNEL_HWIO_TO_OIHW), "weight")]
    if layer.bias is not None:
        inputs.append(ctx.constant(layer.bias.data, "bias"))
    return in_nchw(ctx, x, "Conv", inputs, kernel_shape=list(layer.kernel_size),
                   strides=list(layer.stride), dilations=list(layer.dilation),
                   pads=onnx_pads(layer, ctx, x, layer.kernel_size, layer.dilation),
                   group=layer.groups)


def convert_max_pool2d(layer, ctx, x: str) -> str:
    # ONNX MaxPool ignores padded cells, as the layer's -inf padding does.
    return in_nchw(ctx, x, "MaxPool", kernel_shape=list(layer.pool_size),
                   strides=list(layer.stride), pads=onnx_pads(layer, ctx, x, layer.pool_size))


def convert_avg_pool2d(layer, ctx, x: str) -> str:
    # NOTE: by default the layer averages over the real cells only, as Keras does.
    return in_nchw(ctx, x, "AveragePool", kernel_shape=list(layer.pool_size),
                   strides=list(layer.stride), pads=onnx_pads(layer, ctx, x, layer.pool_size),
                   count_include_pad=int(layer.count_include_pad))


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
    leading crop is ``begin``; an output longer than the scatter (Keras's with stride > kernel,
    PyTorch's ``output_padding``) is ONNX's ``output_padding``. The sizes are the layer's own
    (``Conv2DTranspose.output_sizes``, from ``transpose_output_size``)."""
    begins, ends, extra = [], [], []
    hw = ctx.shape(x)[1:3]
    for size, k, s, (out, crop) in zip(hw, layer.kernel_size, layer.stride,
                                       layer.output_sizes(hw)):
        full = (size - 1) * s + k
        begins.append(crop)
        ends.append(max(full - crop - out, 0))
        extra.append(max(out + crop - full, 0))
    inputs = [ctx.constant(np.transpose(layer.weight.data, (3, 2, 0, 1)), "weight")]
    if layer.bias is not None:
        inputs.append(ctx.constant(layer.bias.data, "bias"))
    return in_nchw(ctx, x, "ConvTranspose", inputs, kernel_shape=list(layer.kernel_size),
                   strides=list(layer.stride), pads=begins + ends, output_padding=extra)


CONVERTERS = by_layer_name({
    "Conv2D": convert_conv2d,
    "Conv1D": convert_conv1d,
    "Conv2DTranspose": convert_conv2d_transpose,
    "MaxPool2D": convert_max_pool2d,
    "AvgPool2D": convert_avg_pool2d,
})
