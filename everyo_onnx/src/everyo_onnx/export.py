"""``eo.export_onnx``: walk a model layer by layer, emit ONNX, check it, write it atomically.

The order matters for the guarantees in docs/onnx.md: every unsupported layer is found before
any conversion; the model is converted, checked (``onnx.checker`` with ``full_check``) and, on
request, verified in ONNX Runtime entirely in memory; only then is the file written, through a
temporary file in the same directory and one ``os.replace``. A failed export therefore never
leaves a file behind nor touches an existing one.
"""

from __future__ import annotations

import contextlib
import os
import tempfile

import numpy as np

from everyo import EveryOError, EveryOSerializationError, Module, no_grad, registry, tensor
from everyo_onnx.converters.dense import convert_sequential
from everyo_onnx.runtime import import_onnx, inference_session, run_session

# NOTE: 17 is the first opset with LayerNormalization and is run by every maintained runtime
# (ONNX Runtime >= 1.13, TensorRT, OpenVINO); GELU uses the native op from opset 20 on.
DEFAULT_OPSET = 17
MIN_OPSET = 17

REFUSED_BY_DESIGN = ("RNN", "LSTM", "GRU", "Embedding", "MultiHeadAttention",
                     "PositionalEncoding", "TransformerEncoderLayer", "TransformerDecoderLayer",
                     "TransformerEncoder")

# Parity bound of verify=True: float32 rounding from a different order of operations.
VERIFY_RTOL = 1e-4
VERIFY_ATOL = 1e-5


def export_onnx(model, path, input_shape, input_name: str = "input", output_name: str = "output",
                opset: int | None = None, verify: bool = False) -> None:
    """Export ``model`` to an ONNX file whose batch dimension is symbolic.

    Args:
        model: a Module whose layers (Sequential containers walked recursively) all have a
            registered ONNX converter.
        path: where the ``.onnx`` file goes; written atomically, its directory must exist.
        input_shape: the input's shape, batch first (e.g. ``(1, 8, 8, 1)``, NHWC); the batch
            size is not baked in: the graph accepts any.
        input_name, output_name: names of the graph's input and output.
        opset: ONNX opset version, at least 17; None picks ``DEFAULT_OPSET`` (17).
        verify: run the file in ONNX Runtime on a random batch of another batch size and raise
            if it disagrees with the model beyond float32 rounding (needs onnxruntime).

    Raises:
        EveryOSerializationError: unsupported layers (every one is named, with its position),
            a refused configuration (e.g. BatchNorm without running statistics), a failed check
            or verification. Nothing is written in that case.

    Example:
        >>> import everyo as eo, numpy as np, tempfile, os
        >>> model = eo.Sequential(eo.Linear(4, 3, seed=0), eo.ReLU())
        >>> path = os.path.join(tempfile.mkdtemp(), "mlp.onnx")
        >>> eo.export_onnx(model, path, input_shape=(1, 4), verify=True)
        >>> eo.run_onnx(path, np.ones((5, 4))).shape
        (5, 3)
    """
    onnx = import_onnx()
    if not isinstance(model, Module):
        raise EveryOSerializationError(f"export_onnx: model must be an everyo Module, got "
                                       f"{type(model).__name__}")
    opset = check_opset(opset, onnx.defs.onnx_opset_version())
    input_shape = check_input_shape(input_shape)
    check_names(input_name, output_name)
    converters = registry("onnx_converters").items
    unsupported = find_unsupported(model, converters)
    if unsupported:
        raise EveryOSerializationError(refusal_message(unsupported))

    from everyo_onnx.graph import GraphContext  # imports onnx: only now that we export

    with eval_mode(model):
        sample = np.random.default_rng(0).standard_normal(input_shape).astype(np.float32)
        ctx = GraphContext(converters, opset, input_name, output_name, sample)
        output = ctx.convert(model, input_name)
        if ctx.problems:
            raise EveryOSerializationError(ctx.problems_message())
        proto = ctx.build_model(output, output_name, doc=f"everyo {type(model).__name__}",
                                producer_version=_version())
        try:
            onnx.checker.check_model(proto, full_check=True)
        except onnx.checker.ValidationError as exc:
            raise EveryOSerializationError(
                f"export_onnx: the generated graph fails onnx.checker: {exc}") from exc
        data = proto.SerializeToString()
        if verify:
            verify_export(model, data, input_shape)
    write_atomically(path, data)


def find_unsupported(model, converters: dict, path: tuple[int, ...] = ()) -> list[str]:
    """Position labels (``[2] LSTM``) of every layer without a converter, Sequentials walked.

    Lookup is by exact class: a subclass may compute something else (``LogSoftmax`` subclasses
    ``Softmax``), so it needs its own registration.
    """
    from everyo_onnx.graph import position_label

    converter = converters.get(type(model))
    if converter is convert_sequential:
        found = []
        for index, child in enumerate(model):
            found += find_unsupported(child, converters, path + (index,))
        return found
    if converter is None:
        return [position_label(path, model) + _subclass_note(model, converters)]
    return []


