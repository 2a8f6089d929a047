"""Data-parallel training on one machine: the same MLP trained by 1, 2 and 4 worker processes.

Every worker holds a copy of the model and a disjoint shard of the data; ``average_gradients``
averages the gradients across workers before each SGD step, which is the same arithmetic as one
full batch. The table compares each run with single-process full-batch training:

    OMP_NUM_THREADS=1 python examples/distributed_training.py           # the full run
    OMP_NUM_THREADS=1 python examples/distributed_training.py --quick   # a few seconds, for CI

``seconds`` is the training loop of the slowest worker (interpreter start-up excluded),
``max drift`` the largest weight difference from single-process training, ``ranks agree``
whether every worker ended with bit-identical weights.
"""

from __future__ import annotations

import argparse
import time

import numpy as np

import everyo as eo
from everyo.distributed import average_gradients, shard_indices, spawn

FEATURES, HIDDEN = 32, 128
steps = 60


def build_model():
    """A three-layer MLP whose initial weights depend only on a fixed seed."""
    model = eo.Sequential(eo.Linear(FEATURES, HIDDEN), eo.ReLU(), eo.Linear(HIDDEN, HIDDEN),
                          eo.ReLU(), eo.Linear(HIDDEN, 1))
    rng = np.random.default_rng(0)
    for param in model.parameters():
        scale = 1.0 / np.sqrt(param.data.shape[0]) if param.data.ndim == 2 else 0.1
        param.data = (rng.standard_normal(param.data.shape) * scale).astype(np.float32)
    return model


# -- the worker, as a user writes it ---------------------------------------------------------------
def worker(group, inputs, targets):
    model = build_model()  # same seeds on every rank
    optimizer = eo.SGD(model.parameters(), lr=0.05)
    rows = shard_indices(len(inputs), group.rank, group.world_size)
    xs, ys = eo.tensor(inputs[rows]), eo.tensor(targets[rows])

    for _ in range(steps):
        optimizer.zero_grad()
        residual = model(xs) - ys
        eo.mean(residual * residual).backward()
        average_gradients(model.parameters(), group)
        optimizer.step()

    return [p.data for p in model.parameters()]


def timed_worker(group, inputs, targets, step_count):
    """``worker``, timed from a common start (a barrier) to its own end."""
    global steps
    steps = step_count
    group.barrier()
    start = time.perf_counter()
    weights = worker(group, inputs, targets)
    return weights, time.perf_counter() - start


def single_process(inputs, targets):
    """Full-batch training in this process: what data-parallel training must reproduce."""
    model = build_model()
    optimizer = eo.SGD(model.parameters(), lr=0.05)
    xs, ys = eo.tensor(inputs), eo.tensor(targets)
    for _ in range(steps):
        optimizer.zero_grad()
        residual = model(xs) - ys
        eo.mean(residual * residual).backward()
        optimizer.step()
    return [p.data for p in model.parameters()]


def make_data(rows: int):
    rng = np.random.default_rng(1)
    inputs = rng.standard_normal((rows, FEATURES)).astype(np.float32)
    targets = np.tanh(inputs[:, :4].sum(axis=1, keepdims=True)).astype(np.float32)
    return inputs, targets


def main() -> None:
    global steps
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer rows and steps (CI)")
    parser.add_argument("--workers", type=int, nargs="+", default=[1, 2, 4])
    options = parser.parse_args()
    rows, steps = (1024, 10) if options.quick else (4096, 60)
    inputs, targets = make_data(rows)
    reference = single_process(inputs, targets)

    print(f"{steps} steps of a three-layer MLP ({FEATURES}-{HIDDEN}-{HIDDEN}-1) over {rows} "
          f"samples")
    print(f"{'workers':>8} {'rows/worker':>13} {'seconds':>10} {'max drift':>12} "
          f"{'ranks agree':>13}")
    print("-" * 62)
    for workers in options.workers:
        results = spawn(timed_worker, workers, args=(inputs, targets, steps))
        weights = [w for w, _ in results]
        seconds = max(s for _, s in results)
        agree = all(a.tobytes() == b.tobytes() for rank in weights[1:]
                    for a, b in zip(weights[0], rank))
        drift = max(float(np.max(np.abs(a - b))) for a, b in zip(weights[0], reference))
        rows_per_worker = len(shard_indices(rows, 0, workers))
        print(f"{workers:>8} {rows_per_worker:>13} {seconds:>10.2f} {drift:>12.2e} "
              f"{str(agree):>13}")


if __name__ == "__main__":
    main()
