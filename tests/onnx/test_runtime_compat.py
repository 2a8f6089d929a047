"""Exports that must run in every onnxruntime the supported Pythons install (1.23 on 3.10)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo

pytest.importorskip("onnxruntime")


@pytest.mark.parametrize("shape", [1, (3, 1), (1, 1)])
def test_layer_norm_over_one_element_runs_in_onnxruntime(tmp_path, shape):
    # onnxruntime 1.23 rejects LayerNormalization over a single element; the converter must
    # give a model that runs (and agrees) in whichever version is installed.
    model = eo.Sequential(eo.LayerNorm(shape))
    trailing = (shape,) if isinstance(shape, int) else shape
    path = tmp_path / "ln.onnx"
    eo.export_onnx(model, str(path), input_shape=(2, 4, *trailing) if len(trailing) > 1
                   else (2, *trailing), verify=True)
    x = np.random.default_rng(0).standard_normal((5, 4, *trailing) if len(trailing) > 1
                                                 else (5, *trailing)).astype(np.float32) * 3 + 1
    expected = model(eo.tensor(x)).data
    np.testing.assert_allclose(eo.run_onnx(str(path), x), expected, atol=1e-6)


def test_a_runtime_failure_during_verify_is_a_serialization_error(tmp_path, monkeypatch):
    import everyo_onnx.verify as verify

    def broken_session(data):
        raise RuntimeError("[ONNXRuntimeError] : 1 : FAIL : simulated")

    monkeypatch.setattr(verify, "inference_session", broken_session)
    path = tmp_path / "m.onnx"
    with pytest.raises(eo.EveryOSerializationError, match="ONNX Runtime could not run"):
        eo.export_onnx(eo.Sequential(eo.Linear(2, 2, seed=0)), str(path), input_shape=(1, 2),
                       verify=True)
    assert not path.exists()
