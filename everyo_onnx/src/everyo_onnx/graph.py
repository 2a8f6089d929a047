"""The ONNX graph being built during one export, and the API converters write it through.

A converter is ``converter(layer, ctx, input_name) -> output_name``: it reads the layer's
attributes, appends nodes and constants through ``ctx`` and returns the name of the value that
holds the layer's output. While converting, the context also runs every layer on a sample
batch (eval mode, no gradients), so a converter can ask for the concrete shape of its input
(``ctx.shape``) — for padding, say — without guessing.

This module imports ``onnx``; the exporter imports it only when a model is exported.
"""

from __future__ import annotations

import numpy as np
from onnx import TensorProto, helper, numpy_helper

from everyo import EveryOSerializationError, Tensor, no_grad, tensor

BATCH_DIM = "batch"


class ConversionRefused(EveryOSerializationError):
    """A converter declined a layer it cannot export faithfully (see ``GraphContext.refuse``)."""


def position_label(path: tuple[int, ...], layer) -> str:
    """How a layer is named in messages: ``[2] LSTM``, ``[1][0] GRU``, or the bare class name
    for the model itself."""
    name = type(layer).__name__
    return "".join(f"[{i}]" for i in path) + f" {name}" if path else name


class GraphContext:
    """Nodes, constants and value names of the graph under construction.

    Converters use ``opset``, :meth:`shape`, :meth:`node`, :meth:`constant`, :meth:`refuse`
    and, for containers, :meth:`convert`.
    """

    def __init__(self, converters: dict, opset: int, input_name: str, output_name: str,
                 sample: np.ndarray):
        self.converters = converters
        self.opset = opset
        self.input_name = input_name
        self.nodes: list = []
        self.initializers: list = []
        self.problems: list[str] = []  # refusals, collected so every one is reported at once
        self._samples: dict[str, np.ndarray] = {input_name: sample}
        self._taken: set[str] = {input_name, output_name}
        self._path: list[int] = []

    # -- what converters call -----------------------------------------------------------------
    def shape(self, name: str) -> tuple[int, ...]:
        """The concrete shape of value ``name`` on the sample batch.

        Axis 0 is the sample's batch size; it is symbolic in the exported graph, so never
        write it into an attribute or constant.
        """
        return tuple(self._samples[name].shape)

    def node(self, op_type: str, inputs, **attributes) -> str:
        """Append one ONNX node with a single output and return that output's name."""
        scope = self._scope()
        output = self._fresh(f"{scope}/{op_type}_output")
        self.nodes.append(helper.make_node(op_type, list(inputs), [output],
                                           name=self._fresh(f"{scope}/{op_type}"), **attributes))
        return output

    def constant(self, array, hint: str, dtype=np.float32) -> str:
        """Add ``array`` (cast to ``dtype``) as an initializer and return its name."""
        value = np.ascontiguousarray(np.asarray(array, dtype=dtype))
        name = self._fresh(f"{self._scope()}/{hint}")
        self.initializers.append(numpy_helper.from_array(value, name=name))
        return name

    def refuse(self, reason: str):
        """Decline the current layer: the export fails naming it and ``reason``."""
        raise ConversionRefused(reason)

    def convert(self, layer, input_name: str, position: int | None = None) -> str:
        """Convert ``layer`` (a child at ``position`` of the current container, if given)."""
        if position is not None:
            self._path.append(position)
        try:
            label = position_label(tuple(self._path), layer)
            converter = self.converters.get(type(layer))
            problems_before = len(self.problems)
            if converter is None:
                self.problems.append(f"{label}: no ONNX converter is registered for it")
                output = self._fresh(f"{self._scope()}/unconverted")
            else:
                output = self._call(converter, layer, input_name, label)
            if output not in self._samples:
                try:
                    self._samples[output] = self._run(layer, input_name, label)
                except EveryOSerializationError:
                    # NOTE: a refused layer may also be unable to run on the sample (BatchNorm
                    # without running statistics on a batch of one); its refusal says why.
                    if len(self.problems) > problems_before:
                        raise EveryOSerializationError(self.problems_message()) from None
                    raise
            return output
        finally:
            if position is not None:
                self._path.pop()

    # -- used by the exporter -------------------------------------------------------------------
    def problems_message(self) -> str:
        """The error message naming every refusal collected so far."""
        return "cannot export to ONNX: " + "; ".join(self.problems) + ". Nothing was written."

    def build_model(self, output: str, output_name: str, doc: str, producer_version: str):
        """The finished ``ModelProto`` whose graph output is ``output`` renamed ``output_name``."""
        producer = next((n for n in self.nodes if output in n.output), None)
        if producer is None:  # e.g. an empty Sequential: the output is the input itself
            self.nodes.append(helper.make_node("Identity", [output], [output_name],
                                               name=self._fresh("/Identity")))
        else:
            producer.output[list(producer.output).index(output)] = output_name
        sample_out = self._samples[output]
        if sample_out.ndim == 0:
            raise EveryOSerializationError("export_onnx: the model returns a scalar; an exported "
                                           "model must keep the batch axis first")
        graph = helper.make_graph(
            self.nodes, "everyo_model",
            [self._value_info(self.input_name, self._samples[self.input_name])],
            [self._value_info(output_name, sample_out)],
            initializer=self.initializers, doc_string=doc,
        )
        opsets = [helper.make_opsetid("", self.opset)]
        model = helper.make_model(graph, opset_imports=opsets, producer_name="everyo-onnx",
                                  producer_version=producer_version)
        # NOTE: the oldest IR version that carries this opset, so older runtimes load the file.
        model.ir_version = helper.find_min_ir_version_for(opsets)
        return model

    # -- internals ------------------------------------------------------------------------------
    def _call(self, converter, layer, input_name: str, label: str) -> str:
        try:
            output = converter(layer, self, input_name)
        except ConversionRefused as refusal:
            self.problems.append(f"{label}: {refusal}")
            return self._fresh(f"{self._scope()}/refused")
        except EveryOSerializationError:
            raise
        except Exception as exc:
            raise EveryOSerializationError(
                f"export_onnx: the ONNX converter for {label} failed: {exc!r}") from exc
        if not isinstance(output, str):
            raise EveryOSerializationError(f"export_onnx: the ONNX converter for {label} must "
                                           f"return the output's name, got {output!r}")
        return output

    def _run(self, layer, input_name: str, label: str) -> np.ndarray:
        sample = self._samples[input_name]
        try:
            with no_grad():
                result = layer(tensor(sample))
        except Exception as exc:
            raise EveryOSerializationError(
                f"export_onnx: {label} cannot run on an input of shape {sample.shape} "
                f"(check input_shape): {exc}") from exc
        if not isinstance(result, Tensor):
            raise EveryOSerializationError(f"export_onnx: {label} returned a "
                                           f"{type(result).__name__}, not one Tensor")
        return np.asarray(result.data)

    def _scope(self) -> str:
        return "/" + "/".join(str(i) for i in self._path) if self._path else ""

    def _fresh(self, base: str) -> str:
        name, counter = base, 1
        while name in self._taken:
            name, counter = f"{base}_{counter}", counter + 1
        self._taken.add(name)
        return name

    @staticmethod
    def _value_info(name: str, sample: np.ndarray):
        return helper.make_tensor_value_info(name, TensorProto.FLOAT,
                                             [BATCH_DIM, *sample.shape[1:]])