def _subclass_note(layer, converters: dict) -> str:
    base = next((cls for cls in type(layer).__mro__[1:] if cls in converters), None)
    return f" (a subclass of {base.__name__}; register a converter for it)" if base else ""


def refusal_message(labels: list[str]) -> str:
    noun = "layer has" if len(labels) == 1 else f"{len(labels)} layers have"
    return (f"cannot export to ONNX: {noun} no converter: {', '.join(labels)}. The layer-by-layer "
            f"exporter refuses {', '.join(REFUSED_BY_DESIGN)} (they need a tracing exporter); "
            f"a custom layer can get a converter through the everyo_register_onnx_converters "
            f"hook. Nothing was written.")


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


def verify_export(model: Module, data: bytes, input_shape: tuple[int, ...]) -> float:
    """Run the serialized model in ONNX Runtime on a batch of a different size and compare.

    Returns:
        The maximum absolute difference; raises ``EveryOSerializationError`` beyond the bound.
    """
    batch_size = input_shape[0] + 2
    batch = np.random.default_rng(1).standard_normal(
        (batch_size, *input_shape[1:])).astype(np.float32)
    with no_grad():
        expected = np.asarray(model(tensor(batch)).data)
    try:
        actual = run_session(inference_session(data), batch)
    except EveryOError:
        raise
    except Exception as exc:  # onnxruntime raises its own exception types
        raise EveryOSerializationError(
            f"export_onnx(verify=True): ONNX Runtime could not run the exported model: "
            f"{type(exc).__name__}: {exc}. Nothing was written.") from exc
    if actual.shape != expected.shape:
        raise EveryOSerializationError(
            f"export_onnx(verify=True): ONNX Runtime returned shape {actual.shape} for a batch of "
            f"{batch_size}, the model {expected.shape}. Nothing was written.")
    difference = float(np.abs(actual.astype(np.float64) - expected).max()) if actual.size else 0.0
    scale = max(1.0, float(np.abs(expected).max())) if expected.size else 1.0
    if not np.allclose(actual, expected, rtol=VERIFY_RTOL, atol=VERIFY_ATOL * scale):
        raise EveryOSerializationError(
            f"export_onnx(verify=True): ONNX Runtime disagrees with the model on a batch of "
            f"{batch_size} (max abs difference {difference:.3g}, allowed rtol={VERIFY_RTOL}, "
            f"atol={VERIFY_ATOL * scale:.3g}). Nothing was written.")
    return difference


def write_atomically(path, data: bytes) -> None:
    """Write ``data`` to a temporary file beside ``path`` and rename it over ``path``."""
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise EveryOSerializationError(f"export_onnx: directory {directory!r} does not exist")
    fd, temporary = tempfile.mkstemp(dir=directory, prefix=f".{os.path.basename(path)}.",
                                     suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as handle:
            handle.write(data)
            handle.flush()
            os.fsync(handle.fileno())
        os.chmod(temporary, 0o644)  # mkstemp creates 0600; an exported model is meant to be read
        os.replace(temporary, path)
    except BaseException:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise


def check_opset(opset, newest: int) -> int:
    if opset is None:
        return DEFAULT_OPSET
    if isinstance(opset, bool) or not isinstance(opset, (int, np.integer)) \
            or not MIN_OPSET <= opset <= newest:
        raise EveryOSerializationError(f"export_onnx: opset must be an int from {MIN_OPSET} to "
                                       f"{newest} (the installed onnx's newest), got {opset!r}")
    return int(opset)


def check_input_shape(input_shape) -> tuple[int, ...]:
    try:
        shape = tuple(int(d) for d in input_shape)
        valid = (not isinstance(input_shape, (str, bytes)) and len(shape) >= 1
                 and all(d > 0 for d in shape)
                 and all(not isinstance(d, bool) and float(d) == int(d) for d in input_shape))
    except (TypeError, ValueError):
        valid = False
    if not valid:
        raise EveryOSerializationError(f"export_onnx: input_shape must be a tuple of positive "
                                       f"ints, batch first, got {input_shape!r}")
    return shape


def check_names(input_name, output_name) -> None:
    for what, name in (("input_name", input_name), ("output_name", output_name)):
        if not isinstance(name, str) or not name:
            raise EveryOSerializationError(f"export_onnx: {what} must be a non-empty str, "
                                           f"got {name!r}")
    if input_name == output_name:
        raise EveryOSerializationError(f"export_onnx: input_name and output_name are both "
                                       f"{input_name!r}; they must differ")


def _version() -> str:
    from importlib import metadata

    try:
        return metadata.version("everyo-onnx")
    except metadata.PackageNotFoundError:
        return "0"
