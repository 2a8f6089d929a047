"""The one writer of ONNX's Reduce operators, whose ``axes`` moved from an attribute to an
input: in opset 13 for ReduceSum, in opset 18 for the others (ReduceMean, ReduceMax, ...)."""

from __future__ import annotations

#: The first opset in which each Reduce operator takes its axes as an input.
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18,
                    "ReduceProd": 18, "ReduceSumSquare": 18, "ReduceL1": 18, "ReduceL2": 18,
                    "ReduceLogSum": 18, "ReduceLogSumExp": 18}


def reduce_node(ctx, op_type: str, x: str, axes, keepdims: bool = True) -> str:
    """``op_type`` (e.g. "ReduceMean") of ``x`` over ``axes``, written for the graph's opset;
    no axes (a 0-d input) is an Identity: nothing to reduce."""
    axes = [int(a) for a in axes]
    if not axes:
        return ctx.node("Identity", [x])
    if ctx.since(AXES_INPUT_SINCE[op_type]):
        return ctx.node(op_type, [x, ctx.ints(axes, "axes")], keepdims=int(keepdims))
    return ctx.node(op_type, [x], axes=axes, keepdims=int(keepdims))
