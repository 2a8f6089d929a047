"""Op converters for the core's arithmetic: elementwise ops, reductions, softmax, matmul.

An op converter is ``converter(ctx, *input_names, **attrs) -> output_name``, registered for an
``Op`` class; ``attrs`` are the op's own keyword attributes. Inputs are cast to the op's result
dtype first where NumPy would promote (ONNX's elementwise ops take one type).
"""

from __future__ import annotations

import numpy as np

from everyo_onnx.converters.by_name import by_op_name
from everyo_onnx.converters.reduce import reduce_node


def _typed(ctx, names) -> list[str]:
    """Each input in the op's result dtype."""
    return [ctx.cast(name, ctx.result.dtype) for name in names]


def elementwise(onnx_op: str):
    def convert(ctx, *inputs):
        return ctx.node(onnx_op, _typed(ctx, inputs))

    convert.__name__ = f"convert_{onnx_op.lower()}"
    return convert


def convert_where(ctx, condition, a, b):
    a, b = _typed(ctx, (a, b))
    return ctx.node("Where", [ctx.cast(condition, np.bool_), a, b])


def convert_clip(ctx, x, min=None, max=None):  # the op's own attribute names
    # NOTE: Max/Min rather than Clip: the bounds may be arrays that broadcast, as in np.clip.
    (x,) = _typed(ctx, (x,))
    dtype = ctx.dtype(x)
    if min is not None:
        x = ctx.node("Max", [x, ctx.constant(min, "clip_min", dtype)])
    if max is not None:
        x = ctx.node("Min", [x, ctx.constant(max, "clip_max", dtype)])
    return x if min is not None or max is not None else ctx.node("Identity", [x])


def convert_cast(ctx, x, dtype):
    out = ctx.cast(x, dtype)
    return out if out != x else ctx.node("Identity", [x])


def convert_matmul(ctx, a, b, bias=None):
    a, b = _typed(ctx, (a, b))
    out = ctx.node("MatMul", [a, b])
    return out if bias is None else ctx.node("Add", [out, ctx.cast(bias, ctx.result.dtype)])


def reduce_axes(ctx, x, axis) -> list[int]:
    ndim = len(ctx.shape(x))
    if axis is None:
        return list(range(ndim))
    axes = (axis,) if isinstance(axis, (int, np.integer)) else tuple(axis)
    return sorted(int(a) % max(ndim, 1) for a in axes)


def reduction_converter(onnx_op: str):
    def convert(ctx, x, axis=None, keepdims=False):
        (x,) = _typed(ctx, (x,))
        return reduce_node(ctx, onnx_op, x, reduce_axes(ctx, x, axis), keepdims)

    convert.__name__ = f"convert_{onnx_op.lower()}"
    return convert


def convert_var(ctx, x, axis=None, keepdims=False, ddof=0):
    (x,) = _typed(ctx, (x,))
    axes = reduce_axes(ctx, x, axis)
    if ddof and set(axes) & ctx.dynamic_axes(x):
        ctx.refuse(f"ddof={ddof} over an axis whose size follows the input's size")
    centered = ctx.node("Sub", [x, reduce_node(ctx, "ReduceMean", x, axes)])
    variance = reduce_node(ctx, "ReduceMean", ctx.node("Mul", [centered, centered]), axes,
                           keepdims)
    if not ddof:
        return variance
    count = int(np.prod([ctx.shape(x)[a] for a in axes]))
    return ctx.node("Mul", [variance, ctx.constant(count / (count - ddof), "bessel")])


def softmax_converter(onnx_op: str):
    def convert(ctx, x, axis=-1):
        (x,) = _typed(ctx, (x,))
        return ctx.node(onnx_op, [x], axis=int(axis))

    convert.__name__ = f"convert_{onnx_op.lower()}"
    return convert


CONVERTERS = by_op_name({
    "add": elementwise("Add"),
    "sub": elementwise("Sub"),
    "mul": elementwise("Mul"),
    "div": elementwise("Div"),
    "pow": elementwise("Pow"),
    "maximum": elementwise("Max"),
    "minimum": elementwise("Min"),
    "where": convert_where,
    "clip": convert_clip,
    "neg": elementwise("Neg"),
    "abs": elementwise("Abs"),
    "exp": elementwise("Exp"),
    "log": elementwise("Log"),
    "sqrt": elementwise("Sqrt"),
    "tanh": elementwise("Tanh"),
    "sigmoid": elementwise("Sigmoid"),
    "relu": elementwise("Relu"),
    "cast": convert_cast,
    "sum": reduction_converter("ReduceSum"),
    "mean": reduction_converter("ReduceMean"),
    "max": reduction_converter("ReduceMax"),
    "min": reduction_converter("ReduceMin"),
    "var": convert_var,
    "softmax": softmax_converter("Softmax"),
    "log_softmax": softmax_converter("LogSoftmax"),
    "matmul": convert_matmul,
})
