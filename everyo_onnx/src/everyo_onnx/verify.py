"""``verify=True``: run the serialized model in two independent consumers and compare.

ONNX Runtime is the runtime users deploy on; ``onnx.reference.ReferenceEvaluator`` is ONNX's
own reading of the operator specifications in plain NumPy, so a graph both agree on is not
right merely by one runtime's reading. The inputs have other sizes than the traced ones (every
symbolic axis changed) and other values.
"""

from __future__ import annotations

import numpy as np

from everyo import EveryOError, EveryOSerializationError, Tensor, no_grad, tensor
from everyo_onnx.arguments import other_sizes
from everyo_onnx.runtime import feeds_for, inference_session

# Parity bound of verify=True: float32 rounding from a different order of operations.
VERIFY_RTOL = 1e-4
VERIFY_ATOL = 1e-5


def verify_export(model, data: bytes, specs) -> float:
    """Compare the model with ONNX Runtime and, where importable, ``onnx.reference``.

    Returns:
        The largest absolute difference seen; raises ``EveryOSerializationError`` beyond the
        bound, naming the consumer and the output.
    """
    rng = np.random.default_rng(2)
    shapes = other_sizes(specs)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in shapes]
    with no_grad():
        result = model(*[tensor(a) for a in arrays])
    expected = [np.asarray(r.data if isinstance(r, Tensor) else r)
                for r in (result if isinstance(result, (tuple, list)) else [result])]
    inputs = [(spec.name, [None] * len(shape)) for spec, shape in zip(specs, shapes)]
    feeds = feeds_for(inputs, arrays if len(arrays) > 1 else arrays[0])
    worst = 0.0
    for consumer, run in _consumers(data):
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


def _consumers(data: bytes):
    yield "ONNX Runtime", lambda feeds: inference_session(data).run(None, feeds)
    try:
        from onnx.reference import ReferenceEvaluator
    except ImportError:  # older onnx: ONNX Runtime alone
        return
    import onnx

    yield "onnx.reference", lambda feeds: ReferenceEvaluator(onnx.load_from_string(data)).run(
        None, feeds)


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
