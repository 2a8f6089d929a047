"""Trace one forward pass of a model into an ONNX graph.

The tracer is a dispatch interceptor plus a wrapper around every sub-module's ``forward``:

* a module whose class has a *layer converter* is run as usual (untraced) and emitted whole by
  its converter;
* a module refused by name (see ``everyo_onnx.refusals``) is recorded as a refusal;
* any other module is entered: its forward runs, and every op it dispatches is emitted by the
  *op converter* registered for that op's class. An op without one is recorded as a refusal
  naming the module it ran in (or, when the op defines ``composite``, decomposed into the ops
  its composite uses).

Refusals are collected, not raised, so one export names every one of them. Every dispatched op
and every converted module is an *event*; the exporter traces the same model at two input sizes
and compares the events' output shapes to learn which axes follow the input's size.
"""

from __future__ import annotations

import contextlib
import functools

import numpy as np

from everyo import EveryOSerializationError, Module, Op, Tensor
from everyo.dispatch import OPS, intercepting
from everyo.kernels import as_tensors
from everyo_onnx.constant_views import slice_of_base
from everyo_onnx.graph import ConversionRefused, GraphContext, onnx_dtype
from everyo_onnx.refusals import module_label, refusal_reason, untraced_output
from everyo_onnx.symbolic import SymInt
from everyo_onnx.traced_tensor import active_tracer, tracing


class TraceAborted(Exception):
    """A refused module could not even run on the sample; the trace stops with what it has."""


