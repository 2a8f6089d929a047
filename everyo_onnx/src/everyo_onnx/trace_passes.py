"""Trace a model at two input sizes and keep the graph only if it does not depend on them.

1. Trace at the given sizes; every refusal (modules refused by name, ops without converter) is
   reported now, all at once.
2. Trace at other sizes with other random values. The two traces must meet the same ops in the
   same order (else Python control flow depends on the input); an axis whose size differs
   between them follows the input's size.
3. Trace again at both sizes with those axes symbolic (``SymInt`` shapes, sizes computed in the
   graph). The two graphs must be identical, node for node and constant for constant;
   otherwise something the tracer cannot see (an ``if`` on a value, a NumPy array built from a
   size, a comparison's result) baked one input's sizes or values into the graph.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from everyo import EveryOSerializationError
from everyo_onnx.arguments import InputSpec, other_sizes
from everyo_onnx.refusals import refusal_message, refused_modules
from everyo_onnx.trace import Tracer


@dataclass
class TracedModel:
    """The kept trace (at the given sizes) and its twin at the other sizes."""

    tracer: Tracer
    other: Tracer
    outputs: list[str]

    @property
    def ctx(self):
        return self.tracer.ctx

    def dimension_names(self, specs: list[InputSpec], output_names: list[str],
                        declared: dict) -> dict:
        """``{graph value: {axis: dim_name}}`` for the inputs and outputs: an output's
        symbolic axis takes the name of the input axis whose sizes it shares in both traces."""
        known = {}
        for spec, other in zip(specs, self.other.ctx.inputs):
            for axis, dim in spec.dims.items():
                pair = (spec.shape[axis], self.other.ctx.samples[other].shape[axis])
                known.setdefault(pair, dim)
        names = {spec.name: dict(spec.dims) for spec in specs}
        for value, other_value, output in zip(self.outputs, self.other.output_names, output_names):
            shape = self.ctx.samples[value].shape
            other_shape = self.other.ctx.samples[other_value].shape
            dynamic = [a for a, (n, m) in enumerate(zip(shape, other_shape)) if n != m]
            mine = declared.get(output, {})
            for axis in mine:
                if axis % max(len(shape), 1) not in dynamic:
                    raise EveryOSerializationError(
                        f"export_onnx: dynamic_axes names axis {axis} of output {output!r}, "
                        f"but its size does not follow any input's size")
            mine = {a % len(shape): d for a, d in mine.items()}
            names[output] = {a: mine.get(a) or known.get((shape[a], other_shape[a]),
                                                         f"{output}_dim{a}") for a in dynamic}
        return names


def trace_model(model, converters: dict, opset: int, specs: list[InputSpec]) -> TracedModel:
    """Trace ``model`` (see the module's docstring); raises on any refusal or dependence."""
    sizes = [spec.shape for spec in specs]
    others = other_sizes(specs)
    first = _trace(model, converters, opset, specs, sizes, flipped=False)
    problems = list(dict.fromkeys(refused_modules(model, first.layer_converters)
                                  + first.problems))
    if problems:
        raise EveryOSerializationError(refusal_message(problems))
    second = _trace(model, converters, opset, specs, others, flipped=True)
    _same_events(first, second, sizes, others)
    kept = _trace(model, converters, opset, specs, sizes, flipped=False, reference=second)
    check = _trace(model, converters, opset, specs, others, flipped=True, reference=first)
    for tracer in (kept, check):
        if tracer.problems:
            raise EveryOSerializationError(refusal_message(tracer.problems))
    _same_graph(kept, check, sizes, others)
    return TracedModel(kept, check, kept.output_names)


def sample_inputs(specs: list[InputSpec], shapes, flipped: bool) -> list[np.ndarray]:
    """Random inputs of ``shapes``; ``flipped`` ones are the same draws negated and scaled by
    1.5 (cropped or repeated to the shape), so a branch on a sign or a threshold of the
    values (``if x.mean() > 0``) likely goes the other way and shows up as a different path."""
    rng = np.random.default_rng(0)
    samples = [rng.standard_normal(spec.shape).astype(np.float32) for spec in specs]
    if not flipped:
        return samples
    return [(-1.5 * np.resize(sample, shape)).astype(np.float32)
            for sample, shape in zip(samples, shapes)]


def _trace(model, converters, opset, specs, shapes, flipped: bool, reference=None) -> Tracer:
    samples = sample_inputs(specs, shapes, flipped)
    tracer = Tracer(model, converters, opset, reference=reference)
    inputs = [(spec.name, sample, frozenset(spec.dims) if reference is not None else frozenset())
              for spec, sample in zip(specs, samples)]
    outputs = tracer.run(inputs)
    tracer.output_names = [] if outputs is None else [tracer.name_of(o) for o in outputs]
    return tracer


def _same_events(first: Tracer, second: Tracer, sizes, others) -> None:
    a, b = first.event_labels, second.event_labels
    if a == b:
        return
    index = next((i for i, (x, y) in enumerate(zip(a, b)) if x != y), min(len(a), len(b)))
    seen = (f"{a[index]!r} then {b[index]!r}" if index < min(len(a), len(b))
            else f"{len(a)} then {len(b)} ops")
    raise EveryOSerializationError(
        f"cannot export to ONNX: the forward pass takes a different path for inputs of shape "
        f"{_shapes(sizes)} and {_shapes(others)} (other values too): at step {index} it ran "
        f"{seen}. Python control flow that depends on the input's values or size (an `if` on "
        f"a tensor, a loop over its length) cannot be traced into a graph. Nothing was written.")


def _same_graph(kept: Tracer, check: Tracer, sizes, others) -> None:
    a, b = kept.ctx, check.ctx
    for x, y in zip(a.nodes, b.nodes):
        if x.SerializeToString() != y.SerializeToString():
            _depends(f"node {x.name!r} ({x.op_type}) differs", sizes, others)
    if len(a.nodes) != len(b.nodes):
        _depends(f"{len(a.nodes)} nodes against {len(b.nodes)}", sizes, others)
    for x, y in zip(a.initializers, b.initializers):
        if x.SerializeToString() != y.SerializeToString():
            _depends(f"constant {x.name!r} (shape {list(x.dims)}) differs from {y.name!r} "
                     f"(shape {list(y.dims)})", sizes, others)
    if len(a.initializers) != len(b.initializers):
        _depends(f"{len(a.initializers)} constants against {len(b.initializers)}", sizes, others)


def _depends(what: str, sizes, others):
    raise EveryOSerializationError(
        f"cannot export to ONNX: the traced graph depends on the input: traced at "
        f"{_shapes(sizes)} and at {_shapes(others)} with other values, {what}. Something the "
        f"tracer cannot follow baked a size or a value into the graph: an `if` on a tensor's "
        f"value, a NumPy array or Python number computed from a size or a value (a mask built "
        f"with np.tril(np.ones((t, t))), a mask computed in NumPy from the input's values), or a "
        f"size read other than through `.shape`. Slice a tensor built once at full size instead "
        f"(`self.mask[:t, :t]`). Nothing was written.")


def _shapes(shapes) -> str:
    return ", ".join(str(tuple(s)) for s in shapes)
