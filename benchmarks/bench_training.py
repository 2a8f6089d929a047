"""Training-step benchmark: EveryO against PyTorch CPU on the same models, same thread count.

One step is forward, cross-entropy loss, backward and an SGD update. For each case the script
prints ms/step for EveryO under each kernel provider (``numpy``, the references, and every
installed provider such as ``numba``), PyTorch and, when a Python with ``jax[cpu]`` is found,
JAX (``jax.jit`` over the whole step, in a subprocess), and the ratios to the fastest peer.

    python benchmarks/bench_training.py            # every case
    python benchmarks/bench_training.py --quick    # fewer repetitions
    python benchmarks/bench_training.py --only cnn_cifar --threads 1

Other benchmark files reuse this machinery (benchmarks/bench_sequence.py does)::

    sys.path.insert(0, os.path.dirname(__file__))
    from bench_training import Case, main

    main([Case("lstm", 2.0, build_everyo_model, build_torch_model, make_batch, ...)])

Timing: EveryO (each provider) and PyTorch are measured in alternating blocks and the best
block is reported, so that all see the same load on a shared machine; JAX runs in its own
process right after, best of as many blocks.
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Callable

import numpy as np


@dataclass
class Case:
    """One benchmark row.

    Attributes:
        name: the row's label.
        target: the ratio (EveryO / the fastest peer, PyTorch or JAX; ``peer="PyTorch"``: /
            PyTorch) we aim to stay under.
        everyo_model: builds the EveryO model (no arguments).
        torch_model: builds the PyTorch model, given the ``torch`` module.
        make_batch: ``rng -> (inputs, integer targets)`` as NumPy arrays, channel-last/NHWC.
        to_torch_layout: turns the NumPy inputs into PyTorch's layout (e.g. NHWC -> NCHW).
        everyo_loss / torch_loss: ``(outputs, targets) -> scalar loss``; default cross-entropy
            over the last axis.
    """

    name: str
    target: float
    everyo_model: Callable
    torch_model: Callable
    make_batch: Callable
    to_torch_layout: Callable = staticmethod(lambda x: x)
    everyo_loss: Callable | None = None
    torch_loss: Callable | None = None
    peer: str = "fastest"  # the target's reference: "fastest" (PyTorch or JAX) or "PyTorch"


def _classification_batch(shape, classes):
    def make(rng):
        return (rng.standard_normal(shape).astype(np.float32),
                rng.integers(0, classes, shape[0]))
    return make


def _nchw(x):
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _mlp_everyo(sizes):
    def build():
        import everyo as eo
        layers = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(eo.Linear(a, b, seed=i))
            if i < len(sizes) - 2:
                layers.append(eo.ReLU())
        return eo.Sequential(*layers)
    return build


def _mlp_torch(sizes):
    def build(torch):
        layers = []
        for i, (a, b) in enumerate(zip(sizes[:-1], sizes[1:])):
            layers.append(torch.nn.Linear(a, b))
            if i < len(sizes) - 2:
                layers.append(torch.nn.ReLU())
        return torch.nn.Sequential(*layers)
    return build


def _cnn_everyo(in_channels, c1, c2, side):
    def build():
        import everyo as eo
        return eo.Sequential(
            eo.Conv2D(in_channels, c1, 3, padding="same", seed=0), eo.ReLU(), eo.MaxPool2D(2),
            eo.Conv2D(c1, c2, 3, padding="same", seed=1), eo.ReLU(), eo.MaxPool2D(2),
            eo.Flatten(), eo.Linear((side // 4) ** 2 * c2, 10, seed=2))
    return build


def _cnn_torch(in_channels, c1, c2, side):
    def build(torch):
        nn = torch.nn
        return nn.Sequential(
            nn.Conv2d(in_channels, c1, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Conv2d(c1, c2, 3, padding=1), nn.ReLU(), nn.MaxPool2d(2),
            nn.Flatten(), nn.Linear((side // 4) ** 2 * c2, 10))
    return build


CASES = [
    Case("mlp_small", 0.8, _mlp_everyo([64, 128, 10]), _mlp_torch([64, 128, 10]),
         _classification_batch((64, 64), 10), peer="PyTorch"),
    Case("mlp_large", 1.0, _mlp_everyo([1024, 2048, 2048, 10]),
         _mlp_torch([1024, 2048, 2048, 10]), _classification_batch((256, 1024), 10)),
    Case("cnn_digits", 1.0, _cnn_everyo(1, 16, 32, 8), _cnn_torch(1, 16, 32, 8),
         _classification_batch((128, 8, 8, 1), 10), _nchw),
    Case("cnn_cifar", 1.0, _cnn_everyo(3, 32, 64, 32), _cnn_torch(3, 32, 64, 32),
         _classification_batch((64, 32, 32, 3), 10), _nchw),
]


def time_block(step: Callable, steps: int) -> float:
    """Mean time of ``steps`` consecutive calls to ``step``, in ms."""
    start = time.perf_counter()
    for _ in range(steps):
        step()
    return (time.perf_counter() - start) / steps * 1e3


def time_pair(ours: Callable, reference: Callable, warmup: int, repeats: int,
              steps: int) -> tuple:
    """Median ms/step of both, measured in alternating blocks so that both see the same
    machine load (other processes on a shared 2-core machine otherwise skew the ratio)."""
    for _ in range(warmup):
        ours()
        reference()
    ours_ms, ref_ms = [], []
    for _ in range(repeats):
        ours_ms.append(time_block(ours, steps))
        ref_ms.append(time_block(reference, steps))
    return statistics.median(ours_ms), statistics.median(ref_ms)


def everyo_step(case: Case, x: np.ndarray, y: np.ndarray) -> Callable:
    import everyo as eo
    model = case.everyo_model()
    optimizer = eo.SGD(list(model.parameters()), lr=0.01)
    loss_fn = case.everyo_loss or eo.cross_entropy
    inputs = eo.tensor(x)

    def step():
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), y)
        loss.backward()
        optimizer.step()
    return step


def torch_step(case: Case, torch, x: np.ndarray, y: np.ndarray) -> Callable:
    torch.manual_seed(0)
    model = case.torch_model(torch)
    optimizer = torch.optim.SGD(model.parameters(), lr=0.01)
    loss_fn = case.torch_loss or torch.nn.functional.cross_entropy
    inputs = torch.from_numpy(case.to_torch_layout(x))
    targets = torch.from_numpy(y)

    def step():
        optimizer.zero_grad()
        loss = loss_fn(model(inputs), targets)
        loss.backward()
        optimizer.step()
    return step


def kernel_selections(requested: str | None) -> list:
    """The kernel providers to time: ``numpy`` (the references) and every installed provider,
    or the comma-separated ``requested`` ones."""
    import everyo as eo

    installed = ["numpy"] + sorted(eo.registry("kernels").providers())
    if not requested:
        return installed
    chosen = [name.strip() for name in requested.split(",") if name.strip()]
    missing = [name for name in chosen if name not in installed]
    if missing:
        raise SystemExit(f"kernel providers {missing} are not installed: {installed}")
    return chosen


def under_kernels(step: Callable, provider: str) -> Callable:
    """``step`` with kernel provider ``provider`` selected while it runs."""
    import everyo as eo

    def run():
        with eo.kernels.use(provider):
            step()
    return run


def time_interleaved(steps: dict, warmup: int, repeats: int, block: int) -> dict:
    """Best ms/step of each of ``steps`` (label -> callable), measured in alternating blocks
    of ``block`` calls so that all see the same machine load."""
    for _ in range(warmup):
        for step in steps.values():
            step()
    best = {label: float("inf") for label in steps}
    for _ in range(repeats):
        for label, step in steps.items():
            best[label] = min(best[label], time_block(step, block))
    return best


def run(cases, quick: bool = False, threads: int | None = None, kernels: str | None = None,
        jax_python: str | None = None) -> list:
    """Measure every case under each kernel selection, against PyTorch (and JAX when
    ``jax_python`` runs it); returns rows ``(name, {label: ms}, target)``."""
    import torch
    from _jax_reference import jax_ms
    from threadpoolctl import threadpool_limits

    threads = threads or os.cpu_count() or 1
    torch.set_num_threads(threads)
    warmup, repeats = (2, 5) if quick else (3, 9)
    providers = kernel_selections(kernels)
    rows = []
    with threadpool_limits(limits=threads):
        for case in cases:
            x, y = case.make_batch(np.random.default_rng(0))
            ref_step = torch_step(case, torch, x, y)
            steps = {p: under_kernels(everyo_step(case, x, y), p) for p in providers}
            steps["PyTorch"] = ref_step
            once = time_block(ref_step, 1)  # ~0.2 s (quick: 0.05 s) per block, >= 1 step
            block = max(1, int((50 if quick else 200) / max(once, 1e-3)))
            best = time_interleaved(steps, warmup, repeats, block)
            jax = jax_ms(jax_python, case.name, threads, quick)
            if jax is not None:
                best["JAX"] = jax
            rows.append((case.name, best, case.target))
            print(format_row(case, best), flush=True)
    return rows


def format_row(case: Case, best: dict) -> str:
    """One line: every timing, then each EveryO selection over the fastest peer."""
    peers = {k: v for k, v in best.items() if k in ("PyTorch", "JAX")}
    ours = {k: v for k, v in best.items() if k not in peers}
    if case.peer == "PyTorch":
        peer_label, peer = "PyTorch", peers["PyTorch"]
    else:
        peer_label, peer = min(peers.items(), key=lambda item: item[1])
    times = "  ".join(f"{k} {v:8.3f}" for k, v in best.items())
    ratios = "  ".join(f"{k}/{peer_label} {v / peer:4.2f}x" for k, v in ours.items())
    if "numpy" in ours and len(ours) > 1:
        ratios += "  " + "  ".join(f"{k}/numpy {v / ours['numpy']:4.2f}x"
                                   for k, v in ours.items() if k != "numpy")
    return f"{case.name:<16} {times} ms/step   {ratios} (target <= {case.target:.1f}x)"


def main(cases=CASES, argv=None) -> list:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer, shorter repetitions")
    parser.add_argument("--threads", type=int, default=None,
                        help="BLAS/PyTorch threads for both (default: all cores)")
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    parser.add_argument("--kernels", default=None,
                        help="kernel providers to time, comma-separated (default: numpy and "
                             "every installed provider)")
    parser.add_argument("--jax-python", default=None,
                        help="a Python with jax[cpu] (default: $EVERYO_BENCH_JAX_PYTHON, else "
                             ".venv-jax/bin/python when it exists); JAX is skipped without one")
    args, _ = parser.parse_known_args(argv)  # run_all.py passes its own flags along
    chosen = [c for c in cases if args.only is None or c.name in args.only]
    import torch
    from _jax_reference import find_jax_python
    from threadpoolctl import threadpool_info

    blas = ", ".join(f"{p.get('internal_api')} {p.get('version')} ({p.get('architecture')})"
                     for p in threadpool_info() if p.get("user_api") == "blas")
    jax_python = find_jax_python(args.jax_python)
    print(f"threads={args.threads or os.cpu_count()}  numpy {np.__version__}  "
          f"torch {torch.__version__}  python {sys.version.split()[0]}  BLAS: {blas}  "
          f"JAX: {jax_python or 'not installed (skipped)'}")
    return run(chosen, quick=args.quick, threads=args.threads, kernels=args.kernels,
               jax_python=jax_python)


if __name__ == "__main__":
    main()
