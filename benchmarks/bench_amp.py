"""Mixed precision on the CPU: an autocast training step against the float32 step, and the
memory the graph keeps for backward.

Models:
  mlp_large  Linear 1024-2048-2048-10, ReLU, batch 256
  cnn_cifar  NHWC 32x32x3: Conv 3x3 32 - MaxPool 2 - Conv 3x3 64 - MaxPool 2 - Linear 10, batch 64

A step is zero_grad + forward + cross-entropy + backward + SGD step. The float16 step runs the
forward under ``eo.autocast()`` and goes through ``eo.GradScaler`` (as a user would); the
bfloat16 step runs it under ``eo.autocast(dtype="bfloat16")`` without a scaler (bfloat16 has
float32's range, so it needs none). Each figure is the median of several steps after a warm-up,
as wall-clock and as process CPU time; the reference (the float32 step) is measured in the same
run, its steps interleaved with the others' (so load drift hits all alike), and the ratio
printed. Targets: step ratio <= 1.6 (float16) and <= 1.3 (bfloat16),
activation memory <= 0.6 for both.

Memory is measured two ways:
  * graph-saved bytes: every array the recorded ops keep for backward, counted once per buffer.
    "activations" are those derived from the batch; "weight copies" are 16-bit casts of the
    float32 parameters (autocast only; they are freed with the graph);
  * tracemalloc peak of one forward + backward (includes every temporary, e.g. the float32
    operands 16-bit matmuls convert to before calling BLAS).

Also measured: what casting every weight to float16 once costs, relative to one autocast step.
That is the most a per-region cache of weight casts could save (see docs/mixed_precision.md).

``--cast-nodes`` adds, in the same interleaved run, the 16-bit steps with autocast's folded
weight casts switched off (every weight through a cast node, as before they existed): an A/B
of that change on the same heap and load.

Every measurement runs once per kernel provider (``numpy``, the references, and each installed
one; ``--kernels`` picks), the ratios within one provider.

Run:  python benchmarks/bench_amp.py [--repeats N] [--model mlp_large|cnn_cifar] [--cast-nodes]
      [--kernels numpy,numba]
"""

from __future__ import annotations

import argparse
import gc
import os
import statistics
import sys
import time
import tracemalloc

import numpy as np

import everyo as eo
import everyo_amp.autocast_mode as autocast_mode

sys.path.insert(0, os.path.dirname(__file__))

from bench_training import kernel_selections


def mlp_large() -> tuple:
    model = eo.Sequential(eo.Linear(1024, 2048, seed=0), eo.ReLU(), eo.Linear(2048, 2048, seed=1),
                          eo.ReLU(), eo.Linear(2048, 10, seed=2))
    rng = np.random.default_rng(0)
    x = eo.tensor(rng.standard_normal((256, 1024)).astype(np.float32))
    y = eo.tensor(rng.integers(0, 10, 256))
    return model, x, y


def cnn_cifar() -> tuple:
    model = eo.Sequential(
        eo.Conv2D(3, 32, 3, padding="same", seed=0), eo.ReLU(), eo.MaxPool2D(2),
        eo.Conv2D(32, 64, 3, padding="same", seed=1), eo.ReLU(), eo.MaxPool2D(2),
        eo.Flatten(), eo.Linear(8 * 8 * 64, 10, seed=2))
    rng = np.random.default_rng(0)
    x = eo.tensor(rng.standard_normal((64, 32, 32, 3)).astype(np.float32))
    y = eo.tensor(rng.integers(0, 10, 64))
    return model, x, y


MODELS = {"mlp_large": mlp_large, "cnn_cifar": cnn_cifar}


#: how each step runs: autocast's lower dtype (None: float32) and whether a GradScaler is used
PRECISIONS = {"float32": (None, False), "float16": ("float16", True),
              "bfloat16": ("bfloat16", False)}
TARGETS = {"float16": 1.6, "bfloat16": 1.3}
#: suffix of the --cast-nodes variants (weight casts not folded into the products)
UNFOLDED = " (cast nodes)"


def make_step(model, x, y, precision: str):
    dtype, scaled = PRECISIONS[precision.removesuffix(UNFOLDED)]
    fold = not precision.endswith(UNFOLDED)
    optimizer = eo.SGD(list(model.parameters()), lr=1e-3)
    scaler = eo.GradScaler(init_scale=2.0**10) if scaled else None

    def step():
        autocast_mode.FOLD_WEIGHT_CASTS = fold
        optimizer.zero_grad()
        with eo.autocast(enabled=dtype is not None, dtype=dtype):
            logits = model(x)
        loss = eo.cross_entropy(logits, y)
        if scaler is None:
            loss.backward()
            optimizer.step()
        else:
            scaler.backward(loss)
            scaler.step(optimizer)
            scaler.update()
        autocast_mode.FOLD_WEIGHT_CASTS = True

    return step


