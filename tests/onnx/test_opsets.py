"""Operators whose form changed between opsets are written in the form of the graph's opset:
the Reduce operators' axes (an input from opset 13 for ReduceSum, from 18 for the others)."""

from __future__ import annotations

import numpy as np
import pytest

from everyo_onnx.converters.reduce import reduce_node
from everyo_onnx.graph import GraphContext

# The ONNX specification's: the first opset in which each takes its axes as an input.
AXES_INPUT_SINCE = {"ReduceSum": 13, "ReduceMean": 18, "ReduceMax": 18, "ReduceMin": 18,
                    "ReduceProd": 18}
REFERENCE = {"ReduceSum": np.sum, "ReduceMean": np.mean, "ReduceMax": np.max,
             "ReduceMin": np.min, "ReduceProd": np.prod}


class Unscoped:
    """The one thing a graph context asks its tracer outside a trace: the current scope."""

    @staticmethod
    def scope() -> str:
        return ""


@pytest.mark.parametrize("opset", [13, 17, 18])
@pytest.mark.parametrize("op_type", sorted(REFERENCE))
@pytest.mark.parametrize("keepdims", [True, False])
def test_one_reduce_writer_for_every_opset(onnx, ort, opset, op_type, keepdims):
    """Regression: a second writer put ReduceSum's axes in an attribute before opset 18,
    which ReduceSum has not accepted since opset 13."""
    from onnx.reference import ReferenceEvaluator

    x = np.random.default_rng(0).standard_normal((2, 3, 4)).astype(np.float32)
    ctx = GraphContext(opset, Unscoped())
    ctx.add_input("x", x, frozenset())
    out = reduce_node(ctx, op_type, "x", [0, 2], keepdims)
    ctx.sample(out)  # (a trace knows every value's sample before the model is built)
    node = ctx.nodes[-1]
    as_input = opset >= AXES_INPUT_SINCE[op_type]
    assert (len(node.input) == 2) == as_input
    assert any(a.name == "axes" for a in node.attribute) != as_input
    model = ctx.build_model([(out, "y")], {}, doc="", producer_version="0")
    onnx.checker.check_model(model, full_check=True)
    expected = REFERENCE[op_type](x, axis=(0, 2), keepdims=keepdims)
    session = ort.InferenceSession(model.SerializeToString(), providers=["CPUExecutionProvider"])
    for run in (lambda: session.run(None, {"x": x}),
                lambda: ReferenceEvaluator(model).run(None, {"x": x})):
        np.testing.assert_allclose(run()[0], expected, rtol=1e-5, atol=1e-6)


def test_no_axes_is_an_identity(onnx):
    ctx = GraphContext(17, Unscoped())
    ctx.add_input("x", np.float32(3.0), frozenset())
    reduce_node(ctx, "ReduceSum", "x", [])
    assert [node.op_type for node in ctx.nodes] == ["Identity"]
