"""Normalization: batch norm folded into a scale-and-shift, layer norm as LayerNormalization."""

from __future__ import annotations

import numpy as np

from everyo_layers.norm import BatchNorm1D, BatchNorm2D, LayerNorm


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
    """LayerNormalization (opset 17+) over the trailing ``len(normalized_shape)`` axes."""
    shape = layer.normalized_shape
    weight = np.ones(shape, np.float32) if layer.weight is None else layer.weight.data
    if int(np.prod(shape)) == 1:
        # NOTE: onnxruntime 1.23 (the newest for Python 3.10) refuses LayerNormalization over
        # a single element; the same arithmetic from primitive nodes runs everywhere.
        return _layer_norm_from_primitives(layer, ctx, x, weight)
    inputs = [x, ctx.constant(weight, "weight")]
    if layer.bias is not None:
        inputs.append(ctx.constant(layer.bias.data, "bias"))
    return ctx.node("LayerNormalization", inputs, axis=-len(shape), epsilon=float(layer.eps))


def _layer_norm_from_primitives(layer, ctx, x: str, weight: np.ndarray) -> str:
    axes = list(range(-len(layer.normalized_shape), 0))
    centered = ctx.node("Sub", [x, ctx.node("ReduceMean", [x], axes=axes, keepdims=1)])
    variance = ctx.node("ReduceMean", [ctx.node("Mul", [centered, centered])], axes=axes,
                        keepdims=1)
    eps = ctx.constant(np.array(layer.eps, np.float32), "eps")
    normalized = ctx.node("Div", [centered, ctx.node("Sqrt", [ctx.node("Add", [variance, eps])])])
    out = ctx.node("Mul", [normalized, ctx.constant(weight, "weight")])
    if layer.bias is not None:
        out = ctx.node("Add", [out, ctx.constant(layer.bias.data, "bias")])
    return out


CONVERTERS = {
    BatchNorm1D: convert_batch_norm,
    BatchNorm2D: convert_batch_norm,
    LayerNorm: convert_layer_norm,
}
