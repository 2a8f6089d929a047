"""Element-wise activations and (log-)softmax."""

from __future__ import annotations

import math

from everyo_onnx.converters.by_name import by_layer_name

GELU_SINCE = 20  # the first opset with a native Gelu


def convert_relu(layer, ctx, x: str) -> str:
    return ctx.node("Relu", [x])


def convert_sigmoid(layer, ctx, x: str) -> str:
    return ctx.node("Sigmoid", [x])


def convert_tanh(layer, ctx, x: str) -> str:
    return ctx.node("Tanh", [x])


def convert_softmax(layer, ctx, x: str) -> str:
    return ctx.node("Softmax", [x], axis=layer.axis)


def convert_log_softmax(layer, ctx, x: str) -> str:
    return ctx.node("LogSoftmax", [x], axis=layer.axis)


def convert_leaky_relu(layer, ctx, x: str) -> str:
    return ctx.node("LeakyRelu", [x], alpha=float(layer.negative_slope))


def convert_gelu(layer, ctx, x: str) -> str:
    return gelu_nodes(ctx, x, layer.approximate)


def gelu_nodes(ctx, x: str, approximate: str) -> str:
    """The native Gelu op from opset 20 on; before that, its defining formula."""
    if approximate not in ("none", "tanh"):
        ctx.refuse(f"approximate={approximate!r} is not 'none' or 'tanh'")
    if ctx.since(GELU_SINCE):
        return ctx.node("Gelu", [x], approximate=approximate)

    def scalar(value, hint):
        return ctx.constant(value, hint)

    if approximate == "tanh":  # 0.5 x (1 + tanh(sqrt(2/pi) (x + 0.044715 x^3)))
        cube = ctx.node("Mul", [ctx.node("Mul", [x, x]), x])
        inner = ctx.node("Add", [x, ctx.node("Mul", [cube, scalar(0.044715, "gelu_coefficient")])])
        inner = ctx.node("Mul", [inner, scalar(math.sqrt(2.0 / math.pi), "sqrt_2_over_pi")])
        core = ctx.node("Tanh", [inner])
    else:  # 0.5 x (1 + erf(x / sqrt(2)))
        core = ctx.node("Erf", [ctx.node("Mul", [x, scalar(1.0 / math.sqrt(2.0), "rsqrt2")])])
    one_plus = ctx.node("Add", [core, scalar(1.0, "one")])
    return ctx.node("Mul", [ctx.node("Mul", [x, one_plus]), scalar(0.5, "half")])


CONVERTERS = by_layer_name({
    "ReLU": convert_relu,
    "Sigmoid": convert_sigmoid,
    "Tanh": convert_tanh,
    "Softmax": convert_softmax,
    "LogSoftmax": convert_log_softmax,
    "LeakyReLU": convert_leaky_relu,
    "GELU": convert_gelu,
})
