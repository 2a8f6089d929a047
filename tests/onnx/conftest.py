"""Fixtures of the ONNX tests: the optional packages, and the export-run-compare check every
supported layer goes through."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo

# Parity bound between EveryO and ONNX Runtime: float32 rounding only.
ATOL = 1e-5
RTOL = 1e-4


@pytest.fixture(scope="session")
def onnx():
    return pytest.importorskip("onnx", reason="onnx is not installed")


@pytest.fixture(scope="session")
def ort():
    return pytest.importorskip("onnxruntime", reason="onnxruntime is not installed")


def modes(model) -> list[bool]:
    return [module.training for module in model.modules()]


def eval_output(model, batch: np.ndarray) -> np.ndarray:
    """The model's eval-mode output on ``batch``; the model's modes are left as they were."""
    before = [(module, module.training) for module in model.modules()]
    model.eval()
    try:
        with eo.no_grad():
            return np.asarray(model(eo.tensor(batch)).data)
    finally:
        for module, training in before:
            module.training = training


@pytest.fixture
def parity(onnx, ort, tmp_path):
    """``parity(model, input_shape, batch_sizes=(3, 7), opset=None, scale=1.0) -> path``:
    export, check the file with onnx.checker (full_check), run it in ONNX Runtime at batch sizes
    other than ``input_shape[0]`` and compare with the model in eval mode."""
    counter = iter(range(10_000))

    def check(model, input_shape, batch_sizes=(3, 7), opset=None, scale=1.0, batches=None):
        path = tmp_path / f"model_{next(counter)}.onnx"
        modes_before = modes(model)
        state_before = model.state_dict()
        eo.export_onnx(model, path, input_shape=input_shape, opset=opset)
        assert modes(model) == modes_before, "export changed the model's train/eval mode"
        for key, value in model.state_dict().items():  # e.g. BatchNorm statistics untouched
            np.testing.assert_array_equal(value, state_before[key], err_msg=key)
        onnx.checker.check_model(onnx.load(str(path)), full_check=True)
        rng = np.random.default_rng(123)
        if batches is None:
            assert input_shape[0] not in batch_sizes
            batches = [(scale * rng.standard_normal((n, *input_shape[1:]))).astype(np.float32)
                       for n in batch_sizes]
        for batch in batches:
            expected = eval_output(model, batch)
            actual = eo.run_onnx(path, batch)
            assert actual.shape == expected.shape
            np.testing.assert_allclose(actual, expected, rtol=RTOL, atol=ATOL)
        return path

    return check
