"""Op converters for the ops ported PyTorch code reaches for: ``expand``, ``tril``/``triu``,
``diag``, ``cumsum``, ``gather``/``scatter_add`` and ``einsum``."""

from __future__ import annotations

import numpy as np

from everyo.kernels import parse_einsum_equation
from everyo_onnx.converters.by_name import by_op_name
from everyo_onnx.converters.ops_shape import symbolic_sizes
from everyo_onnx.converters.reduce import reduce_node
from everyo_onnx.symbolic import SymInt


def convert_expand(ctx, x, shape):
    # NOTE: ONNX's Expand broadcasts both ways, so 1 in the target keeps the input's size.
    target = symbolic_sizes(ctx, x, shape, keep=1)
    return ctx.node("Expand", [ctx.cast(x, ctx.result.dtype), ctx.ints(target, "shape")])


def triangle_converter(upper: int):
    def convert(ctx, x, k=0):
        return ctx.node("Trilu", [x, ctx.constant(int(k), "k", np.int64)], upper=upper)

    convert.__name__ = "convert_triu" if upper else "convert_tril"
    return convert


def convert_diag(ctx, x, diagonal=0):
    # NOTE: ONNX has no Diag. EyeLike marks the diagonal and Where keeps it (a Mul by the
    # identity would turn an inf elsewhere into NaN); the matrix case sums each row onto
    # -0.0, which leaves every value exactly as it was (+0.0 and -0.0 included).
    k = int(diagonal)
    (x,) = [ctx.cast(x, ctx.result.dtype)]
    if len(ctx.shape(x)) == 1:
        zero = ctx.constant(0.0, "zero", ctx.dtype(x))
        row = ctx.node("Unsqueeze", [x, ctx.ints([0], "axes")])
        outer = ctx.node("Mul", [ctx.node("Unsqueeze", [x, ctx.ints([1], "axes")]), row])
        on = ctx.cast(ctx.node("EyeLike", [outer]), np.bool_)  # (n, n): only its shape counts
        square = ctx.node("Where", [on, row, zero])
        pads = [max(-k, 0), max(k, 0), max(k, 0), max(-k, 0)]
        return ctx.node("Pad", [square, ctx.ints(pads, "pads"), zero], mode="constant") if k \
            else square
    if ctx.dynamic_axes(x):
        ctx.refuse("diag of a matrix whose size follows the input: the diagonal's length "
                   "would be fixed at the traced size")
    rows, columns = ctx.shape(x)
    kept = ctx.node("Where", [ctx.cast(ctx.node("EyeLike", [x], k=k), np.bool_), x,
                              ctx.constant(-0.0, "negative_zero", ctx.dtype(x))])
    axis, length = (1, min(rows, columns - k)) if k >= 0 else (0, min(columns, rows + k))
    line = reduce_node(ctx, "ReduceSum", kept, [axis], keepdims=False)
    return ctx.node("Slice", [line, ctx.ints([0], "starts"), ctx.ints([max(length, 0)], "ends"),
                              ctx.ints([0], "axes")])


def convert_cumsum(ctx, x, axis):
    (x,) = [ctx.cast(x, ctx.result.dtype)]
    return ctx.node("CumSum", [x, ctx.constant(int(axis), "axis", np.int64)])


def convert_gather(ctx, x, axis, index):
    indices = ctx.cast(ctx.value(index), np.int64)
    axis = int(axis) % len(ctx.shape(x))
    # NOTE: like PyTorch's, the index may be shorter than x along the other axes; ONNX's
    # GatherElements wants them equal, so x is cut to the index's size there first.
    shorter = [d for d, (n, m) in enumerate(zip(ctx.shape(indices), ctx.shape(x)))
               if d != axis and n < m]
    if shorter:
        ends = [SymInt(ctx.shape(indices)[d], ("dim", indices, d)) for d in shorter]
        x = ctx.node("Slice", [x, ctx.ints([0] * len(shorter), "starts"), ctx.ints(ends, "ends"),
                               ctx.ints(shorter, "axes")])
    return ctx.node("GatherElements", [x, indices], axis=axis)


def convert_scatter_add(ctx, src, axis, index, shape):
    (src,) = [ctx.cast(src, ctx.result.dtype)]
    zero = ctx.constant(0, "zero", ctx.dtype(src))
    zeros = ctx.node("Expand", [zero, ctx.ints(shape, "shape")])
    indices = ctx.cast(ctx.value(index), np.int64)
    return ctx.node("ScatterElements", [zeros, indices, src], axis=int(axis), reduction="add")


def convert_einsum(ctx, *xs, equation):
    terms, output = parse_einsum_equation(equation, [ctx.shape(x) for x in xs])
    parts = [ctx.cast(x, ctx.result.dtype) for x in xs]
    return ctx.node("Einsum", parts, equation=",".join(terms) + "->" + output)


CONVERTERS = by_op_name({
    "expand": convert_expand,
    "tril": triangle_converter(0),
    "triu": triangle_converter(1),
    "diag": convert_diag,
    "cumsum": convert_cumsum,
    "gather": convert_gather,
    "scatter_add": convert_scatter_add,
    "einsum": convert_einsum,
})
