"""The ONNX graph being built during one trace, and the API converters write it through.

Two kinds of converters write through the same context ``ctx``:

* a *layer converter* ``converter(layer, ctx, input_name) -> output_name`` emits a whole layer
  (a convolution with its layout transposes, a folded batch norm);
* an *op converter* ``converter(ctx, *input_names, **attrs) -> output_name`` emits one core op
  (``add``, ``reshape``, ``getitem`` ...) met while tracing a forward pass, with the op's own
  attributes.

Every value in the graph has a *sample*: the array it held when the traced forward pass ran,
so a converter can ask for a concrete shape (``ctx.shape``) — for padding, say. A value a
converter made itself with ``ctx.node`` gets its sample on demand, by running the graph built so
far in ``onnx.reference`` (so ``ctx.convert`` accepts it).

A context imports ``onnx`` when it is made, that is when a model is exported: importing this
module costs ``import everyo`` nothing.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOSerializationError
from everyo.kernels import is_floating
from everyo_onnx.runtime import import_onnx, reference_evaluator
from everyo_onnx.symbolic import ONNX_ARITHMETIC, SymInt


class ConversionRefused(EveryOSerializationError):
    """A converter declined what it was given (see ``GraphContext.refuse``)."""


def onnx_dtype(dtype: np.dtype) -> np.dtype:
    """The dtype a value of NumPy ``dtype`` has in the graph: floats are float32 (an exported
    model is float32 whatever its parameters are), integers int64, booleans bool."""
    dtype = np.dtype(dtype)
    if is_floating(dtype):  # bfloat16 (kind "V") included
        return np.dtype(np.float32)
    if dtype.kind not in "biu":
        raise EveryOSerializationError(f"export_onnx: a value of dtype {dtype} has no ONNX "
                                       f"equivalent here (float, int and bool are exported)")
    return np.dtype(np.bool_ if dtype.kind == "b" else np.int64)


# ONNX's element types (``onnx.TensorProto.FLOAT``, ``INT64``, ``BOOL``: fixed by the IR).
ELEMENT_TYPE = {np.dtype(np.float32): 1, np.dtype(np.int64): 7, np.dtype(np.bool_): 9}
UNDEFINED_TYPE = 0


class GraphContext:
    """Nodes, constants and values of the graph under construction.

    Converters use :meth:`since` (or ``opset``), :meth:`shape`, :meth:`dtype`, :meth:`node`,
    :meth:`constant`, :meth:`ints`, :meth:`refuse` and :meth:`convert`; op converters also read
    :attr:`result` (the op's output on the sample) and :meth:`dynamic_axes`.
    """

    def __init__(self, opset: int, tracer):
        onnx = import_onnx()
        self._helper, self._numpy_helper = onnx.helper, onnx.numpy_helper
        self.opset = opset
        self.tracer = tracer
        self.nodes: list = []
        self.initializers: list = []
        self.inputs: list[str] = []
        self.samples: dict[str, np.ndarray] = {}
        self.dynamic: dict[str, frozenset] = {}
        self.result: np.ndarray | None = None
        self.result_dynamic: frozenset = frozenset()
        self._taken: set[str] = set()
        self._dims: dict = {}

    # -- what converters call -----------------------------------------------------------------
    def since(self, opset: int) -> bool:
        """Whether the graph is written at ``opset`` or newer: the one test of an operator's
        version (``ctx.since(20)`` for the native Gelu)."""
        return self.opset >= opset

    def shape(self, name: str) -> tuple[int, ...]:
        """The concrete shape of value ``name`` on the traced sample.

        Axes in :meth:`dynamic_axes` (the batch axis always) are symbolic in the exported
        graph, so never write their size into an attribute or constant.
        """
        return tuple(self.sample(name).shape)

    def dtype(self, name: str) -> np.dtype:
        """The value's dtype in the graph (float32, int64 or bool)."""
        return onnx_dtype(self.sample(name).dtype)

    def dynamic_axes(self, name: str) -> frozenset:
        """Axes of value ``name`` whose size follows the input's size (symbolic in the graph)."""
        return self.dynamic.get(name, frozenset())

    def sample(self, name: str) -> np.ndarray:
        """The array value ``name`` held on the traced sample."""
        if name not in self.samples:
            self.samples[name] = self._evaluate(name)
        return self.samples[name]

    def node(self, op_type: str, inputs, outputs: int = 1, **attributes):
        """Append one ONNX node and return its output's name (a list if ``outputs > 1``)."""
        scope = self.tracer.scope()
        names = [self.fresh(f"{scope}/{op_type}_output") for _ in range(outputs)]
        self.nodes.append(self._helper.make_node(op_type, list(inputs), names,
                                           name=self.fresh(f"{scope}/{op_type}"), **attributes))
        return names[0] if outputs == 1 else names

    def constant(self, array, hint: str, dtype=np.float32) -> str:
        """Add ``array`` (cast to ``dtype``) as an initializer and return its name."""
        value = np.array(array, dtype=dtype, order="C")  # NOTE: ascontiguousarray makes 0-d 1-d
        name = self.fresh(f"{self.tracer.scope()}/{hint}")
        self.initializers.append(self._numpy_helper.from_array(value, name=name))
        self.samples[name] = value
        return name

    def value(self, obj) -> str:
        """The graph name of ``obj`` (a Tensor, array or number an op received as an
        attribute): a traced value's own name, else a new constant."""
        return self.tracer.value_of(obj)

    def ints(self, values, hint: str = "ints") -> str:
        """A 1-D int64 value holding ``values``; a ``SymInt`` among them is computed from the
        shape it was read from, so the graph follows the input's size."""
        values = list(values)
        if not any(isinstance(v, SymInt) for v in values):
            return self.constant(np.asarray(values, np.int64).reshape(-1), hint, np.int64)
        pieces = [self._dim(v.expr) if isinstance(v, SymInt)
                  else self.constant([int(v)], hint, np.int64) for v in values]
        if len(pieces) == 1:
            return pieces[0]
        return self.node("Concat", pieces, axis=0)

    def cast(self, name: str, dtype) -> str:
        """``name`` as ``dtype`` (a NumPy dtype) in the graph; no node when it already is."""
        target = onnx_dtype(dtype)
        if self.dtype(name) == target:
            return name
        return self.node("Cast", [name], to=ELEMENT_TYPE[target])

    def refuse(self, reason: str):
        """Decline what is being converted: the export fails naming it and ``reason``."""
        raise ConversionRefused(reason)

    def convert(self, layer, input_name: str, position=None) -> str:
        """Convert ``layer`` applied to value ``input_name`` (from a container's converter):
        its own converter if it has one, else its traced forward pass. Returns its output."""
        return self.tracer.convert_child(layer, input_name, position)

    # -- used by the tracer and the exporter ----------------------------------------------------
    def fresh(self, base: str) -> str:
        name, counter = base, 1
        while name in self._taken:
            name, counter = f"{base}_{counter}", counter + 1
        self._taken.add(name)
        return name

    def add_input(self, name: str, sample: np.ndarray, dynamic: frozenset) -> None:
        self._taken.add(name)
        self.inputs.append(name)
        self.samples[name] = sample
        self.dynamic[name] = dynamic

    def build_model(self, outputs: list[tuple[str, str]], dim_names: dict, doc: str,
                    producer_version: str):
        """The finished ``ModelProto``; ``outputs`` pairs each traced value with its graph
        output name, ``dim_names`` maps (value name, axis) to a symbolic dimension's name."""
        helper = self._helper
        nodes = list(self.nodes)
        producers = {out: node for node in nodes for out in node.output}
        consumed = {name for node in nodes for name in node.input}
        values = [value for value, _ in outputs]
        graph_outputs = []
        for value, output_name in outputs:
            producer = producers.get(value)
            if producer is not None and value not in consumed and values.count(value) == 1:
                producer.output[list(producer.output).index(value)] = output_name
            else:  # an input, a constant, a value used inside the graph or returned twice
                nodes.append(helper.make_node("Identity", [value], [output_name],
                                              name=f"/{output_name}/Identity"))
            graph_outputs.append(self.value_info(output_name, self.sample(value),
                                                 dim_names.get(output_name, {})))
        graph_inputs = [self.value_info(name, self.samples[name], dim_names.get(name, {}))
                        for name in self.inputs]
        graph = helper.make_graph(nodes, "everyo_model", graph_inputs, graph_outputs,
                                  initializer=self.initializers, doc_string=doc)
        opsets = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="everyo-onnx",
                                  producer_version=producer_version)
        # NOTE: the oldest IR version that carries this opset, so older runtimes load the file.
        model.ir_version = helper.find_min_ir_version_for(opsets)
        return model

    def value_info(self, name: str, sample: np.ndarray, dims: dict):
        shape = [dims.get(axis, size) for axis, size in enumerate(sample.shape)]
        return self._helper.make_tensor_value_info(name, ELEMENT_TYPE[onnx_dtype(sample.dtype)], shape)

    # -- internals ------------------------------------------------------------------------------
    def _dim(self, expr) -> str:
        """A 1-element int64 value computing a SymInt expression (cached per expression)."""
        if isinstance(expr, int):
            return self.constant([expr], "size", np.int64)
        if expr in self._dims:
            return self._dims[expr]
        if expr[0] == "dim":
            _, value, axis = expr
            out = self.node("Shape", [value], start=axis, end=axis + 1)
        else:
            operation, left, right = expr
            left, right = self._dim(left), self._dim(right)
            if operation == "floordiv":
                # Python's // floors, ONNX's integer Div truncates: (a - a mod b) / b is exact
                # either way (Mod with fmod=0 takes the divisor's sign, as Python's % does)
                left = self.node("Sub", [left, self.node("Mod", [left, right], fmod=0)])
            out = self.node(ONNX_ARITHMETIC[operation], [left, right])
        self._dims[expr] = out
        return out

    def _evaluate(self, name: str) -> np.ndarray:
        """Run the graph built so far in ``onnx.reference`` to get value ``name``'s sample."""
        helper = self._helper
        if not any(name in node.output for node in self.nodes):
            raise EveryOSerializationError(f"export_onnx: no value named {name!r} in the graph")
        graph = helper.make_graph(
            self.nodes, "partial",
            [self.value_info(n, self.samples[n], {}) for n in self.inputs],
            [helper.make_tensor_value_info(name, UNDEFINED_TYPE, None)],
            initializer=self.initializers)
        model = helper.make_model(graph, opset_imports=[helper.make_opsetid("", self.opset)])
        feeds = {n: self.samples[n].astype(onnx_dtype(self.samples[n].dtype)) for n in self.inputs}
        return np.asarray(reference_evaluator(model).run([name], feeds)[0])
