"""examples/mixed_precision.py --quick runs and prints the table of what it measured."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def test_mixed_precision_example_quick():
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    result = subprocess.run([sys.executable, str(ROOT / "examples" / "mixed_precision.py"),
                             "--quick"], capture_output=True, text=True, timeout=120, env=env)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    total = int(re.search(r"Gradient elements flushed to zero \((\d+) total\)", out).group(1))
    assert total == 193
    without = int(re.search(r"no GradScaler \.+ +(\d+) / 193", out).group(1))
    with_scaler = int(re.search(r"with GradScaler \.+ +(\d+) / 193", out).group(1))
    assert without >= 0.9 * total and with_scaler <= 0.02 * total
    assert re.search(r"Final MSE after 150 steps", out)
    bare = float(re.search(r"autocast, no scaler \.+ ([\d.]+)", out).group(1))
    scaled, reference = map(float, re.search(
        r"autocast \+ scaler \.+ ([\d.]+) +float32 reference: ([\d.]+)", out).groups())
    assert abs(scaled - reference) <= 0.05 * reference
    assert bare > 10 * reference
    # bfloat16 keeps float32's exponent range: nothing flushes, no scaler needed
    assert int(re.search(r"bfloat16, no scaler \.+ +(\d+) / 193", out).group(1)) == 0
    bf16 = float(re.search(r"bfloat16, no scaler \.+ ([\d.]+)\n", out).group(1))
    assert abs(bf16 - reference) <= 0.1 * reference