class Tracer:
    """One trace: the graph context, the value names of traced tensors and the refusals.

    Args:
        model: the Module being exported.
        converters: the ``onnx_converters`` registry (layer classes and op classes as keys).
        opset: the ONNX opset to write.
        reference: the same model traced at other input sizes; when given, axes whose size
            differs between the two are symbolic (``SymInt`` shapes, computed sizes).
    """

    def __init__(self, model: Module, converters: dict, opset: int, reference=None):
        self.model = model
        self.layer_converters = {k: v for k, v in converters.items() if not issubclass(k, Op)}
        self.op_converters = {k: v for k, v in converters.items() if issubclass(k, Op)}
        self.ctx = GraphContext(opset, self)
        self.reference = reference
        self.event_shapes: list[tuple] = []
        self.event_operand_shapes: list[list] = []
        self.event_labels: list[str] = []
        self.output_names: list[str] = []
        self.problems: list[str] = []
        self.paths = {id(m): p for p, m in reversed(list(model.named_modules()))}
        self.parameter_names = {id(p): n for n, p in model.named_parameters()}
        self._names: dict[int, str] = {}
        self._alive: list = []  # traced tensors stay alive so that their ids stay unique
        self._constants: dict[int, str] = {}
        self._path: list[str] = []
        self._suspended = 0
        self._converting = 0  # inside a converter: its own size arithmetic is no decision

    # -- entry point -----------------------------------------------------------------------------
    def run(self, inputs: list[tuple[str, np.ndarray, frozenset]]):
        """Trace ``model(*inputs)``; returns the forward's outputs (a list of Tensors)."""
        tensors = []
        for name, sample, dynamic in inputs:
            tensor = Tensor(sample)
            self.ctx.add_input(name, sample, dynamic)
            self._bind(tensor, name)
            tensors.append(tensor)
        with tracing(self), self._wrapped_modules(), intercepting(self._on_op):
            try:
                outputs = self.model(*tensors)
            except TraceAborted:
                return None
        outputs = list(outputs) if isinstance(outputs, (tuple, list)) else [outputs]
        for position, output in enumerate(outputs):
            if not isinstance(output, Tensor) or id(output) not in self._names:
                raise EveryOSerializationError(untraced_output(position, output,
                                                               self.parameter_names))
        return outputs

    def name_of(self, tensor) -> str:
        return self._names[id(tensor)]

    def scope(self) -> str:
        return "/" + self._path[-1] if self._path and self._path[-1] else ""

    # -- ops ---------------------------------------------------------------------------------------
    def _on_op(self, name: str, operands: tuple, attrs: dict, proceed):
        if self._suspended:
            return proceed(operands, attrs)
        op_class = OPS.get(name)
        converter = self.op_converters.get(op_class)
        if getattr(op_class, "in_place", False):
            return self._on_in_place(op_class, name, converter, operands, attrs, proceed)
        if converter is None and getattr(op_class, "composite", None) is not None:
            return self._decompose(op_class, name, operands, attrs)
        with self._suspend():
            result = proceed(operands, attrs)
        return self._convert(name, converter, operands, attrs, result)

    def _convert(self, name: str, converter, operands: tuple, attrs: dict, result):
        """Emit the op that computed ``result`` through its converter (or refuse it)."""
        tensors = as_tensors(operands)
        dynamic = self._event(name, result, [t.data.shape for t in tensors])
        if converter is None:
            self._refuse(f"{self._label()}: op {name!r} has no ONNX converter")
            return self._bind(result, self.ctx.fresh(f"{self.scope()}/{name}_unconverted"), dynamic)
        inputs = [self._operand(position, o, t, operands, tensors)
                  for position, (o, t) in enumerate(zip(operands, tensors))]
        self.ctx.result, self.ctx.result_dynamic = result.data, dynamic
        try:
            with self._in_converter(1):
                output = converter(self.ctx, *inputs, **attrs)
        except ConversionRefused as refusal:
            self._refuse(f"{self._label()}: op {name!r}: {refusal}")
            output = self.ctx.fresh(f"{self.scope()}/{name}_refused")
        except EveryOSerializationError:
            raise
        except Exception as exc:
            raise EveryOSerializationError(f"export_onnx: the ONNX converter of op {name!r} "
                                           f"failed in {self._label()}: {exc!r}") from exc
        return self._bind(result, output, dynamic)

    def _on_in_place(self, op_class, name: str, converter, operands: tuple, attrs: dict,
                     proceed):
        """An in-place write (``h.add_(1)``, ``t[i] = v``): exported as the op whose output
        replaces the written tensor's value, or refused naming the method and module."""
        target, traced = operands[0], self._traced_among(operands[1:], attrs)
        if id(target) not in self._names:
            with self._suspend():
                result = proceed(operands, attrs)
            if traced or self._aliases_traced(target):
                self._refuse(f"{self._label()}: {op_class.method} writes into a tensor the trace "
                             f"does not follow (a parameter, buffer, constant or detached "
                             f"view) a value computed from the inputs, or into the storage "
                             f"of a traced tensor; compute a new tensor instead")
            self._forget_constants(target)
            return result
        reason = self._in_place_refusal(target, converter)
        if reason is not None:
            with self._suspend():
                result = proceed(operands, attrs)
            self._refuse(f"{self._label()}: {op_class.method} on a traced tensor is not "
                         f"exported ({reason}); write it out of place (t = t + x, eo.where, "
                         f"eo.concatenate)")
            return self._bind(result, self.ctx.fresh(f"{self.scope()}/{name}_refused"))
        old = self._names[id(target)]
        self.ctx.samples[old] = target.data.copy()  # the value before the write
        with self._suspend():
            result = proceed(operands, attrs)
        return self._convert(name, converter, operands, attrs, result)

    def _traced_among(self, operands, attrs: dict) -> bool:
        index = attrs.get("index")
        keys = index if isinstance(index, tuple) else (index,)
        return any(id(o) in self._names for o in (*operands, *keys))

    def _in_place_refusal(self, target: Tensor, converter) -> str | None:
        """Why a write into the traced ``target`` cannot be exported, or None."""
        if converter is None:
            return "ONNX has no in-place write; this method has no converter"
        if self._aliases_traced(target):
            return ("it shares its storage with another traced tensor (a view: reshape, "
                    "transpose, slicing), which the write would change too")
        return None

    def _aliases_traced(self, target: Tensor) -> bool:
        return any(tensor is not target and id(tensor) in self._names
                   and np.may_share_memory(tensor.data, target.data) for tensor in self._alive)

    def _forget_constants(self, written: Tensor) -> None:
        """A tensor the trace treats as a constant was written: the constants already made
        from it (or from a view of its storage) hold the old values."""
        for tensor in self._alive:
            if id(tensor) in self._constants and np.may_share_memory(tensor.data, written.data):
                del self._constants[id(tensor)]

    def _decompose(self, op_class, name, operands, attrs):
        """Trace the op's ``composite`` (its forward written with other ops) instead."""
        tensors = as_tensors(operands)
        op = object.__new__(op_class)
        op.needs_input_grad = tuple(False for _ in tensors)
        op.saved, op.parents = None, tensors
        with self._suspend():
            op.forward(*[t.data for t in tensors], **attrs)  # composite may read what it stored
        return op.composite(*tensors)

    def _operand(self, position: int, operand, tensor: Tensor, operands, tensors) -> str:
        """An op's operand; a NumPy slice of a larger array whose size follows the input
        (``self.mask[:t, :t]``) becomes a Slice of the whole array with a computed end."""
        axes = self._operand_dynamic(position)
        view = slice_of_base(operand) if axes and isinstance(operand, np.ndarray) else None
        if view is None:
            return self._value(operand, tensor)
        base, starts, steps = view
        ends = []
        for axis, (start, size, step) in enumerate(zip(starts, operand.shape, steps)):
            source = self._same_size_axis(position, axis, operands) if axis in axes else None
            if axis in axes and (source is None or step != 1):
                return self._value(operand, tensor)  # baked in; the graph comparison tells
            ends.append(start + source if source is not None else start + size * step)
        whole = self._value(base, as_tensors((base,))[0])
        ctx = self.ctx
        return ctx.node("Slice", [whole, ctx.ints(starts, "starts"), ctx.ints(ends, "ends"),
                                  ctx.ints(range(len(starts)), "axes"), ctx.ints(steps, "steps")])

    def _operand_dynamic(self, position: int) -> frozenset:
        """Axes of the current event's operand whose size differs in the reference trace."""
        if self.reference is None:
            return frozenset()
        index = len(self.event_operand_shapes) - 1
        try:
            mine = self.event_operand_shapes[index][position]
            other = self.reference.event_operand_shapes[index][position]
        except IndexError:  # the traces differ; the graph comparison will say where
            return frozenset()
        return frozenset(a for a, (n, m) in enumerate(zip(mine, other)) if n != m)

    def _same_size_axis(self, position: int, axis: int, operands):
        """A ``SymInt`` read from a traced operand's axis that has the size of ``axis`` of
        operand ``position`` in both traces, or None."""
        index = len(self.event_operand_shapes) - 1
        mine, other = self.event_operand_shapes[index], self.reference.event_operand_shapes[index]
        wanted = (mine[position][axis], other[position][axis])
        for k, operand in enumerate(operands):
            name = self._names.get(id(operand))
            if name is None or k == position:
                continue
            for a in sorted(self.ctx.dynamic_axes(name)):
                if (mine[k][a], other[k][a]) == wanted:
                    return SymInt(mine[k][a], ("dim", name, a))
        return None

    def value_of(self, obj) -> str:
        """``ctx.value``: the name of a traced tensor, or a constant made from ``obj``."""
        return self._value(obj, obj if isinstance(obj, Tensor) else as_tensors((obj,))[0])

    def _value(self, operand, tensor: Tensor) -> str:
        """The graph name of an operand: a traced value, or a constant made from it."""
        key = id(operand)
        if key in self._names:
            return self._names[key]
        if key in self._constants:
            return self._constants[key]
        array = tensor.data
        hint = self.parameter_names.get(key, "constant")
        name = self.ctx.constant(array, hint, onnx_dtype(array.dtype))
        if isinstance(operand, Tensor):
            self._constants[key] = name
            self._alive.append(operand)
        return name

    # -- modules -----------------------------------------------------------------------------------
    @contextlib.contextmanager
    def _wrapped_modules(self):
        """Route every sub-module's forward through :meth:`_call_module` for the trace."""
        wrapped = []
        for module in {id(m): m for m in self.model.modules()}.values():
            own = module.__dict__.get("forward")
            original = own if own is not None else functools.partial(type(module).forward, module)
            object.__setattr__(module, "forward", functools.partial(
                self._call_module, module, original))
            wrapped.append((module, own))
        try:
            yield
        finally:
            for module, own in wrapped:
                if own is None:
                    del module.__dict__["forward"]
                else:
                    object.__setattr__(module, "forward", own)

    def _call_module(self, module, original, *args, **kwargs):
        if self._suspended or active_tracer.get() is not self:
            return original(*args, **kwargs)
        path = self.paths.get(id(module), self._child_path(module))
        if refusal_reason(module) is not None:
            return self._refused_module(module, path, original, args, kwargs)
        converter = self.layer_converters.get(type(module))
        if converter is not None and len(args) == 1 and not kwargs \
                and isinstance(args[0], Tensor):
            return self._emit_whole(module, path, converter, original, args[0])
        self._path.append(path)  # enter: its ops are emitted one by one
        try:
            return original(*args, **kwargs)
        finally:
            self._path.pop()

    def _refused_module(self, module, path: str, original, args, kwargs):
        """Record the refusal; run the module untraced so the trace can go on and find the
        other refusals (or stop, when it cannot even run on the sample)."""
        self._refuse(module_label(path, module))
        try:
            with self._suspend():
                result = original(*args, **kwargs)
        except Exception as exc:
            raise TraceAborted from exc
        return self._bind_all(result, f"{path}/refused", type(module).__name__)

    def _emit_whole(self, module, path: str, converter, original, x: Tensor):
        """Run the layer untraced for its output on the sample; its converter emits it."""
        label = module_label(path, module)
        failure = None
        try:
            with self._suspend():
                result = original(x)
        except Exception as exc:  # a refused configuration may not run either: ask first
            result, failure = None, exc
        self._path.append(path)
        try:
            with self._in_converter(1):
                output = converter(module, self.ctx, self._value(x, x))
        except ConversionRefused as refusal:
            self._refuse(f"{label}: {refusal}")
            if failure is not None:
                raise TraceAborted from None
            output = self.ctx.fresh(f"{self.scope()}/refused")
        except EveryOSerializationError:
            raise
        except Exception as exc:
            raise EveryOSerializationError(
                f"export_onnx: the ONNX converter for {label} failed: {exc!r}") from exc
        finally:
            self._path.pop()
        if failure is not None:
            raise EveryOSerializationError(f"export_onnx: {label} cannot run on an input of "
                                           f"shape {x.data.shape}: {failure}") from failure
        if not isinstance(output, str):
            raise EveryOSerializationError(f"export_onnx: the ONNX converter for {label} must "
                                           f"return the output's name, got {output!r}")
        if not isinstance(result, Tensor):
            raise EveryOSerializationError(f"export_onnx: {label} returned a "
                                           f"{type(result).__name__}, not one Tensor")
        return self._bind(result, output, self._event(type(module).__name__, result))

    def convert_child(self, layer, input_name: str, position=None):
        """``ctx.convert``: apply ``layer`` to the value ``input_name`` inside the trace."""
        tensor = Tensor(self.ctx.sample(input_name))
        self._bind(tensor, input_name, self.ctx.dynamic_axes(input_name))
        if id(layer) not in self.paths:
            base = self._path[-1] if self._path else ""
            step = str(position) if position is not None else type(layer).__name__
            self.paths[id(layer)] = f"{base}.{step}" if base else step
        with self._in_converter(-self._converting):  # (the layer's forward is model code)
            output = layer(tensor) if "forward" in layer.__dict__ else self._call_module(
                layer, functools.partial(type(layer).forward, layer), tensor)
        return self.name_of(output)

    def _child_path(self, module) -> str:
        base = self._path[-1] if self._path else ""
        return f"{base}.{type(module).__name__}" if base else type(module).__name__

    # -- bookkeeping -------------------------------------------------------------------------------
    def _event(self, what: str, result, operand_shapes=()) -> frozenset:
        """Record an event's output (and operand) shapes; returns the output's axes whose
        size differs in the reference trace."""
        shape = tuple(result.data.shape) if isinstance(result, Tensor) else ()
        index = len(self.event_shapes)
        self.event_shapes.append(shape)
        self.event_operand_shapes.append(list(operand_shapes))
        self.event_labels.append(f"{self._label()}: {what}")
        if self.reference is None or index >= len(self.reference.event_shapes):
            return frozenset()
        other = self.reference.event_shapes[index]
        if len(other) != len(shape):
            return frozenset()
        return frozenset(axis for axis, (a, b) in enumerate(zip(shape, other)) if a != b)

    def _bind(self, tensor: Tensor, name: str, dynamic: frozenset = frozenset()) -> Tensor:
        self._names[id(tensor)] = name
        self._alive.append(tensor)
        self.ctx.samples.setdefault(name, tensor.data)
        self.ctx.dynamic.setdefault(name, dynamic)
        return tensor

    def _bind_all(self, result, base: str, what: str):
        for tensor in result if isinstance(result, (tuple, list)) else [result]:
            if isinstance(tensor, Tensor):
                self._bind(tensor, self.ctx.fresh(base), self._event(what, tensor))
        return result

    def _refuse(self, message: str) -> None:
        if message not in self.problems:
            self.problems.append(message)

    def _label(self) -> str:
        return self._path[-1] if self._path and self._path[-1] else \
            f"{type(self.model).__name__} (the model's own forward)"

    @contextlib.contextmanager
    def _suspend(self):
        self._suspended += 1
        try:
            yield
        finally:
            self._suspended -= 1

    @contextlib.contextmanager
    def _in_converter(self, step: int):
        self._converting += step
        try:
            yield
        finally:
            self._converting -= step

    def refuse_decision(self, comparison: str) -> None:
        """Model code compared (or ``bool()``-ed) a size that follows the input's size."""
        if self._suspended or self._converting:
            return
        self._refuse(f"{self._label()}: `{comparison}` decides in Python on a size that "
                     f"follows the input's size; the graph would keep the answer for the "
                     f"traced size. Compute it with tensor ops, or give the axis a fixed size")

    def symbolic_shape(self, tensor: Tensor):
        """``tensor.shape`` with a ``SymInt`` for every axis that follows the input's size."""
        shape = tensor.data.shape
        if self._suspended or self.reference is None:
            return shape
        name = self._names.get(id(tensor))
        dynamic = self.ctx.dynamic.get(name) if name is not None else None
        if not dynamic:
            return shape
        return tuple(SymInt(size, ("dim", name, axis)) if axis in dynamic else size
                     for axis, size in enumerate(shape))
