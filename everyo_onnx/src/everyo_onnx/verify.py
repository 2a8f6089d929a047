"""``verify=True``: run the serialized model in two independent consumers and compare.

ONNX Runtime is the runtime users deploy on; ``onnx.reference.ReferenceEvaluator`` is ONNX's
own reading of the operator specifications in plain NumPy, so a graph both agree on is not
right merely by one runtime's reading. By default the inputs have other sizes than the traced
ones (every symbolic axis changed) and other values; ``verify_inputs`` gives the user's own
batches instead, for a model that is only meant for some inputs (positive ones, say).
"""

from __future__ import annotations

import functools

import numpy as np

from everyo import EveryOError, EveryOSerializationError, Tensor, no_grad, tensor
from everyo.kernels import is_floating
from everyo_onnx.arguments import other_sizes
from everyo_onnx.runtime import feeds_for, import_onnx, inference_session, reference_evaluator

# Parity bound of verify=True: float32 rounding from a different order of operations.
VERIFY_RTOL = 1e-4
VERIFY_ATOL = 1e-5


def verify_export(model, data: bytes, specs, batches=None) -> float:
    """Compare the model with ONNX Runtime and, where importable, ``onnx.reference``.

    Args:
        batches: the user's batches (from :func:`verification_batches`), or None for random
            inputs at other sizes.

    Returns:
        The largest absolute difference seen; raises ``EveryOSerializationError`` beyond the
        bound, naming the consumer and the output.
    """
    if batches is None:
        rng = np.random.default_rng(2)
        batches = [[rng.standard_normal(shape).astype(np.float32) for shape in other_sizes(specs)]]
    consumers = _consumers(data)
    return max(_verify_batch(model, consumers, specs, arrays) for arrays in batches)


def verification_batches(specs, verify_inputs) -> list[list[np.ndarray]]:
    """``verify_inputs`` (one batch or a list of batches; a batch is an array or Tensor for a
    one-input model, a tuple of them for several) as float32 arrays, or an error naming what
    does not fit the inputs ``specs`` describe."""
    batches = verify_inputs if isinstance(verify_inputs, list) else [verify_inputs]
    if not batches:
        raise EveryOSerializationError("export_onnx: verify_inputs: no batch to verify on")
    return [_batch(specs, batch) for batch in batches]


def _batch(specs, batch) -> list[np.ndarray]:
    count = len(specs)
    if count > 1:
        if not isinstance(batch, tuple) or len(batch) != count:
            got = len(batch) if isinstance(batch, tuple) else type(batch).__name__
            raise EveryOSerializationError(
                f"export_onnx: verify_inputs: a batch for {count} inputs is a tuple of {count} "
                f"arrays or Tensors, one per input, got {got}")
        parts = batch
    else:
        parts = (batch,)
    arrays = []
    for spec, part in zip(specs, parts):
        if not isinstance(part, (np.ndarray, Tensor)):
            raise EveryOSerializationError(
                f"export_onnx: verify_inputs: a batch for {count} input"
                f"{'s is a tuple of arrays or Tensors' if count > 1 else ' is an array or Tensor'}"
                f", got {type(part).__name__}")
        array = np.asarray(part.data if isinstance(part, Tensor) else part)
        if not (is_floating(array.dtype) or array.dtype.kind in "biu"):
            raise EveryOSerializationError(
                f"export_onnx: verify_inputs: the batch for input {spec.name!r} is not numeric "
                f"(dtype {array.dtype})")
        expected = tuple(spec.dims[a] if a in spec.dims else n for a, n in enumerate(spec.shape))
        if array.ndim != len(expected) or any(
                a not in spec.dims and n != m for a, (n, m) in enumerate(zip(spec.shape,
                                                                             array.shape))):
            raise EveryOSerializationError(
                f"export_onnx: verify_inputs: input {spec.name!r} needs shape {expected}, got "
                f"{array.shape}")
        arrays.append(array.astype(np.float32))
    return arrays


def _verify_batch(model, consumers, specs, arrays: list[np.ndarray]) -> float:
    shapes = [a.shape for a in arrays]
    with no_grad():
        result = model(*[tensor(a) for a in arrays])
    expected = [np.asarray(r.data if isinstance(r, Tensor) else r)
                for r in (result if isinstance(result, (tuple, list)) else [result])]
    inputs = [(spec.name, [None] * len(shape)) for spec, shape in zip(specs, shapes)]
    feeds = feeds_for(inputs, arrays if len(arrays) > 1 else arrays[0])
    worst = 0.0
    for consumer, run in consumers:
        try:
            actual = run(feeds)
        except EveryOError:  # a missing package keeps its install hint
            raise
        except Exception as exc:  # each consumer raises its own exception types
            raise EveryOSerializationError(
                f"export_onnx(verify=True): {consumer} could not run the exported model: "
                f"{type(exc).__name__}: {exc}. Nothing was written.") from exc
        for position, (got, want) in enumerate(zip(actual, expected)):
            worst = max(worst, _compare(consumer, position, np.asarray(got), want, shapes))
    return worst


def _consumers(data: bytes) -> list:
    """``(name, run)`` per consumer; each loads the model on its first run (inside the
    caller's error handling) and keeps it for the other batches."""
    session = functools.cache(lambda: inference_session(data))
    evaluator = functools.cache(lambda: reference_evaluator(import_onnx().load_from_string(data)))
    return [("ONNX Runtime", lambda feeds: session().run(None, feeds)),
            ("onnx.reference", lambda feeds: evaluator().run(None, feeds))]


def _compare(consumer: str, position: int, actual, expected, shapes) -> float:
    where = f"output {position} for inputs of shape {', '.join(map(str, shapes))}"
    if actual.shape != expected.shape:
        raise EveryOSerializationError(
            f"export_onnx(verify=True): {consumer} returned shape {actual.shape} for {where}, "
            f"the model {expected.shape}. Nothing was written.")
    if expected.dtype.kind in "fc":  # inf and nan must match exactly, where and what
        finite = np.isfinite(expected)
        if not (np.array_equal(np.isfinite(actual), finite) and np.array_equal(
                actual[~finite], expected[~finite], equal_nan=True)):
            raise EveryOSerializationError(
                f"export_onnx(verify=True): {consumer} disagrees with the model on {where}: "
                f"their inf/nan values differ. Nothing was written.")
        # NOTE: one inf would make the tolerance below infinite; scale by the finite values
        actual, expected = actual[finite], expected[finite]
    if not actual.size:
        return 0.0
    difference = float(np.abs(actual.astype(np.float64) - expected).max())
    scale = max(1.0, float(np.abs(expected).max()))
    if not np.allclose(actual, expected, rtol=VERIFY_RTOL, atol=VERIFY_ATOL * scale):
        raise EveryOSerializationError(
            f"export_onnx(verify=True): {consumer} disagrees with the model on {where} (max "
            f"abs difference {difference:.3g}, allowed rtol={VERIFY_RTOL}, "
            f"atol={VERIFY_ATOL * scale:.3g}). Nothing was written.")
    return difference
