"""``eo.export_onnx``: trace a model's forward pass into ONNX, check it, write it atomically.

The order matters for the guarantees in docs/onnx.md. The model is traced four times (see
``everyo_onnx.trace``): at the given input sizes, then at other sizes (every symbolic axis
changed, other random values), to learn which axes follow the input's size; then twice more,
with those axes symbolic, and the two graphs must be identical — a graph that changes with
the input's size or values comes from Python control flow or constants the tracer cannot
follow, and is refused. Every refusal is collected before anything is written. The graph is
checked (``onnx.checker`` with ``full_check``, strict shape inference) and, on request,
verified in ONNX Runtime and ``onnx.reference`` entirely in memory; only then is the file
written, through the core's atomic writer (``everyo.atomic_files``, as ``eo.save``). A failed
export therefore never leaves a file behind nor touches an existing one.
"""

from __future__ import annotations

import contextlib
import threading
from importlib import metadata

from everyo import EveryOSerializationError, Module, no_grad, registry
from everyo.atomic_files import write_atomically as write_file_atomically
from everyo_onnx.arguments import (
    check_inputs_fit,
    check_opset,
    input_specs,
    names_for,
    output_axes,
)
from everyo_onnx.refusals import refusal_reason
from everyo_onnx.runtime import import_onnx
from everyo_onnx.trace_passes import trace_model
from everyo_onnx.verify import verification_batches, verify_export

# NOTE: 17 is the first opset with LayerNormalization and is run by every maintained runtime
# (ONNX Runtime >= 1.13, TensorRT, OpenVINO); GELU uses the native op from opset 20 on.
DEFAULT_OPSET = 17
MIN_OPSET = 17

# One export at a time per process: a trace swaps every sub-module's ``forward`` and the
# model's train/eval modes, so two threads exporting one model would trace each other's
# wrappers (spurious refusals) and leave a wrapper behind.
_exporting = threading.RLock()


def export_onnx(model, path, input_shape, input_name: str = "input", output_name: str = "output",
                opset: int | None = None, verify: bool = False, *, input_names=None,
                output_names=None, dynamic_axes=None, verify_inputs=None) -> None:
    """Export ``model`` to an ONNX file by tracing its forward pass; the batch axis (and any
    axis named in ``dynamic_axes``) is symbolic.

    Layers with a registered layer converter (Conv2D, BatchNorm, LayerNorm, ...) are emitted
    whole; any other Module is entered and the ops its forward dispatches are emitted by the
    op converters registered for them.

    Args:
        model: the Module to export; its forward takes one tensor per input and returns a
            tensor or a tuple/list of tensors.
        path: where the ``.onnx`` file goes; written atomically, its directory must exist.
        input_shape: the input's shape, batch first (e.g. ``(1, 8, 8, 1)``, NHWC), or a list of
            shapes, one per input. The sizes of symbolic axes are not baked in.
        input_name, output_name: names of the graph's only input and output.
        opset: ONNX opset version, at least 17; None picks ``DEFAULT_OPSET`` (17).
        verify: run the file in ONNX Runtime and ``onnx.reference`` on random inputs of other
            sizes and raise if either disagrees with the model.
        input_names, output_names: names for several inputs/outputs (default ``input_0``...,
            ``output_0``...).
        dynamic_axes: ``{input_name: {axis: dim_name}}`` for symbolic axes beyond the batch,
            e.g. ``{"tokens": {1: "sequence"}}``; an output's entry names its symbolic axes
            (otherwise they take the name of the input axis they follow).
        verify_inputs: verify on these batches instead of random ones (and verify even with
            ``verify=False``): one batch or a list of them, a batch being an array or Tensor
            (one input) or a tuple with one per input. Symbolic axes take any size.

    Raises:
        EveryOSerializationError: refused modules and ops (every one, with its module path),
            a graph that depends on the input's values or size, a failed check or
            verification. Nothing is written in that case.

    Example:
        >>> import everyo as eo, numpy as np, tempfile, os
        >>> model = eo.Sequential(eo.Linear(4, 3, seed=0), eo.ReLU())
        >>> path = os.path.join(tempfile.mkdtemp(), "mlp.onnx")
        >>> eo.export_onnx(model, path, input_shape=(1, 4), verify=True)
        >>> eo.run_onnx(path, np.ones((5, 4))).shape
        (5, 3)
    """
    onnx = import_onnx()
    opset, specs, batches = _checked_arguments(onnx, model, opset, input_shape, input_name,
                                               input_names, dynamic_axes, verify_inputs)
    converters = registry("onnx_converters").items
    with _exporting, eval_mode(model), no_grad():
        traced = trace_model(model, converters, opset, specs)
        names = _output_names(traced.outputs, output_name, output_names,
                              [s.name for s in specs])
        dims = traced.dimension_names(specs, names, output_axes(
            dynamic_axes, [s.name for s in specs], names))
        proto = traced.ctx.build_model(list(zip(traced.outputs, names)), dims,
                                       doc=f"everyo {type(model).__name__}",
                                       producer_version=_version())
        check_graph(onnx, proto)
        data = proto.SerializeToString()
        if verify or batches is not None:
            verify_export(model, data, specs, batches)
    write_atomically(path, data)


