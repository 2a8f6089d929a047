"""Op converters for the core's comparisons and in-place writes.

A comparison (``x > 0``, ``mask == 0``) is a Less/Greater/Equal node on its operands brought to
one type (ONNX orders numbers only: booleans compare as int64). An in-place write
(``h.add_(1)``, ``h.clamp_(0, 6)``, ``h.copy_(v)``) is the out-of-place node computing the new
value; the tracer then names that node's output as the written tensor's value, so every later
use reads it (see docs/onnx.md). ``t[index] = value`` of one value is a ``Where`` over a mask
of the selected elements (a boolean mask index, or basic indexing that selects every element
along the axes whose size follows the input's size); other forms are refused by name.
"""

from __future__ import annotations

import numpy as np

from everyo import Tensor
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


def convert_setitem(ctx, target, value, index=None):
    """``t[index] = value`` as ``Where(mask, value, t)``, for a single value."""
    if int(np.prod(ctx.shape(value))) != 1:
        ctx.refuse(f"t[index] = value writes a value of shape {ctx.shape(value)}; only one value "
                   f"(a number or a one-element tensor) is exported, as a Where")
    scalar = ctx.node("Reshape", [ctx.cast(value, ctx.result.dtype), ctx.ints([], "scalar")])
    return ctx.node("Where", [_selected(ctx, target, index), scalar, target])


def _selected(ctx, target: str, index) -> str:
    """A boolean value, True where ``target[index]`` selects (broadcasting to ``target``)."""
    shape = ctx.shape(target)
    items = index if isinstance(index, tuple) else (index,)
    mask = items[0].data if len(items) == 1 and isinstance(items[0], Tensor) else items[0]
    if len(items) == 1 and isinstance(mask, np.ndarray) and mask.dtype == bool \
            and mask.shape == shape:
        return ctx.cast(ctx.value(items[0]), np.bool_)
    if any(isinstance(i, (Tensor, np.ndarray, list)) for i in items):
        ctx.refuse("t[index] = value with an array index other than a boolean mask of the "
                   "tensor's shape is not exported")
    plain = np.zeros(shape, bool)
    plain[index] = True
    for axis in sorted(ctx.dynamic_axes(target)):
        first = plain.take([0], axis=axis)
        if not (plain == first).all():
            ctx.refuse(f"t[index] = value selects part of axis {axis}, whose size follows the "
                       f"input's size; the graph would write the traced size's elements")
        plain = first
    return ctx.constant(plain, "setitem_mask", np.bool_)


CONVERTERS = by_op_name({
    **{name: comparison(name) for name in COMPARISONS},
    "add_": written("Add"),
    "sub_": written("Sub"),
    "mul_": written("Mul"),
    "div_": written("Div"),
    "copy_": convert_copy_in_place,
    "clamp_": convert_clamp_in_place,
    "setitem": convert_setitem,
})
