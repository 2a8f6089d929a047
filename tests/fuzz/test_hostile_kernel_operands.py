"""The compiled kernels (everyo-numba) against the NumPy references, through the layers that
call them, on operands no kernel test table lists: byte-swapped (a file from the other
endianness), read-only (a memory-mapped checkpoint), strided and zero-stride (broadcast) views,
16-bit floats, NaN/inf/-0.0, an empty batch, integers. Each case either gives the reference's
outputs and gradients on both providers or the same EveryO error; never Numba's TypingError,
NumPy's raw error, or a crash. (It found Conv2DTranspose's empty-batch reshape error.)"""

from __future__ import annotations

import ml_dtypes
import numpy as np
import pytest

import everyo as eo
import everyo.kernels as K
from everyo.errors import EveryOError

pytestmark = pytest.mark.skipif("numba" not in K.kernel.registry.providers(),
                                reason="kernel provider numba not installed")

_IMAGE = np.random.default_rng(0).standard_normal((2, 6, 7, 9))

LAYERS = {
    "MaxPool2D padded": (lambda: eo.MaxPool2D(3, stride=2, padding=1), _IMAGE),
    "Conv2D": (lambda: eo.Conv2D(9, 8, 3, padding=1), _IMAGE),
    "Conv1D dilated (rows)": (lambda: eo.Conv1D(9, 8, 3, padding=2, dilation=2), _IMAGE[0]),
    "Conv2DTranspose": (lambda: eo.Conv2DTranspose(9, 4, 3, stride=2), _IMAGE),
    "depthwise Conv2D": (lambda: eo.Conv2D(9, 9, 3, groups=9), _IMAGE),
    "LayerNorm": (lambda: eo.LayerNorm(9), _IMAGE),
    "BatchNorm2D": (lambda: eo.BatchNorm2D(9), _IMAGE),
    "GroupNorm": (lambda: eo.GroupNorm(3, 9), _IMAGE),
    "ReLU": (lambda: eo.ReLU(), _IMAGE),
    "LogSoftmax": (lambda: eo.LogSoftmax(), _IMAGE),
    "LSTM": (lambda: eo.LSTM(9, 5), _IMAGE[0]),
    "bidirectional LSTM": (lambda: eo.LSTM(9, 5, bidirectional=True), _IMAGE[0]),
}


def _non_finite(base):
    values = base.astype(np.float32)
    values.reshape(-1)[:4] = [np.nan, np.inf, -0.0, -np.inf]
    return values


def _read_only(base):
    values = base.astype(np.float32)
    values.flags.writeable = False
    return values


OPERANDS = {
    "byte-swapped float32": lambda b: b.astype(">f4"),
    "byte-swapped float64": lambda b: b.astype(">f8"),
    "read-only": _read_only,
    "strided": lambda b: np.repeat(b.astype(np.float32)[..., None], 3, axis=-1)[..., 1],
    "zero-stride": lambda b: np.broadcast_to(b.astype(np.float32)[:1], b.shape),
    "float16": lambda b: b.astype(np.float16),
    "bfloat16": lambda b: b.astype(ml_dtypes.bfloat16),
    "NaN, inf, -0.0": _non_finite,
    "empty batch": lambda b: b[:0].astype(np.float32),
    "int32": lambda b: (3 * b).astype(np.int32),
}


def _run(provider, make, x):
    with K.use(provider):
        eo.manual_seed(0)
        layer = make()
        t = eo.tensor(x, requires_grad=x.dtype.kind not in "iu")
        try:
            out = layer(t)
        except EveryOError as exc:
            return type(exc)
        out = out[0] if isinstance(out, tuple) else out
        arrays = [out.data]
        if out.data.size:
            out.astype("float32").sum().backward()
            arrays += [t.grad] + [p.grad for p in layer.parameters()]
        return [np.asarray(a, np.float64) for a in arrays]


@pytest.mark.parametrize("operand", list(OPERANDS))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_the_compiled_kernels_agree_with_the_references_on_hostile_operands(layer, operand):
    make, base = LAYERS[layer]
    x = OPERANDS[operand](base)
    compiled, reference = _run("numba", make, x), _run("numpy", make, x)
    if not isinstance(reference, list):
        assert compiled is reference  # the same EveryO error
        return
    assert isinstance(compiled, list), compiled
    for got, expected in zip(compiled, reference, strict=True):
        np.testing.assert_allclose(got, expected, rtol=1e-4, atol=1e-4, equal_nan=True)
