"""Autograd overhead per op and `import everyo` time.

Per-op overhead: a chain of 300 tiny elementwise ops on a 4-element tensor, forward and
backward, in EveryO and in PyTorch CPU in the same run. Target: <= 10 µs per op.
Import time: `import everyo` in a fresh interpreter with every plugin installed (target < 0.3 s).

Run: python benchmarks/bench_autograd.py
"""

from __future__ import annotations

import os
import subprocess
import sys

sys.path.insert(0, os.path.dirname(__file__))

import numpy as np
from _timing import best_of, ratio_line, torch_or_none

import everyo as eo

CHAIN = 300


def chain(x):
    for _ in range(CHAIN // 3):
        x = x * 1.0001
        x = x + 0.5
        x = x.tanh()
    return x


def everyo_step():
    x = eo.tensor(np.random.default_rng(0).standard_normal(4), requires_grad=True)
    chain(x).sum().backward()


def torch_step(torch):
    x = torch.randn(4, requires_grad=True)
    chain(x).sum().backward()


def import_time(repeats: int = 5) -> float:
    code = "import time; t = time.perf_counter(); import everyo; print(time.perf_counter() - t)"
    times = [float(subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                                  check=True).stdout) for _ in range(repeats)]
    return min(times)


def main() -> None:
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(1)
    ours = best_of(everyo_step, repeats=15) / CHAIN * 1e6
    reference = best_of(lambda: torch_step(torch), repeats=15) / CHAIN * 1e6 if torch else None
    print(f"{'benchmark':<28} {'EveryO':>13}  {'PyTorch CPU':>13}  {'ratio':>7}")
    print(ratio_line("autograd overhead per op", ours, reference, target="(target <= 10 µs)"))
    plugins = len(eo.plugins.host.plugins)
    print(f"{'import everyo':<28} {import_time() * 1000:10.1f} ms  "
          f"({plugins} plugins loaded; target < 300 ms)")


if __name__ == "__main__":
    main()
