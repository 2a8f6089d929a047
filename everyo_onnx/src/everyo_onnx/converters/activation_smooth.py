"""SiLU, Softplus (with beta and threshold), ELU, Hardswish and Mish."""

from __future__ import annotations

import numpy as np

from everyo_onnx.converters.by_name import by_layer_name


def convert_silu(layer, ctx, x: str) -> str:
    return ctx.node("Mul", [x, ctx.node("Sigmoid", [x])])


def convert_softplus(layer, ctx, x: str) -> str:
    """``where(beta x > threshold, x, softplus(beta x) / beta)``: ONNX's Softplus has neither
    parameter."""
    beta = ctx.constant(np.array(layer.beta, np.float32), "beta")
    scaled = ctx.node("Mul", [x, beta])
    smooth = ctx.node("Div", [ctx.node("Softplus", [scaled]), beta])
    linear = ctx.node("Greater", [scaled, ctx.constant(np.array(layer.threshold, np.float32),
                                                       "threshold")])
    return ctx.node("Where", [linear, x, smooth])


def convert_elu(layer, ctx, x: str) -> str:
    return ctx.node("Elu", [x], alpha=float(layer.alpha))


def convert_hardswish(layer, ctx, x: str) -> str:
    return ctx.node("HardSwish", [x])


def convert_mish(layer, ctx, x: str) -> str:
    return ctx.node("Mul", [x, ctx.node("Tanh", [ctx.node("Softplus", [x])])])


CONVERTERS = by_layer_name({"SiLU": convert_silu, "Softplus": convert_softplus,
                            "ELU": convert_elu, "Hardswish": convert_hardswish,
                            "Mish": convert_mish})
