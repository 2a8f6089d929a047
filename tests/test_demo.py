"""The main job (examples/digits_demo.py) runs end to end and its summary tells the truth: the
accuracy it prints is what the exported ONNX file scores in ONNX Runtime on the held-out
digits, the curves are a real PNG, and two worker processes end with identical weights."""

from __future__ import annotations

import importlib.util
import os
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

pytest.importorskip("sklearn", reason="the demo needs the examples extra (scikit-learn)")
pytest.importorskip("tqdm", reason="the demo needs the examples extra (tqdm)")
pytest.importorskip("matplotlib", reason="the demo needs the examples extra (matplotlib)")
onnxruntime = pytest.importorskip("onnxruntime", reason="the demo exports to ONNX")

ROOT = Path(__file__).resolve().parents[1]
DEMO = ROOT / "examples" / "digits_demo.py"
PNG_SIGNATURE = b"\x89PNG\r\n\x1a\n"
# The quick run (4 epochs, 2 workers, seed 0) is deterministic: every collective reduces in
# rank order in float64. It scores 98.1%, above the demo's own 97% target.
QUICK_ACCURACY_FLOOR = 0.97

pytestmark = pytest.mark.slow


def run_demo(output: Path, *options: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    result = subprocess.run([sys.executable, str(DEMO), "--output", str(output), *options],
                            cwd=output.parent, env=env, capture_output=True, text=True,
                            timeout=240)
    assert result.returncode == 0, f"stdout:\n{result.stdout}\nstderr:\n{result.stderr[-3000:]}"
    return result


def summary_value(stdout: str, row: str) -> str:
    found = re.search(rf"^{re.escape(row)}\s{{2,}}(.+)$", stdout, re.M)
    assert found, f"the summary has no {row!r} row:\n{stdout}"
    return found.group(1)


def percent(text: str) -> float:
    return float(re.match(r"([\d.]+)%", text).group(1)) / 100


def load_demo_module():
    spec = importlib.util.spec_from_file_location("digits_demo", DEMO)
    module = importlib.util.module_from_spec(spec)
    sys.modules[spec.name] = module  # dataclasses look their module up while it executes
    try:
        spec.loader.exec_module(module)
    finally:
        del sys.modules[spec.name]
    return module


@pytest.fixture(scope="module")
def quick_run(tmp_path_factory):
    output = tmp_path_factory.mktemp("demo") / "out"
    result = run_demo(output, "--quick", "--workers", "2")
    return output, result


def test_the_summary_reports_accuracy_above_the_floor_and_a_faithful_export(quick_run):
    _, result = quick_run
    out = result.stdout
    assert "2 worker processes (shm)" in out and "autocast float16 + GradScaler" in out
    assert percent(summary_value(out, "test accuracy")) > QUICK_ACCURACY_FLOOR
    assert "target > 97%: reached" in summary_value(out, "test accuracy")
    onnx_diff = float(summary_value(out, "ONNX max abs diff").split()[0])
    assert 0 <= onnx_diff < 1e-4  # float32 rounding from a different order of operations
    assert summary_value(out, "ONNX predictions") == "all predictions match"
    assert summary_value(out, "ranks agree").startswith("True")
    assert re.search(r"\d+ of 88 steps skipped", summary_value(out, "precision"))


def test_rank_0_shows_one_progress_bar_per_epoch(quick_run):
    _, result = quick_run
    finished = re.findall(r"epoch +(\d)/4: 100%\|.*?held out ([\d.]+)%", result.stderr)
    assert sorted({int(epoch) for epoch, _ in finished}) == [1, 2, 3, 4], result.stderr[-2000:]
    # one bar per epoch: a second rank drawing would print each epoch's bar twice as often
    assert len(re.findall(r"epoch  1/4:   0%\|[^\n]*\?step/s\]", result.stderr)) == 1


def test_the_output_folder_holds_a_real_png_and_the_onnx_file(quick_run):
    output, result = quick_run
    assert f"Output folder: {output.resolve()}" in result.stdout
    png = output / "training_curves.png"
    assert png.read_bytes()[:8] == PNG_SIGNATURE
    import matplotlib.image

    pixels = matplotlib.image.imread(png)
    assert pixels.ndim == 3 and pixels.shape[0] > 100 and pixels.shape[1] > 100
    assert pixels[..., :3].std() > 0.05  # something was drawn


def test_the_onnx_file_scores_the_printed_accuracy_in_onnx_runtime(quick_run):
    output, result = quick_run
    session = onnxruntime.InferenceSession(str(output / "digits_cnn.onnx"),
                                           providers=["CPUExecutionProvider"])
    (model_input,), (model_output,) = session.get_inputs(), session.get_outputs()
    assert model_output.name == "logits" and model_input.shape[1:] == [8, 8, 1]
    _, _, x_test, y_test = load_demo_module().load_data(seed=0)
    (logits,) = session.run(None, {model_input.name: x_test.astype(np.float32)})
    assert logits.shape == (len(x_test), 10)
    onnx_accuracy = float((logits.argmax(axis=1) == y_test).mean())
    printed = percent(summary_value(result.stdout, "test accuracy"))
    assert onnx_accuracy == pytest.approx(printed, abs=0.00005)  # printed with two decimals


def test_float32_on_one_worker(tmp_path):
    result = run_demo(tmp_path / "out", "--no-amp", "--workers", "1", "--epochs", "2")
    out = result.stdout
    assert "1 worker process (shm), float32, 2 epochs" in out
    assert summary_value(out, "precision") == "float32"
    assert percent(summary_value(out, "test accuracy")) > 0.9
    assert summary_value(out, "ONNX predictions") == "all predictions match"
    assert (tmp_path / "out" / "digits_cnn.onnx").stat().st_size > 0
