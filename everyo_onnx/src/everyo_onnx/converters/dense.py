"""Layers that need no layout change: Linear, Flatten, Dropout. (Containers such as
Sequential need no converter: the tracer enters them.)"""

from __future__ import annotations

from everyo_onnx.converters.by_name import by_layer_name


def convert_linear(layer, ctx, x: str) -> str:
    # NOTE: MatMul + Add rather than Gemm: Gemm is 2-D only, Linear takes (N, ..., in).
    weight = layer.weight.data.T if layer.weight_transposed else layer.weight.data  # tied
    y = ctx.node("MatMul", [x, ctx.constant(weight, "weight")])
    if layer.bias is None:
        return y
    return ctx.node("Add", [y, ctx.constant(layer.bias.data, "bias")])


def convert_flatten(layer, ctx, x: str) -> str:
    # ONNX Flatten(axis=1) keeps the batch axis symbolic and is row-major, like the layer.
    return ctx.node("Flatten", [x], axis=1)


def convert_dropout(layer, ctx, x: str) -> str:
    # Exported models are for inference: eval-mode Dropout is the identity.
    return ctx.node("Identity", [x])


CONVERTERS = by_layer_name({
    "Linear": convert_linear,
    "Flatten": convert_flatten,
    "Dropout": convert_dropout,
})
