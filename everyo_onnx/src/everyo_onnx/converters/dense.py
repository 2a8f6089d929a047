"""Containers and the layers that need no layout change: Sequential, Linear, Flatten, Dropout."""

from __future__ import annotations

from everyo import Sequential
from everyo_layers.dropout import Dropout
from everyo_layers.linear import Linear
from everyo_layers.reshape import Flatten


def convert_sequential(model, ctx, x: str) -> str:
    """Each child in order; positions feed the ``[i][j] Layer`` labels of error messages."""
    for position, layer in enumerate(model):
        x = ctx.convert(layer, x, position=position)
    return x


def convert_linear(layer, ctx, x: str) -> str:
    # NOTE: MatMul + Add rather than Gemm: Gemm is 2-D only, Linear takes (N, ..., in).
    y = ctx.node("MatMul", [x, ctx.constant(layer.weight.data, "weight")])
    if layer.bias is None:
        return y
    return ctx.node("Add", [y, ctx.constant(layer.bias.data, "bias")])


def convert_flatten(layer, ctx, x: str) -> str:
    # ONNX Flatten(axis=1) keeps the batch axis symbolic and is row-major, like the layer.
    return ctx.node("Flatten", [x], axis=1)


def convert_dropout(layer, ctx, x: str) -> str:
    # Exported models are for inference: eval-mode Dropout is the identity.
    return ctx.node("Identity", [x])


CONVERTERS = {
    Sequential: convert_sequential,
    Linear: convert_linear,
    Flatten: convert_flatten,
    Dropout: convert_dropout,
}
