"""Run the benchmarks in this folder, one after another (``make bench``).

    python benchmarks/run_all.py [args passed to every bench_*.py]
    python benchmarks/run_all.py --issue25     # #25's whole table, in one go (see below)

``--issue25`` runs, in this order, every measurement issue #25's table asks for, each in its
own process with the environment it needs (``OPENBLAS_CORETYPE`` and ``OPENBLAS_L2_SIZE``
unset; one BLAS/OpenMP thread for the one-thread rows; no thread cap for the two-thread rows),
prints each benchmark's own output as it comes, then the lines that carry the ratios again, as
one summary, with the wall-clock time of each part and of the whole run. JAX joins the training
rows when ``.venv-jax`` (or ``$EVERYO_BENCH_JAX_PYTHON``) has ``jax[cpu]``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from pathlib import Path

HERE = Path(__file__).resolve().parent

#: Environment variables a benchmark never inherits (OpenBLAS's own choice of kernels).
_UNSET = ("OPENBLAS_CORETYPE", "OPENBLAS_L2_SIZE")
_ONE_THREAD = {"OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"}

#: #25's table: (label, script and arguments, one thread?).
ISSUE25 = [
    ("training steps, 1 thread", ["bench_training.py", "--threads", "1", "--quick"], True),
    ("lstm, transformer, 1 thread", ["bench_sequence.py", "--threads", "1", "--quick"], True),
    ("layers / PyTorch, 1 thread", ["bench_layers.py", "--threads", "1", "--quick"], True),
    ("norms forward + backward / PyTorch", ["bench_norm_stats.py"], True),
    ("autocast / float32 step", ["bench_amp.py", "--model", "mlp_large", "--model",
                                 "cnn_cifar", "--repeats", "7"], True),
    ("per-op autograd overhead", ["bench_autograd.py", "--quick"], True),
    ("shm all-reduce / MPICH, 2 ranks", ["bench_collectives.py", "--quick"], True),
    ("training steps, 2 threads", ["bench_training.py", "--threads", "2", "--quick"], False),
    ("lstm, transformer, 2 threads", ["bench_sequence.py", "--threads", "2", "--quick"], False),
    ("layers / PyTorch, 2 threads", ["bench_layers.py", "--threads", "2", "--quick"], False),
]

#: A line of a benchmark's output that carries a ratio (kept for the summary).
_RATIO_MARKS = ("x ", "x)", "x\n", "×")
#: Lines that say which model, dtype or provider the ratio lines after them belong to.
_HEADERS = ("==", "float16 +", "bfloat16", "model", "mlp_large", "cnn_cifar")


def _environment(one_thread: bool) -> dict:
    env = {k: v for k, v in os.environ.items()
           if k not in _UNSET and (one_thread or k not in _ONE_THREAD)}
    if one_thread:
        env.update(_ONE_THREAD)
    return env


def _run(arguments: list, env: dict) -> tuple:
    """Run one benchmark, echoing its output; ``(return code, its output lines)``."""
    process = subprocess.Popen([sys.executable, str(HERE / arguments[0]), *arguments[1:]],
                               env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                               text=True)
    lines = []
    assert process.stdout is not None
    for line in process.stdout:
        print(line, end="", flush=True)
        lines.append(line)
    return process.wait(), lines


def issue25() -> int:
    """#25's table in one run; the summary at the end."""
    summary, failed, start = [], [], time.perf_counter()
    for label, arguments, one_thread in ISSUE25:
        print(f"\n=== {label}: {' '.join(arguments)}", flush=True)
        began = time.perf_counter()
        code, lines = _run(arguments, _environment(one_thread))
        took = time.perf_counter() - began
        if code:
            failed.append(label)
        ratios = [line.rstrip() for line in lines if any(m in line for m in _RATIO_MARKS)
                  or line.lstrip().startswith(_HEADERS)]
        summary.append((label, took, code, ratios))
    print(f"\n=== #25 summary ({time.strftime('%Y-%m-%d %H:%M UTC', time.gmtime())}, "
          f"load average {os.getloadavg()[0]:.1f}, total {time.perf_counter() - start:.0f} s)")
    for label, took, code, ratios in summary:
        print(f"\n-- {label} ({took:.0f} s{', FAILED' if code else ''})")
        for line in ratios:
            print(f"   {line}")
    return 1 if failed else 0


def main() -> int:
    if sys.argv[1:] == ["--issue25"]:
        return issue25()
    env = {**os.environ}
    failed = []
    for script in sorted(HERE.glob("bench_*.py")):
        print(f"\n=== {script.name}", flush=True)
        if subprocess.run([sys.executable, str(script), *sys.argv[1:]], env=env).returncode:
            failed.append(script.name)
    if failed:
        print(f"\nfailed: {', '.join(failed)}")
    return 1 if failed else 0


if __name__ == "__main__":
    raise SystemExit(main())
