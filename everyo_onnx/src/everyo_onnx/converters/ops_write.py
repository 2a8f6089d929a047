"""Op converters for the core's comparisons and in-place writes.

A comparison (``x > 0``, ``mask == 0``) is a Less/Greater/Equal node on its operands brought to
one type (ONNX orders numbers only: booleans compare as int64). An in-place write
(``h.add_(1)``, ``h.clamp_(0, 6)``, ``h.copy_(v)``) is the out-of-place node computing the new
value; the tracer then names that node's output as the written tensor's value, so every later
use reads it (see docs/onnx.md). ``t[index] = value`` has no converter: the tracer refuses it.
"""

from __future__ import annotations

import numpy as np

from everyo_onnx.converters.by_name import by_op_name

#: comparison op -> ONNX node (``ne`` is ``Not(Equal)``).
COMPARISONS = {"lt": "Less", "le": "LessOrEqual", "gt": "Greater", "ge": "GreaterOrEqual",
               "eq": "Equal", "ne": "Equal"}


def comparison(name: str):
    def convert(ctx, a, b):
        common = np.result_type(ctx.dtype(a), ctx.dtype(b))
        if common.kind == "b" and name not in ("eq", "ne"):
            common = np.dtype(np.int64)  # ONNX orders numbers only
        out = ctx.node(COMPARISONS[name], [ctx.cast(a, common), ctx.cast(b, common)])
        return ctx.node("Not", [out]) if name == "ne" else out

    convert.__name__ = f"convert_{name}"
    return convert


def written(onnx_op: str):
    """``target <op>= value``: the value cast to the target's dtype (NumPy's same-kind cast)."""
    def convert(ctx, target, value):
        return ctx.node(onnx_op, [target, ctx.cast(value, ctx.result.dtype)])

    convert.__name__ = f"convert_{onnx_op.lower()}_in_place"
    return convert


def convert_copy_in_place(ctx, target, value):
    """The value cast to the target's dtype and broadcast to its shape."""
    shape = ctx.node("Shape", [target])
    return ctx.node("Expand", [ctx.cast(value, ctx.result.dtype), shape])


def convert_clamp_in_place(ctx, target, *values, bounds=("min", "max")):
    # NOTE: Max/Min rather than Clip, as for eo.clip: the bounds may be arrays that broadcast.
    out = target
    for bound, value in zip(bounds, values):
        out = ctx.node("Max" if bound == "min" else "Min", [out, ctx.cast(value, ctx.result.dtype)])
    return out if out != target else ctx.node("Identity", [target])


CONVERTERS = by_op_name({
    **{name: comparison(name) for name in COMPARISONS},
    "add_": written("Add"),
    "sub_": written("Sub"),
    "mul_": written("Mul"),
    "div_": written("Div"),
    "copy_": convert_copy_in_place,
    "clamp_": convert_clamp_in_place,
})
