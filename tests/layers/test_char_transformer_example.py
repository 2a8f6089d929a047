"""examples/char_transformer.py: trains (the loss falls), samples, and a run stopped, saved
and resumed in a new process ends exactly where a straight run ends."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "char_transformer.py"
ENV = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
       "MKL_NUM_THREADS": "1"}


def _run(*args) -> str:
    result = subprocess.run([sys.executable, str(EXAMPLE), "--quick", "--steps", "40", *args],
                            capture_output=True, text=True, timeout=300, env=ENV)
    assert result.returncode == 0, result.stderr
    return result.stdout


def _final(out: str) -> tuple[str, str]:
    return (re.search(r"final train loss (\S+)", out).group(1),
            re.search(r"val loss (\S+)", out).group(1))


def test_trains_samples_and_resumes_exactly(tmp_path):
    straight = _run("--sample", "60")
    losses = [float(v) for v in re.findall(r"step \d+ loss (\S+)", straight)]
    assert losses[-1] < losses[0] - 0.5, losses  # 40 steps learn the character statistics
    sample = straight.split("sample:\n", 1)[1]
    assert sample.startswith("def ") and len(sample.rstrip("\n")) >= 60
    ckpt = tmp_path / "ckpt.npz"
    _run("--checkpoint", str(ckpt), "--stop-after", "17", "--sample", "0")
    resumed = _run("--checkpoint", str(ckpt), "--resume", "--sample", "60")
    assert "resumed at step 17" in resumed
    assert _final(resumed) == _final(straight)
    assert resumed.split("sample:\n", 1)[1] == sample