def interleaved_median_times(fns: dict, repeats: int) -> dict:
    """``median_times`` of several functions, their calls taken in turn, the order rotated
    every round (a, b, c, b, c, a, c, a, b...).

    NOTE: on a shared machine the load drifts over a run; interleaving exposes every variant
    to the same drift, so their ratios stay meaningful when the absolute times do not. The
    rotation gives each variant every position: a step's time depends on what ran before it
    (a step allocates and frees arrays of 8-25 MB, and whether the allocator hands back fresh
    pages, at a page fault each, depends on the heap's history).
    """
    for fn in fns.values():
        fn()  # warm-up
    walls: dict = {name: [] for name in fns}
    cpus: dict = {name: [] for name in fns}
    names = list(fns)
    for turn in range(repeats):
        for name in names[turn % len(names):] + names[:turn % len(names)]:
            fn = fns[name]
            gc.collect()
            wall, cpu = time.perf_counter(), time.process_time()
            fn()
            cpus[name].append(time.process_time() - cpu)
            walls[name].append(time.perf_counter() - wall)
    return {name: (statistics.median(walls[name]), statistics.median(cpus[name]))
            for name in fns}


def median_times(fn, repeats: int) -> tuple[float, float]:
    """Median wall-clock and median process CPU time of ``fn()``, after one warm-up call.

    NOTE: the CPU time (all threads of this process) is the steadier figure when other jobs
    share the machine: it counts the work done, not the time spent waiting for a core.
    """
    fn()  # warm-up: first-touch page faults, BLAS thread start
    walls, cpus = [], []
    for _ in range(repeats):
        gc.collect()
        wall, cpu = time.perf_counter(), time.process_time()
        fn()
        cpus.append(time.process_time() - cpu)
        walls.append(time.perf_counter() - wall)
    return statistics.median(walls), statistics.median(cpus)


def _root(array: np.ndarray):
    """The object owning ``array``'s memory (views count once, with their owner)."""
    owner = array
    while getattr(owner, "base", None) is not None:
        owner = owner.base
    return owner


def _arrays(saved):
    if isinstance(saved, np.ndarray):
        yield saved
    elif isinstance(saved, (tuple, list)):
        for item in saved:
            yield from _arrays(item)


def _held_rounded_weight(op):
    """The rounded float32 weight a folded product keeps for backward (see MatMul), or None."""
    if getattr(op, "attrs", {}).get("lower") is None or not isinstance(op.saved, tuple):
        return None
    return op.saved[2] if len(op.saved) == 3 else None


def graph_saved_bytes(root: eo.Tensor, params) -> dict:
    """Bytes the graph under ``root`` keeps for backward: activations and weight copies."""
    param_buffers = {id(_root(p.data)) for p in params}
    weight_copies: set[int] = set()
    ops, stack, seen = [], [root._ctx], set()
    while stack:
        op = stack.pop()
        if op is None or id(op) in seen:
            continue
        seen.add(id(op))
        ops.append(op)
        for parent in op.parents:
            ctx = parent._ctx
            # the output of a cast whose input is a parameter: a 16-bit weight copy
            if ctx is not None and type(ctx).__name__ == "Cast" and \
                    id(_root(ctx.parents[0].data)) in param_buffers:
                weight_copies.add(id(_root(parent.data)))
            stack.append(ctx)
    counted: dict[int, int] = {}
    kinds = {"activations": 0, "weight copies": 0, "held float32 weights": 0}
    for op in ops:
        held = _held_rounded_weight(op)
        for array in _arrays(op.saved):
            owner = _root(array)
            key = id(owner)
            if key in counted or key in param_buffers:
                continue
            size = owner.nbytes if isinstance(owner, np.ndarray) else array.nbytes
            counted[key] = size
            kind = "weight copies" if key in weight_copies else "activations"
            kinds["held float32 weights" if array is held else kind] += size
    return kinds


