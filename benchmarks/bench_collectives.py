"""Collectives of everyo-dist against MPI, and the 2-worker speed-up of a training step.

    OMP_NUM_THREADS=1 python benchmarks/bench_collectives.py

1. ``all_reduce_mean`` of float32 vectors (40 KB, 4 MB, 40 MB) between 2 ranks of the ``shm``
   backend, against mpi4py's ``Allreduce`` (MPICH, started with the virtualenv's ``mpiexec -n
   2``) on the same sizes, in the same run. Both report the median time per call on rank 0.
   (MPI sums float32 in float32; EveryO reduces in float64, which costs it a conversion.)
2. One compute-bound training step (a wide MLP, full batch) with 1 worker versus 2 workers that
   each take half the batch and average gradients: the speed-up (target >= 1.7x on 2 cores).
"""

from __future__ import annotations

import argparse
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np

import everyo as eo
from everyo.distributed import average_gradients, shard_indices, spawn

SIZES = {"40 KB": 10_000, "4 MB": 1_000_000, "40 MB": 10_000_000}
REPEATS = {"40 KB": 2000, "4 MB": 200, "40 MB": 20}

MPI_SCRIPT = r"""
import sys, time
import numpy as np
from mpi4py import MPI
comm = MPI.COMM_WORLD
for label, count, repeats in [tuple(x.split(":")) for x in sys.argv[1:]]:
    count, repeats = int(count), int(repeats)
    send = np.random.default_rng(comm.rank).standard_normal(count).astype(np.float32)
    recv = np.empty_like(send)
    for _ in range(max(3, repeats // 10)):
        comm.Allreduce(send, recv, op=MPI.SUM)
    times = []
    for _ in range(repeats):
        comm.Barrier()
        start = time.perf_counter()
        comm.Allreduce(send, recv, op=MPI.SUM)
        times.append(time.perf_counter() - start)
    if comm.rank == 0:
        print(label, sorted(times)[len(times) // 2], flush=True)
"""


def time_all_reduce(group, sizes, repeats):
    """Median seconds per ``all_reduce_mean`` for each size, measured on every rank."""
    medians = {}
    for label, count in sizes.items():
        data = np.random.default_rng(group.rank).standard_normal(count).astype(np.float32)
        for _ in range(max(3, repeats[label] // 10)):
            group.all_reduce_mean(data)
        times = []
        for _ in range(repeats[label]):
            group.barrier()
            start = time.perf_counter()
            group.all_reduce_mean(data)
            times.append(time.perf_counter() - start)
        medians[label] = float(np.median(times))
    return medians


def mpi_all_reduce(sizes, repeats):
    """The same measurement with MPICH's Allreduce, or None when MPI is not available."""
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or \
        shutil.which("mpiexec")
    if mpiexec is None:
        return None
    args = [f"{label}:{count}:{repeats[label]}" for label, count in sizes.items()]
    done = subprocess.run([mpiexec, "-n", "2", sys.executable, "-c", MPI_SCRIPT, *args],
                          capture_output=True, text=True, timeout=600,
                          env=dict(os.environ, OMP_NUM_THREADS="1"))
    if done.returncode != 0:
        print(f"(mpiexec failed: {done.stderr.strip()[-300:]})")
        return None
    medians = {}
    for line in done.stdout.splitlines():
        *label, seconds = line.split()
        medians[" ".join(label)] = float(seconds)
    return medians


# -- a compute-bound training step -------------------------------------------------------------
ROWS, FEATURES, HIDDEN = 4096, 256, 1024


def build_model():
    model = eo.Sequential(eo.Linear(FEATURES, HIDDEN), eo.ReLU(), eo.Linear(HIDDEN, HIDDEN),
                          eo.ReLU(), eo.Linear(HIDDEN, 1))
    rng = np.random.default_rng(0)
    for param in model.parameters():
        param.data = (rng.standard_normal(param.data.shape) * 0.03).astype(np.float32)
    return model


def step_time(group, repeats):
    """Median seconds of one training step (forward, backward, average, SGD) on this rank."""
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((ROWS, FEATURES)).astype(np.float32)
    targets = rng.standard_normal((ROWS, 1)).astype(np.float32)
    rows = shard_indices(ROWS, group.rank, group.world_size)
    xs, ys = eo.tensor(inputs[rows]), eo.tensor(targets[rows])
    model = build_model()
    optimizer = eo.SGD(model.parameters(), lr=0.01)
    times = []
    for _ in range(repeats + 2):
        group.barrier()
        start = time.perf_counter()
        optimizer.zero_grad()
        residual = model(xs) - ys
        eo.mean(residual * residual).backward()
        average_gradients(model.parameters(), group)
        optimizer.step()
        group.barrier()
        times.append(time.perf_counter() - start)
    return float(np.median(times[2:]))


def main() -> None:
    parser = argparse.ArgumentParser(description="everyo-dist collectives vs MPI")
    parser.add_argument("--quick", action="store_true", help="fewer repetitions")
    options = parser.parse_args()
    repeats = {k: max(5, v // 10) for k, v in REPEATS.items()} if options.quick else REPEATS

    ours = spawn(time_all_reduce, 2, args=(SIZES, repeats))[0]
    mpi = mpi_all_reduce(SIZES, repeats)
    print("all_reduce_mean, float32, 2 ranks (median per call)")
    print(f"{'size':>7} {'everyo shm':>12} {'MPICH':>10} {'everyo/MPI':>11}")
    for label in SIZES:
        reference = mpi.get(label) if mpi else None
        ratio = f"{ours[label] / reference:>10.2f}x" if reference else f"{'n/a':>11}"
        mpi_text = f"{reference * 1e3:>8.3f}ms" if reference else f"{'n/a':>10}"
        print(f"{label:>7} {ours[label] * 1e3:>10.3f}ms {mpi_text} {ratio}")

    step_repeats = 3 if options.quick else 10
    one = spawn(step_time, 1, args=(step_repeats,))[0]
    two = max(spawn(step_time, 2, args=(step_repeats,)))
    print(f"\ntraining step, MLP {FEATURES}-{HIDDEN}-{HIDDEN}-1 on {ROWS} rows (median)")
    print(f"1 worker {one * 1e3:.1f} ms, 2 workers {two * 1e3:.1f} ms: speed-up {one / two:.2f}x "
          f"(target >= 1.7x)")


if __name__ == "__main__":
    main()
