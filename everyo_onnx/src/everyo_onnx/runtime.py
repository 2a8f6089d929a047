"""Optional dependencies of the exporter, imported lazily, and ``eo.run_onnx``.

``import everyo`` must stay fast, so neither ``onnx`` nor ``onnxruntime`` is imported until a
model is exported or run; a missing one raises with the command that installs it.
"""

from __future__ import annotations

import functools
import importlib
import importlib.util
import os
import sys

import numpy as np

from everyo import EveryOError, Tensor

ONNX_HINT = "pip install everyo-onnx   (or: pip install onnx)"
RUNTIME_HINT = "pip install 'everyo-onnx[runtime]'   (or: pip install onnxruntime)"


class MissingOnnxPackageError(EveryOError, ImportError):
    """``onnx`` or ``onnxruntime`` is needed but not importable; the message says how to get it."""


def _is_importable(module: str) -> bool:
    if module in sys.modules:  # covers a module set to None to simulate its absence
        return sys.modules[module] is not None
    try:
        return importlib.util.find_spec(module) is not None
    except (ImportError, ValueError):
        return False


def onnx_available() -> bool:
    """Whether the ``onnx`` package is importable (export needs it; running needs onnxruntime).

    Returns:
        True when ``eo.export_onnx`` can build a model.

    Example:
        >>> import everyo as eo
        >>> isinstance(eo.onnx_available(), bool)
        True
    """
    return _is_importable("onnx")


def import_optional(module: str, purpose: str, hint: str):
    """Import ``module`` or raise :class:`MissingOnnxPackageError` explaining ``purpose``."""
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        raise MissingOnnxPackageError(
            f"{purpose} needs the {module!r} package, which is not installed: {hint}"
        ) from exc


def import_onnx():
    return import_optional("onnx", "exporting to ONNX", ONNX_HINT)


def import_onnxruntime():
    return import_optional("onnxruntime", "running an ONNX model", RUNTIME_HINT)


def reference_evaluator(model):
    """``onnx.reference.ReferenceEvaluator`` for ``model`` (a ModelProto), with LogSoftmax
    computed by its definition, ``x - max - log(sum(exp(x - max)))``.

    NOTE: onnx.reference (1.17 to 1.23 at least) takes the log of the softmax, which is -inf
    wherever a probability underflows float32 (and loses digits before that), while the
    model and ONNX Runtime give the finite value: a correct export was refused. Raises
    ImportError where onnx has no reference evaluator.
    """
    from onnx.reference import ReferenceEvaluator

    return ReferenceEvaluator(model, new_ops=[_log_softmax_by_definition()])


@functools.cache
def _log_softmax_by_definition():
    from onnx.reference.op_run import OpRun

    class LogSoftmax(OpRun):
        op_domain = ""

        def _run(self, x, axis=None):
            if not x.size:
                return (x,)
            axis = self.axis if axis is None else axis
            shifted = x - x.max(axis=axis, keepdims=True)
            total = np.exp(shifted).sum(axis=axis, keepdims=True)
            return ((shifted - np.log(total)).astype(x.dtype, copy=False),)

    return LogSoftmax


def inference_session(model_or_path):
    """An ONNX Runtime CPU session for a file path or serialized model bytes."""
    ort = import_onnxruntime()
    options = ort.SessionOptions()
    options.log_severity_level = 3  # warnings about unused initializers etc. are noise here
    return ort.InferenceSession(model_or_path, sess_options=options,
                                providers=["CPUExecutionProvider"])


def feeds_for(graph_inputs, batch) -> dict:
    """``{input name: float32 array}`` for ``batch``: one array or Tensor for a one-input
    model, a list/tuple (in input order) or a dict by name for several.

    ``graph_inputs`` are ``(name, shape)`` pairs, a symbolic axis being any non-int.
    """
    names = [name for name, _ in graph_inputs]
    if isinstance(batch, dict):
        missing = sorted(set(names) - set(batch))
        unknown = sorted(set(batch) - set(names))
        if missing or unknown:
            raise EveryOError(f"run_onnx: the model's inputs are {names}; missing {missing}, "
                              f"unknown {unknown}")
        arrays = [batch[name] for name in names]
    elif isinstance(batch, (list, tuple)) and len(names) > 1:
        if len(batch) != len(names):
            raise EveryOError(f"run_onnx: the model has {len(names)} inputs {names}, "
                              f"got {len(batch)} arrays")
        arrays = list(batch)
    else:
        if len(names) != 1:
            raise EveryOError(f"run_onnx: the model has {len(names)} inputs {names}; pass a "
                              f"list or a dict of arrays")
        arrays = [batch]
    feeds = {}
    for (name, expected), value in zip(graph_inputs, arrays):
        try:
            array = np.asarray(value.data if isinstance(value, Tensor) else value,
                               dtype=np.float32)
        except (TypeError, ValueError) as exc:
            raise EveryOError(f"run_onnx: the batch for input {name!r} is not numeric: "
                              f"{exc}") from exc
        fits = len(expected) == array.ndim and all(
            not isinstance(dim, int) or dim == size for dim, size in zip(expected, array.shape))
        if not fits:
            shown = tuple(dim if isinstance(dim, int) else str(dim) for dim in expected)
            raise EveryOError(f"run_onnx: the model's input {name!r} has shape {shown} "
                              f"but the batch has shape {array.shape}")
        feeds[name] = array
    return feeds


def run_session(session, batch):
    """Run the session on ``batch`` (see :func:`feeds_for`): the output array, or a list of
    arrays for a model with several outputs."""
    inputs = [(i.name, i.shape) for i in session.get_inputs()]
    outputs = session.run(None, feeds_for(inputs, batch))
    return outputs[0] if len(outputs) == 1 else outputs


def run_onnx(path, batch):
    """Run an exported ONNX file on one batch with ONNX Runtime (CPU).

    Args:
        path: the ``.onnx`` file written by ``eo.export_onnx``.
        batch: array or Tensor shaped like the exported input, any batch size; cast to float32.
            For a model with several inputs, a list of them (in input order) or a dict by
            input name.

    Returns:
        The model's output as a float32 ndarray, or a list of them for several outputs.

    Raises:
        MissingOnnxPackageError (an ``ImportError``): onnxruntime is not installed.
        EveryOError: the file is missing or not a valid model, or the batch does not fit
            the model's input.

    Example:
        >>> import everyo as eo, numpy as np, tempfile, os
        >>> path = os.path.join(tempfile.mkdtemp(), "relu.onnx")
        >>> eo.export_onnx(eo.ReLU(), path, input_shape=(1, 3))
        >>> eo.run_onnx(path, np.array([[-1.0, 0.0, 2.0]]))
        array([[0., 0., 2.]], dtype=float32)
    """
    import_onnxruntime()  # the install hint comes first, whatever else is wrong
    if not os.path.isfile(os.fspath(path)):
        raise EveryOError(f"run_onnx: no ONNX file at {os.fspath(path)!r}")
    try:
        session = inference_session(os.fspath(path))
    except Exception as exc:  # onnxruntime's own types (InvalidProtobuf, Fail, ...)
        raise EveryOError(f"run_onnx: ONNX Runtime cannot load {os.fspath(path)!r} (not a "
                          f"valid ONNX model?): {type(exc).__name__}: {exc}") from exc
    return run_session(session, batch)
