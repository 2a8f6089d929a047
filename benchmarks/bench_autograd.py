"""Autograd overhead per op, higher-order steps, and `import everyo` time.

Per-op overhead: a chain of 300 tiny elementwise ops on a 4-element tensor, forward and
backward, in EveryO and in PyTorch CPU in the same run (version checks are always on).
Target: <= PyTorch per op (and <= 10 µs).
Higher order, single thread, EveryO against PyTorch in alternating blocks of the same run
(target <= 2x):
- a Hessian-vector product of the cross-entropy loss of mlp_small (64-128-10, batch 64)
  with respect to all its parameters (``eo.grad`` twice, ``create_graph=True``);
- a gradient-penalty training step on the digits CNN (batch 128): cross-entropy plus
  ``10 * mean((|d out / d x|^2 - 1)^2)``, backward through the penalty, SGD update.
Import time: `import everyo` in a fresh interpreter with every plugin installed (target < 0.3 s).

Run: python benchmarks/bench_autograd.py
"""

from __future__ import annotations

import os
import statistics
import subprocess
import sys
import time

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


def alternating(ours, reference, runs: int = 41) -> tuple:
    """µs per op of both, run by run in turn (so both see the same load on a busy machine):
    ``((median, median), (fastest, fastest))``."""
    for _ in range(3):
        ours(), reference()
    times: tuple = ([], [])
    for _ in range(runs):
        for fn, bucket in ((ours, times[0]), (reference, times[1])):
            start = time.perf_counter()
            fn()
            bucket.append((time.perf_counter() - start) / CHAIN * 1e6)
    return ((statistics.median(times[0]), statistics.median(times[1])),
            (min(times[0]), min(times[1])))


def _higher_order_steps(torch):
    """``(label, everyo_step, torch_step)`` for the Hessian-vector product and the penalty."""
    from bench_training import CASES

    cases = {case.name: case for case in CASES}
    mlp, cnn = cases["mlp_small"], cases["cnn_digits"]
    rng = np.random.default_rng(0)

    # -- Hessian-vector product on mlp_small
    x, y = mlp.make_batch(rng)
    model, model_t = mlp.everyo_model(), mlp.torch_model(torch)
    params, params_t = list(model.parameters()), list(model_t.parameters())
    vectors = [rng.standard_normal(p.shape).astype(np.float32) for p in params]
    vectors_t = [torch.from_numpy(np.ascontiguousarray(v.T if v.ndim == 2 else v))
                 for v in vectors]  # torch's Linear weight is (out, in)
    inputs, inputs_t, targets_t = eo.tensor(x), torch.from_numpy(x), torch.from_numpy(y)

    def hvp():
        loss = eo.cross_entropy(model(inputs), y)
        grads = eo.grad(loss, params, create_graph=True)
        dot = grads[0] * vectors[0]
        total = dot.sum()
        for g, v in zip(grads[1:], vectors[1:]):
            total = total + (g * v).sum()
        return eo.grad(total, params)

    def hvp_torch():
        loss = torch.nn.functional.cross_entropy(model_t(inputs_t), targets_t)
        grads = torch.autograd.grad(loss, params_t, create_graph=True)
        total = sum((g * v).sum() for g, v in zip(grads, vectors_t))
        return torch.autograd.grad(total, params_t)

    # -- gradient-penalty step on the digits CNN
    xc, yc = cnn.make_batch(rng)
    cnn_model, cnn_t = cnn.everyo_model(), cnn.torch_model(torch)
    optimizer = eo.SGD(list(cnn_model.parameters()), lr=0.01)
    optimizer_t = torch.optim.SGD(cnn_t.parameters(), lr=0.01)
    xc_t, yc_t = torch.from_numpy(cnn.to_torch_layout(xc)), torch.from_numpy(yc)

    def penalty_step():
        optimizer.zero_grad()
        images = eo.tensor(xc, requires_grad=True)
        out = cnn_model(images)
        (gx,) = eo.grad(out.sum(), images, create_graph=True)
        penalty = (((gx * gx).sum(axis=(1, 2, 3)) - 1.0) ** 2).mean()
        (eo.cross_entropy(out, yc) + penalty * 10.0).backward()
        optimizer.step()

    def penalty_step_torch():
        optimizer_t.zero_grad()
        images = xc_t.clone().requires_grad_(True)
        out = cnn_t(images)
        (gx,) = torch.autograd.grad(out.sum(), images, create_graph=True)
        penalty = (((gx * gx).sum(dim=(1, 2, 3)) - 1.0) ** 2).mean()
        (torch.nn.functional.cross_entropy(out, yc_t) + penalty * 10.0).backward()
        optimizer_t.step()

    return [("Hessian-vector product, mlp_small", hvp, hvp_torch),
            ("gradient-penalty step, cnn_digits", penalty_step, penalty_step_torch)]


def higher_order(torch, quick: bool = False) -> None:
    """Print ms per step of both higher-order workloads and their ratio (target <= 2x)."""
    from bench_training import time_block, time_pair
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1):
        for label, ours, reference in _higher_order_steps(torch):
            once = time_block(reference, 1)
            steps = max(1, int((50 if quick else 200) / max(once, 1e-3)))
            ours_ms, ref_ms = time_pair(ours, reference, 2, 5 if quick else 9, steps)
            print(ratio_line(label, ours_ms, ref_ms, unit="ms", target="(target <= 2x)"),
                  flush=True)


def import_time(repeats: int = 5) -> tuple:
    """Fastest ``import everyo`` with every plugin, and without the kernel provider
    everyo-numba (alternating runs): ``(with, without)`` in seconds."""
    code = "import time; t = time.perf_counter(); import everyo; print(time.perf_counter() - t)"
    without = {**os.environ, "EVERYO_DISABLE_PLUGINS": "everyo_numba"}
    times: tuple = ([], [])
    for _ in range(repeats):
        for env, bucket in ((None, times[0]), (without, times[1])):
            bucket.append(float(subprocess.run([sys.executable, "-c", code], capture_output=True,
                                               text=True, check=True, env=env).stdout))
    return min(times[0]), min(times[1])


def main() -> None:
    torch = torch_or_none()
    if torch is not None:
        torch.set_num_threads(1)
    best = None
    if torch is not None:
        (ours, reference), best = alternating(everyo_step, lambda: torch_step(torch))
    else:
        ours, reference = best_of(everyo_step, repeats=15) / CHAIN * 1e6, None
    print(f"{'benchmark':<28} {'EveryO':>13}  {'PyTorch CPU':>13}  {'ratio':>7}")
    print(ratio_line("autograd overhead per op", ours, reference,
                     target="(target <= PyTorch and <= 10 µs)"))
    if best is not None:  # the fastest run of each: what the code costs, load aside
        print(ratio_line("  same, fastest of 41 runs", *best))
    if torch is not None:
        higher_order(torch, quick="--quick" in sys.argv)
    plugins = len(eo.plugins.host.plugins)
    with_provider, without = import_time()
    print(f"{'import everyo':<28} {with_provider * 1000:10.1f} ms  "
          f"({plugins} plugins loaded; target < 300 ms); without everyo-numba "
          f"{without * 1000:.1f} ms")


if __name__ == "__main__":
    main()
