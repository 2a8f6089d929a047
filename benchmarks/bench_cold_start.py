"""Cold start of the kernel providers: the first training step on a fresh machine (every kernel
compiled), the first step of a later process (compiled code loaded from the disk cache) and a
warm step, against the NumPy references in a process of their own.

Each run is a new process with the same empty Numba cache directory (``NUMBA_CACHE_DIR``), so
the first one compiles and the next ones load; ``import everyo`` is timed in each.

    python benchmarks/bench_cold_start.py [--case cnn_digits]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import tempfile

CHILD = """
import json, sys, time
start = time.perf_counter()
import everyo as eo
imported = time.perf_counter() - start
sys.path.insert(0, {here!r})
import numpy as np
import bench_sequence, bench_training
cases = {{c.name: c for c in bench_training.CASES + bench_sequence.CASES}}
case = cases[{case!r}]
x, y = case.make_batch(np.random.default_rng(0))
step = bench_training.everyo_step(case, x, y)
start = time.perf_counter(); step(); first = time.perf_counter() - start
start = time.perf_counter(); step(); warm = time.perf_counter() - start
print(json.dumps({{"import": imported, "first": first, "warm": warm,
                  "provider": eo.kernels.provider_name()}}))
"""


def run(case: str, cache: str, kernels: str | None) -> dict:
    env = {**os.environ, "NUMBA_CACHE_DIR": cache, "OMP_NUM_THREADS": "1",
           "OPENBLAS_NUM_THREADS": "1"}
    if kernels:
        env["EVERYO_KERNELS"] = kernels
    code = CHILD.format(here=os.path.dirname(os.path.abspath(__file__)), case=case)
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            env=env, timeout=900)
    if result.returncode:
        raise SystemExit(result.stderr)
    return json.loads(result.stdout.strip().splitlines()[-1])


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", default="cnn_digits")
    args = parser.parse_args()
    with tempfile.TemporaryDirectory() as cache:
        rows = [("numpy (references)", run(args.case, cache, "numpy")),
                ("provider, first-ever run", run(args.case, cache, None)),
                ("provider, cached", run(args.case, cache, None)),
                ("provider, cached again", run(args.case, cache, None))]
    print(f"{args.case}: import everyo / first step / warm step, seconds")
    for label, row in rows:
        print(f"  {label:<26} [{row['provider']}]  import {row['import']:6.3f}  "
              f"first step {row['first']:7.3f}  warm step {row['warm']:7.4f}")


if __name__ == "__main__":
    main()