def memory(model, x, y, precision: str) -> dict:
    dtype = PRECISIONS[precision][0]
    params = list(model.parameters())
    with eo.autocast(enabled=dtype is not None, dtype=dtype):
        logits = model(x)
    loss = eo.cross_entropy(logits, y)
    saved = graph_saved_bytes(loss, params)
    del logits, loss
    model.zero_grad()
    gc.collect()
    tracemalloc.start()
    with eo.autocast(enabled=dtype is not None, dtype=dtype):
        logits = model(x)
    loss = eo.cross_entropy(logits, y)
    loss.backward()
    _, peak = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    model.zero_grad()
    saved["tracemalloc peak"] = peak
    return saved


def weight_cast_time(model, dtype: str, repeats: int) -> float:
    arrays = [p.data for p in model.parameters()]
    return median_times(lambda: [a.astype(dtype) for a in arrays], repeats)[1]


def run(name: str, repeats: int, cast_nodes: bool = False) -> None:
    model, x, y = MODELS[name]()
    # NOTE: memory first, on a fresh process state, so that the timing loops' leftovers
    # (allocator caches, the last graph) do not shift the traced peak.
    mem = {p: memory(model, x, y, p) for p in PRECISIONS}
    # NOTE: one model per precision, so that each step sees the weights its own loop trains.
    variants = list(PRECISIONS) + ([p + UNFOLDED for p in TARGETS] if cast_nodes else [])
    steps = {p: make_step(*MODELS[name](), p) for p in variants}
    times = interleaved_median_times(steps, repeats)
    mb = 2.0**20
    (wall32, cpu32), act32 = times["float32"], mem["float32"]["activations"]
    peak32 = mem["float32"]["tracemalloc peak"]
    print(f"{name}: float32 step {wall32 * 1e3:.1f} ms wall, {cpu32 * 1e3:.1f} ms CPU; "
          f"graph-saved activations {act32 / mb:.2f} MiB; tracemalloc peak {peak32 / mb:.2f} MiB")
    for precision, target in TARGETS.items():
        (wall, cpu), used = times[precision], mem[precision]
        scaler = " + GradScaler" if PRECISIONS[precision][1] else ""
        print(f"  {precision}{scaler}")
        print(f"    training step, wall  {wall * 1e3:8.1f} ms   ratio {wall / wall32:.2f}x  "
              f"(target <= {target}x)")
        print(f"    training step, CPU   {cpu * 1e3:8.1f} ms   ratio {cpu / cpu32:.2f}x")
        act = used["activations"]
        print(f"    graph-saved activations {act / mb:7.2f} MiB   ratio {act / act32:.2f}x  "
              f"(target <= 0.6x)")
        both = act + used["weight copies"] + used["held float32 weights"]
        print(f"    + 16-bit weight copies  {used['weight copies'] / mb:7.2f} MiB   "
              f"+ held float32 weights {used['held float32 weights'] / mb:6.2f} MiB   "
              f"activations+copies ratio {both / act32:.2f}x")
        peak = used["tracemalloc peak"]
        print(f"    tracemalloc peak fwd+bwd {peak / mb:7.2f} MiB   ratio {peak / peak32:.2f}x")
        cast = weight_cast_time(model, precision, repeats)
        print(f"    casting all weights to {precision} once: {cast * 1e3:.1f} ms CPU "
              f"= {cast / cpu:.0%} of the step")
        if cast_nodes:
            wall_c, cpu_c = times[precision + UNFOLDED]
            print(f"    same step, weights through cast nodes: wall {wall_c * 1e3:.1f} ms "
                  f"ratio {wall_c / wall32:.2f}x, CPU {cpu_c * 1e3:.1f} ms ratio "
                  f"{cpu_c / cpu32:.2f}x")


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="autocast vs float32 training step")
    parser.add_argument("--repeats", type=int, default=21)
    parser.add_argument("--model", choices=sorted(MODELS), action="append")
    parser.add_argument("--cast-nodes", action="store_true",
                        help="also time the 16-bit steps without folded weight casts")
    parser.add_argument("--kernels", default=None,
                        help="kernel providers to run under, comma-separated (default: numpy "
                             "and every installed provider)")
    args = parser.parse_args(argv)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())} at start")
    for provider in kernel_selections(args.kernels):
        print(f"\n== kernels: {provider}")
        with eo.kernels.use(provider):
            for name in args.model or ["mlp_large", "cnn_cifar"]:
                run(name, args.repeats, args.cast_nodes)
    print(f"load average {' '.join(f'{v:.2f}' for v in os.getloadavg())} at end")


if __name__ == "__main__":
    main()
