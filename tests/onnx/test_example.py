"""examples/onnx_export.py runs end to end and reports an agreement it measured."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "onnx_export.py"


def test_example_exports_and_agrees(tmp_path, ort):
    pytest.importorskip("sklearn")
    out = tmp_path / "digits.onnx"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(EXAMPLE), "--quick", "--out", str(out)],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    difference = float(re.search(r"max abs difference (\S+)", result.stdout).group(1))
    assert 0.0 <= difference < 1e-4
    assert "every prediction matches: True" in result.stdout
    accuracy = float(re.search(r"test accuracy (\S+)", result.stdout).group(1))
    assert accuracy > 0.5  # two epochs train a real classifier, not a constant one
    assert out.is_file() and out.stat().st_size > 1000