def _checked_arguments(onnx, model, opset, input_shape, input_name, input_names, dynamic_axes,
                       verify_inputs) -> tuple:
    """``(opset, input specs, the user's verification batches or None)``, every argument
    checked before anything is traced."""
    if not isinstance(model, Module):
        raise EveryOSerializationError(f"export_onnx: model must be an everyo Module, got "
                                       f"{type(model).__name__}")
    opset = check_opset(opset, DEFAULT_OPSET, MIN_OPSET, onnx.defs.onnx_opset_version())
    specs = input_specs(input_shape, input_name, input_names, dynamic_axes)
    if refusal_reason(model) is None:  # (a model refused by design is named as that)
        check_inputs_fit(model, specs)
    batches = None if verify_inputs is None else verification_batches(specs, verify_inputs)
    return opset, specs, batches


def _output_names(outputs: list[str], output_name: str, output_names, input_names) -> list[str]:
    names = names_for(output_names, output_name, len(outputs), "output_names",
                      "outputs the model returns")
    clash = sorted(set(names) & set(input_names))
    if clash:
        raise EveryOSerializationError(f"export_onnx: {clash} name both an input and an "
                                       f"output; they must differ")
    return names


def check_graph(onnx, proto) -> None:
    """``onnx.checker`` (full check) and strict shape inference, or an error naming why."""
    try:
        onnx.checker.check_model(proto, full_check=True)
        onnx.shape_inference.infer_shapes(proto, check_type=True, strict_mode=True)
    except (onnx.checker.ValidationError, onnx.shape_inference.InferenceError) as exc:
        raise EveryOSerializationError(
            f"export_onnx: the generated graph fails onnx.checker: {exc}") from exc


@contextlib.contextmanager
def eval_mode(model: Module):
    """Put every sub-module in eval mode, then restore each one's own mode."""
    modes = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        yield
    finally:
        for module, training in modes:
            object.__setattr__(module, "training", training)


def write_atomically(path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``."""
    try:
        # NOTE: the core's writer, as eo.save's: 0o666 & ~umask, the next write sweeps what a
        # killed export left behind, and an empty path, a directory or a missing directory
        # are refused by name before anything is written
        write_file_atomically(path, lambda handle: handle.write(data), caller="export_onnx")
    except EveryOSerializationError:
        raise
    except OSError as exc:  # unwritable directory, full disk, ...: name the file
        raise EveryOSerializationError(f"export_onnx: cannot write {path!r}: {exc}") from exc


def _version() -> str:
    try:
        return metadata.version("everyo-onnx")
    except metadata.PackageNotFoundError:
        return "0"
