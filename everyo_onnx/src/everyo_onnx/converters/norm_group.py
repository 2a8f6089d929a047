"""GroupNorm, RMSNorm and InstanceNorm from primitive nodes (ONNX's GroupNormalization changed meaning
between opsets 18 and 21, and RMSNormalization needs opset 23)."""

from __future__ import annotations

import numpy as np

from everyo_onnx.converters.by_name import by_layer_name
from everyo_onnx.converters.norm import convert_batch_norm
from everyo_onnx.converters.reduce import reduce_node


def _normalize(ctx, centered: str, squares_of: str, axes, eps: float) -> str:
    variance = reduce_node(ctx, "ReduceMean", ctx.node("Mul", [squares_of, squares_of]), axes)
    eps_name = ctx.constant(np.array(eps, np.float32), "eps")
    return ctx.node("Div", [centered, ctx.node("Sqrt", [ctx.node("Add", [variance, eps_name])])])


def convert_group_norm(layer, ctx, x: str) -> str:
    shape = ctx.shape(x)
    c, g = layer.num_channels, layer.num_groups
    # NOTE: 0 keeps the (symbolic) batch size; every other size is known.
    grouped = ctx.node("Reshape", [x, ctx.constant(np.array([0, -1, g, c // g]), "group_shape",
                                                   dtype=np.int64)])
    centered = ctx.node("Sub", [grouped, reduce_node(ctx, "ReduceMean", grouped, [1, 3])])
    normalized = _normalize(ctx, centered, centered, [1, 3], layer.eps)
    out = ctx.node("Reshape", [normalized, ctx.constant(np.array((0,) + shape[1:]), "shape",
                                                        dtype=np.int64)])
    if layer.weight is not None:
        out = ctx.node("Mul", [out, ctx.constant(layer.weight.data, "weight")])
        out = ctx.node("Add", [out, ctx.constant(layer.bias.data, "bias")])
    return out


def convert_rms_norm(layer, ctx, x: str) -> str:
    axes = list(range(-len(layer.normalized_shape), 0))
    eps = float(np.finfo(np.float32).eps) if layer.eps is None else layer.eps
    out = _normalize(ctx, x, x, axes, eps)
    if layer.weight is not None:
        out = ctx.node("Mul", [out, ctx.constant(layer.weight.data, "weight")])
    return out


def convert_instance_norm(layer, ctx, x: str) -> str:
    """Each sample's channels over its positions (the axes between batch and channels); with
    tracked running statistics, eval mode is batch norm's scale-and-shift."""
    if layer.track_running_stats:
        return convert_batch_norm(layer, ctx, x)
    axes = list(range(1, len(ctx.shape(x)) - 1))
    centered = ctx.node("Sub", [x, reduce_node(ctx, "ReduceMean", x, axes)])
    out = _normalize(ctx, centered, centered, axes, layer.eps)
    if layer.weight is not None:
        out = ctx.node("Mul", [out, ctx.constant(layer.weight.data, "weight")])
        out = ctx.node("Add", [out, ctx.constant(layer.bias.data, "bias")])
    return out


CONVERTERS = by_layer_name({"GroupNorm": convert_group_norm, "RMSNorm": convert_rms_norm,
                            "InstanceNorm1D": convert_instance_norm,
                            "InstanceNorm2D": convert_instance_norm})
