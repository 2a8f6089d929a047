"""Exports that must run in every onnxruntime the supported Pythons install (1.23 on 3.10)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_onnx import verify

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape", [(1,), (3, 1), (1, 1), (2,), (8,)])
def test_layer_norm_runs_and_agrees_in_the_installed_onnxruntime(tmp_path, shape):
    # onnxruntime 1.23 (the newest for Python 3.10) refuses LayerNormalization over a single
    # element; the exported graph must run in whichever version is installed.
    model = eo.Sequential(eo.LayerNorm(shape))
    path = tmp_path / "ln.onnx"
    eo.export_onnx(model, str(path), input_shape=(2, 4, *shape), verify=True)
    x = np.random.default_rng(0).standard_normal((5, 4, *shape)).astype(np.float32) * 3 + 1
    np.testing.assert_allclose(eo.run_onnx(str(path), x), model(eo.tensor(x)).data,
                               rtol=1e-5, atol=1e-5)


def test_layer_norm_of_inputs_with_a_large_mean_stays_accurate(tmp_path):
    # onnxruntime's own LayerNormalization (1.19, 1.23) takes E[x^2] - E[x]^2 in float32 and
    # was off by 0.09-0.38 here; a float32 graph can only be off by the mean's rounding
    # (a few ulps of 5) relative to the spread (0.01).
    model = eo.Sequential(eo.LayerNorm(8))
    path = tmp_path / "ln.onnx"
    eo.export_onnx(model, str(path), input_shape=(1, 8))
    x = (np.random.default_rng(1).standard_normal((200, 8)) * 0.01 + 5).astype(np.float32)
    bound = 16 * float(np.spacing(np.float32(5))) / 0.01
    np.testing.assert_allclose(eo.run_onnx(str(path), x), model(eo.tensor(x)).data, atol=bound)


def test_a_runtime_failure_during_verify_is_a_serialization_error(tmp_path, monkeypatch):
    def broken_session(data):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : simulated")

    monkeypatch.setattr(verify, "inference_session", broken_session)
    path = tmp_path / "m.onnx"
    with pytest.raises(eo.EveryOSerializationError, match="ONNX Runtime could not run"):
        eo.export_onnx(eo.Sequential(eo.Linear(2, 2, seed=0)), str(path), input_shape=(1, 2),
                       verify=True)
    assert not path.exists()
