"""Normalization: batch norm folded into a scale-and-shift, layer norm from primitive nodes."""

from __future__ import annotations

import numpy as np

from everyo_onnx.converters.by_name import by_layer_name
from everyo_onnx.converters.reduce import reduce_node


def convert_batch_norm(layer, ctx, x: str) -> str:
    """Eval-mode batch norm ``(x - mean) / sqrt(var + eps) * gamma + beta`` as ``x * s + t``.

    The channel axis is last in both BatchNorm1D and BatchNorm2D, so ``s`` and ``t`` of shape
    ``(C,)`` broadcast without any layout question. The fold is computed in float64 and rounded
    once to float32.
    """
    if not layer.track_running_stats or layer.running_mean is None:
        ctx.refuse("built with track_running_stats=False, so it has no inference statistics "
                   "(it would normalise each batch by its own statistics); nothing faithful "
                   "can be exported")
    mean = np.asarray(layer.running_mean, np.float64)
    scale = 1.0 / np.sqrt(np.asarray(layer.running_var, np.float64) + layer.eps)
    if layer.weight is not None:
        scale = scale * layer.weight.data.astype(np.float64)
    shift = -mean * scale
    if layer.bias is not None:
        shift = shift + layer.bias.data.astype(np.float64)
    scaled = ctx.node("Mul", [x, ctx.constant(scale, "bn_scale")])
    return ctx.node("Add", [scaled, ctx.constant(shift, "bn_shift")])


def convert_layer_norm(layer, ctx, x: str) -> str:
    """Layer norm over the trailing ``len(normalized_shape)`` axes (see :func:`layer_norm_nodes`)."""
    shape = layer.normalized_shape
    weight = np.ones(shape, np.float32) if layer.weight is None else layer.weight.data
    bias = None if layer.bias is None else ctx.constant(layer.bias.data, "bias")
    return layer_norm_nodes(ctx, x, ctx.constant(weight, "weight"), bias, len(shape), layer.eps)


def layer_norm_nodes(ctx, x: str, weight: str, bias: str | None, ndims: int, eps: float) -> str:
    """Normalise ``x`` over its trailing ``ndims`` axes, scale and shift, from primitive nodes:
    mean, centre, mean of the squared centred values.

    NOTE: not ONNX's LayerNormalization: onnxruntime before about 1.24 computes its variance as
    E[x^2] - E[x]^2 in float32, which cancels catastrophically when the mean is large against
    the spread (measured with 1.19 and 1.23: errors up to 0.38 on inputs of mean 5 and spread
    0.01, where this form stays at float32 rounding), and 1.23 (the newest for Python 3.10)
    refuses it over a single element. Two passes are right in every runtime.
    """
    axes = list(range(-ndims, 0))
    centered = ctx.node("Sub", [x, reduce_node(ctx, "ReduceMean", x, axes)])
    variance = reduce_node(ctx, "ReduceMean", ctx.node("Mul", [centered, centered]), axes)
    epsilon = ctx.constant(np.array(eps, np.float32), "eps")
    normalized = ctx.node("Div", [centered, ctx.node("Sqrt", [ctx.node("Add", [variance,
                                                                              epsilon])])])
    out = ctx.node("Mul", [normalized, weight])
    return out if bias is None else ctx.node("Add", [out, bias])


CONVERTERS = by_layer_name({
    "BatchNorm1D": convert_batch_norm,
    "BatchNorm2D": convert_batch_norm,
    "LayerNorm": convert_layer_norm,
})
