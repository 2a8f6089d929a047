"""Opset-independent reductions: ``axes`` became an input in opset 18 (ReduceMean, ReduceMax,
...), an attribute before."""

from __future__ import annotations

import numpy as np

FIRST_OPSET_WITH_AXES_INPUT = 18


def reduce_node(ctx, op_type: str, x: str, axes, keepdims: bool = True) -> str:
    """``op_type`` (e.g. "ReduceMean") of ``x`` over ``axes``, written for the graph's opset."""
    axes = [int(a) for a in axes]
    if ctx.opset >= FIRST_OPSET_WITH_AXES_INPUT:
        return ctx.node(op_type, [x, ctx.constant(np.array(axes), "axes", dtype=np.int64)],
                        keepdims=int(keepdims))
    return ctx.node(op_type, [x], axes=axes, keepdims=int(keepdims))
