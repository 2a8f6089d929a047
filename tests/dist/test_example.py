"""examples/distributed_training.py prints its table of measurements."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

EXAMPLE = Path(__file__).resolve().parents[2] / "examples" / "distributed_training.py"


def test_example_prints_the_table(clean_shm):
    done = subprocess.run([sys.executable, str(EXAMPLE), "--quick"], capture_output=True,
                          text=True, timeout=180, env=dict(os.environ, OMP_NUM_THREADS="1"))
    assert done.returncode == 0, done.stderr
    lines = done.stdout.splitlines()
    header = lines.index(next(line for line in lines if line.split()[:1] == ["workers"]))
    assert lines[header].split() == ["workers", "rows/worker", "seconds", "max", "drift",
                                     "ranks", "agree"]
    rows = [line.split() for line in lines[header + 2:]]
    assert [row[0] for row in rows] == ["1", "2", "4"]
    assert [int(row[1]) for row in rows] == [1024, 512, 256]
    for _, _, seconds, drift, agree in rows:
        assert float(seconds) > 0
        assert float(drift) <= 1e-5
        assert agree == "True"
    assert float(rows[0][3]) == 0.0  # one worker is single-process training, bit for bit
