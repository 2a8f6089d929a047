"""Op converters for everyo-layers' ops, for forwards that reach them outside the layers'
own converters: a subclass of ``GELU`` or ``Conv2D`` (traced through its own forward), or a
module calling the op directly. They share the layer converters' node recipes."""

from __future__ import annotations

import numpy as np

from everyo_layers.geometry import window_arguments
from everyo_onnx.converters.activation import gelu_nodes
from everyo_onnx.converters.by_name import by_op_name
from everyo_onnx.converters.conv import KERNEL_HWIO_TO_OIHW, in_nchw
from everyo_onnx.converters.norm import layer_norm_nodes
from everyo_onnx.converters.resample import resample


def convert_gelu_op(ctx, x, approximate="none"):
    return gelu_nodes(ctx, x, approximate)


def convert_leaky_relu_op(ctx, x, negative_slope=0.01):
    return ctx.node("LeakyRelu", [x], alpha=float(negative_slope))


def convert_layer_norm_op(ctx, x, weight=None, bias=None, ndims=1, eps=1e-5):
    trailing = ctx.shape(x)[-ndims:]
    if weight is None:
        weight = ctx.constant(np.ones(trailing, np.float32), "weight")
    return layer_norm_nodes(ctx, x, weight, bias, ndims, eps)


def _pads(pads) -> list[int]:
    (top, bottom), (left, right) = pads
    return [int(top), int(left), int(bottom), int(right)]


def convert_conv2d_op(ctx, x, weight, bias=None, stride=(1, 1), padding=((0, 0), (0, 0)),
                      dilation=(1, 1)):
    kernel = ctx.shape(weight)[:2]
    kernel, stride, pads, dilation = window_arguments("conv2d", ctx.sample(x), kernel, stride,
                                                      padding, dilation)
    inputs = [ctx.node("Transpose", [weight], perm=list(KERNEL_HWIO_TO_OIHW))]
    if bias is not None:
        inputs.append(bias)
    return in_nchw(ctx, x, "Conv", inputs, kernel_shape=list(kernel), strides=list(stride),
                   dilations=list(dilation), pads=_pads(pads), group=1)


def pool_converter(onnx_op: str, **extra):
    def convert(ctx, x, pool_size=(2, 2), stride=None, padding=((0, 0), (0, 0)), **options):
        pool, stride, pads, _ = window_arguments(
            onnx_op, ctx.sample(x), pool_size, pool_size if stride is None else stride, padding)
        attributes = dict(extra)
        if "count_include_pad" in options:  # avg_pool2d's option (PyTorch's default: True)
            attributes["count_include_pad"] = int(options.pop("count_include_pad"))
        if options:
            ctx.refuse(f"{onnx_op}: unsupported options {sorted(options)}")
        return in_nchw(ctx, x, onnx_op, kernel_shape=list(pool), strides=list(stride),
                       pads=_pads(pads), **attributes)

    convert.__name__ = f"convert_{onnx_op.lower()}_op"
    return convert


def refuse_recurrent_op(ctx, *inputs, **attrs):
    """The fused recurrent ops have a ``composite`` (their second derivatives), which the
    tracer would unroll into a graph valid for the traced sequence length only: refused, as
    their layers are by name."""
    ctx.refuse("a recurrent time loop is refused by design, as RNN/LSTM/GRU and their cells "
               "are (an unrolled graph would hold for the traced sequence length only)")


def convert_resample2d_op(ctx, x, rows=None, cols=None):
    """``eo.interpolate`` and any other caller of ``resample2d``: its matrices, as the layers'."""
    return resample(ctx, x, rows, cols)


CONVERTERS = by_op_name({
    "resample2d": convert_resample2d_op,
    "rnn": refuse_recurrent_op,
    "lstm": refuse_recurrent_op,
    "bilstm": refuse_recurrent_op,
    "gru": refuse_recurrent_op,
    "gelu": convert_gelu_op,
    "leaky_relu": convert_leaky_relu_op,
    "layer_norm": convert_layer_norm_op,
    "conv2d": convert_conv2d_op,
    "max_pool2d": pool_converter("MaxPool"),
    # NOTE: count_include_pad=0: the op averages over the real cells only, as Keras does.
    "avg_pool2d": pool_converter("AveragePool", count_include_pad=0),
})
