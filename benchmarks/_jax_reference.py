"""JAX as an optional benchmark reference: the training steps of bench_training.py,
bench_sequence.py and bench_layers.py as one ``jax.jit`` program each, on the CPU.

JAX is never a dependency. It lives in its own environment (``python3 -m venv .venv-jax &&
.venv-jax/bin/pip install 'jax[cpu]'``); the benchmarks find it through ``--jax-python``,
``$EVERYO_BENCH_JAX_PYTHON`` or ``.venv-jax/bin/python`` and run this file with it in a
subprocess, which prints the best ms per step. Without one, JAX is skipped.

    .venv-jax/bin/python benchmarks/_jax_reference.py --case cnn_cifar --threads 1
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
ENV_VARIABLE = "EVERYO_BENCH_JAX_PYTHON"


def find_jax_python(given: str | None = None) -> str | None:
    """A Python that imports JAX: ``given``, ``$EVERYO_BENCH_JAX_PYTHON`` or ``.venv-jax``."""
    for candidate in (given, os.environ.get(ENV_VARIABLE), str(ROOT / ".venv-jax/bin/python")):
        if candidate and Path(candidate).exists():
            probe = subprocess.run([candidate, "-c", "import jax"], capture_output=True,
                                   timeout=120)
            if probe.returncode == 0:
                return candidate
    return None


def jax_ms(python: str | None, case: str, threads: int, quick: bool) -> float | None:
    """Best ms/step of JAX on ``case`` (None: no JAX, or a case this file does not model)."""
    if python is None or case not in CASE_NAMES:
        return None
    env = {**os.environ}
    if threads == 1:  # one intra-op thread, as --threads 1 gives the others
        env["XLA_FLAGS"] = (env.get("XLA_FLAGS", "") + " --xla_cpu_multi_thread_eigen=false "
                            "intra_op_parallelism_threads=1").strip()
    command = [python, __file__, "--case", case, "--threads", str(threads)]
    result = subprocess.run(command + (["--quick"] if quick else []), capture_output=True,
                            text=True, env=env, timeout=1800)
    if result.returncode != 0:
        print(f"  (JAX failed on {case}: {result.stderr.strip().splitlines()[-1:]})")
        return None
    return json.loads(result.stdout.strip().splitlines()[-1])["ms"]


CASE_NAMES = ("mlp_small", "mlp_large", "cnn_digits", "cnn_cifar", "lstm", "transformer")


# -- everything below runs inside the JAX environment ------------------------------------------

def _init(key, shape, fan_in):
    import jax

    bound = 1.0 / fan_in ** 0.5
    return jax.random.uniform(key, shape, minval=-bound, maxval=bound)


def _linear(key, a, b):
    import jax

    k1, k2 = jax.random.split(key)
    return {"w": _init(k1, (a, b), a), "b": _init(k2, (b,), a)}


def _cross_entropy(logits, y):
    import jax
    import jax.numpy as jnp

    logp = jax.nn.log_softmax(logits, axis=-1)
    return -jnp.mean(jnp.take_along_axis(logp, y[:, None], axis=-1))


def _mlp(sizes):
    import jax

    def build(key):
        keys = jax.random.split(key, len(sizes) - 1)
        return [_linear(k, a, b) for k, a, b in zip(keys, sizes[:-1], sizes[1:])]

    def forward(params, x):
        for i, layer in enumerate(params):
            x = x @ layer["w"] + layer["b"]
            if i < len(params) - 1:
                x = jax.nn.relu(x)
        return x

    return build, forward


def _cnn(cin, c1, c2, side):
    import jax

    def conv(key, a, b):
        k1, k2 = jax.random.split(key)
        return {"w": _init(k1, (3, 3, a, b), 9 * a), "b": _init(k2, (b,), 9 * a)}

    def build(key):
        k1, k2, k3 = jax.random.split(key, 3)
        return [conv(k1, cin, c1), conv(k2, c1, c2), _linear(k3, (side // 4) ** 2 * c2, 10)]

    def forward(params, x):
        for layer in params[:2]:
            x = jax.lax.conv_general_dilated(x, layer["w"], (1, 1), "SAME",
                                             dimension_numbers=("NHWC", "HWIO", "NHWC"))
            x = jax.nn.relu(x + layer["b"])
            x = jax.lax.reduce_window(x, -jax.numpy.inf, jax.lax.max, (1, 2, 2, 1),
                                      (1, 2, 2, 1), "VALID")
        x = x.reshape(x.shape[0], -1)
        return x @ params[2]["w"] + params[2]["b"]

    return build, forward


def _lstm(features, hidden):
    import jax
    import jax.numpy as jnp

    def build(key):
        k1, k2, k3, k4 = jax.random.split(key, 4)
        return {"w_ih": _init(k1, (features, 4 * hidden), hidden),
                "w_hh": _init(k2, (hidden, 4 * hidden), hidden),
                "b": _init(k3, (4 * hidden,), hidden), "head": _linear(k4, hidden, 10)}

    def forward(params, x):
        projected = jnp.einsum("btf,fg->tbg", x, params["w_ih"]) + params["b"]

        def cell(state, pre):
            h, c = state
            gates = pre + h @ params["w_hh"]
            i, f, g, o = jnp.split(gates, 4, axis=-1)
            c = jax.nn.sigmoid(f) * c + jax.nn.sigmoid(i) * jnp.tanh(g)
            h = jax.nn.sigmoid(o) * jnp.tanh(c)
            return (h, c), None

        zeros = jnp.zeros((x.shape[0], hidden))
        (h, _), _ = jax.lax.scan(cell, (zeros, zeros), projected)
        return h @ params["head"]["w"] + params["head"]["b"]

    return build, forward


def _transformer(d, heads, ff):
    import jax
    import jax.numpy as jnp

    def norm(x, p):
        mean = x.mean(-1, keepdims=True)
        var = ((x - mean) ** 2).mean(-1, keepdims=True)
        return (x - mean) / jnp.sqrt(var + 1e-5) * p["g"] + p["b"]

    def build(key):
        keys = jax.random.split(key, 4)
        return {"qkv": _linear(keys[0], d, 3 * d), "out": _linear(keys[1], d, d),
                "ff1": _linear(keys[2], d, ff), "ff2": _linear(keys[3], ff, d),
                "n1": {"g": jnp.ones(d), "b": jnp.zeros(d)},
                "n2": {"g": jnp.ones(d), "b": jnp.zeros(d)}}

    def forward(params, x, key):
        b, t, _ = x.shape
        k1, k2, k3 = jax.random.split(key, 3)

        def dropout(k, v):
            keep = jax.random.bernoulli(k, 0.9, v.shape)
            return jnp.where(keep, v / 0.9, 0.0)

        qkv = (x @ params["qkv"]["w"] + params["qkv"]["b"]).reshape(b, t, 3, heads, d // heads)
        q, k, v = (qkv[:, :, i].transpose(0, 2, 1, 3) for i in range(3))
        scores = jax.nn.softmax(q @ k.transpose(0, 1, 3, 2) / (d // heads) ** 0.5, axis=-1)
        attn = (dropout(k1, scores) @ v).transpose(0, 2, 1, 3).reshape(b, t, d)
        x = norm(x + dropout(k2, attn @ params["out"]["w"] + params["out"]["b"]), params["n1"])
        hidden = jax.nn.relu(x @ params["ff1"]["w"] + params["ff1"]["b"])
        return norm(x + dropout(k3, hidden @ params["ff2"]["w"] + params["ff2"]["b"]),
                    params["n2"])

    return build, forward


def _model(case: str):
    """``(build, forward, batch shape, target kind)`` of a benchmark case."""
    return {
        "mlp_small": (*_mlp([64, 128, 10]), (64, 64), "classes"),
        "mlp_large": (*_mlp([1024, 2048, 2048, 10]), (256, 1024), "classes"),
        "cnn_digits": (*_cnn(1, 16, 32, 8), (128, 8, 8, 1), "classes"),
        "cnn_cifar": (*_cnn(3, 32, 64, 32), (64, 32, 32, 3), "classes"),
        "lstm": (*_lstm(32, 128), (32, 32, 32), "classes"),
        "transformer": (*_transformer(128, 4, 256), (16, 64, 128), "regression"),
    }[case]


def _measure(case: str, quick: bool) -> float:
    import jax
    import jax.numpy as jnp
    import numpy as np

    build, forward, shape, target = _model(case)
    rng = np.random.default_rng(0)
    x = jnp.asarray(rng.standard_normal(shape).astype(np.float32))
    if target == "classes":
        y = jnp.asarray(rng.integers(0, 10, shape[0]))

        def loss_fn(params, x, y, key):
            return _cross_entropy(forward(params, x), y)
    else:
        y = jnp.asarray(rng.standard_normal(shape).astype(np.float32))

        def loss_fn(params, x, y, key):
            return jnp.mean((forward(params, x, key) - y) ** 2)

    @jax.jit
    def step(params, x, y, key):
        grads = jax.grad(loss_fn)(params, x, y, key)
        return jax.tree_util.tree_map(lambda p, g: p - 0.01 * g, params, grads)

    params = build(jax.random.PRNGKey(0))
    key = jax.random.PRNGKey(1)
    params = jax.block_until_ready(step(params, x, y, key))  # compile
    start = time.perf_counter()
    params = jax.block_until_ready(step(params, x, y, key))
    once = time.perf_counter() - start
    block = max(1, int((0.05 if quick else 0.2) / max(once, 1e-6)))
    best = float("inf")
    for _ in range(5 if quick else 9):
        start = time.perf_counter()
        for _ in range(block):
            params = step(params, x, y, key)
        jax.block_until_ready(params)
        best = min(best, (time.perf_counter() - start) / block * 1e3)
    return best


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--case", required=True, choices=CASE_NAMES)
    parser.add_argument("--threads", type=int, default=1)
    parser.add_argument("--quick", action="store_true")
    args = parser.parse_args()
    if args.threads == 1 and hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {sorted(os.sched_getaffinity(0))[0]})  # pinned to one core
    print(json.dumps({"case": args.case, "ms": _measure(args.case, args.quick)}))


if __name__ == "__main__":
    main()
