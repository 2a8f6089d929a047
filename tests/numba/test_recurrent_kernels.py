"""everyo-numba's LSTM time loops give the NumPy reference's bits (float32 and float64).

Bound: 0 ulps. The compiled passes do the reference's operations in its order (no fastmath, no
fused multiply-add) and both call the same BLAS for the per-step GEMM, so at a given BLAS
thread count the two agree bit for bit; float16/bfloat16 are left to the reference (the
provider returns NotImplemented). The shapes are the benchmarks' (batch 32, hidden 128) and
odd ones (hidden sizes that are no multiple of the SIMD width, batch 1), with the output
gradient and the transposed hidden weight as the layer hands them over (strided views) and
contiguous.

The shared table (``support.kernel_cases``) checks the same bits on every layout and dtype
of its small shapes; this file checks them on the shapes that exercise the vectorised loops, at
one and two BLAS threads, and the whole layer (forward and every gradient) under both kernel
selections.
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import everyo as eo
from support.lstm_arguments import lstm_forward_arguments

pytest.importorskip("numba", reason="everyo-numba's kernels need Numba")

REGISTRY = eo.registry("kernels")
PROVIDER = REGISTRY.providers().get("numba")
pytestmark = pytest.mark.skipif(PROVIDER is None, reason="everyo-numba is not installed")

SHAPES = [(32, 32, 128), (5, 1, 17), (3, 7, 5), (4, 2, 33)]  # (steps, batch, hidden)


def _same_bits(a: np.ndarray, b: np.ndarray, where: str) -> None:
    assert a.shape == b.shape and a.dtype == b.dtype, where
    bits = np.dtype(f"u{a.dtype.itemsize}")
    mismatched = np.count_nonzero(a.view(bits) != b.view(bits))
    assert mismatched == 0, f"{where}: {mismatched} of {a.size} elements differ"


def _backward_arguments(rng, forward, strided: bool):
    acts, w, hs, cs, tanh_c = forward
    steps, batch, hidden = tanh_c.shape
    g = rng.standard_normal((batch, steps + 1, hidden)).astype(acts.dtype)
    gt = g.transpose(1, 0, 2) if strided else np.ascontiguousarray(g.transpose(1, 0, 2))
    w_hh_t = w.T if strided else np.ascontiguousarray(w.T)  # (the op hands over a view)
    return (gt, acts, cs, tanh_c, w_hh_t, np.array(gt[steps]),
            np.zeros(acts.shape, acts.dtype), np.zeros(tanh_c.shape, acts.dtype))


@pytest.mark.parametrize("threads", [1, 2])
@pytest.mark.parametrize("strided", [True, False], ids=["views", "contiguous"])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_lstm_loops_give_the_reference_bits(shape, dtype, strided, threads):
    def run(selection):
        rng = np.random.default_rng(3)
        forward = lstm_forward_arguments(rng, *shape, dtype)
        with eo.kernels.use(selection):
            eo.kernels.kernel.lstm_forward_steps(*forward)
            backward = _backward_arguments(rng, forward, strided)
            dh = eo.kernels.kernel.lstm_backward_steps(*backward)
        # (the last backward argument is scratch: its contents are left open)
        return forward + (dh,) + backward[5:7]

    with threadpool_limits(threads):
        expected, got = run("numpy"), run("numba")
    names = ("acts", "w", "hs", "cs", "tanh_c", "dh0", "dc0", "d_pre")
    for name, a, b in zip(names, got, expected):
        _same_bits(a, b, name)


def test_the_provider_really_runs_on_these_arguments():
    # NOTE: the bit-for-bit test above would pass trivially if the provider declined (returned
    # NotImplemented, so that the reference ran twice).
    rng = np.random.default_rng(0)
    forward = lstm_forward_arguments(rng, 3, 2, 5, np.float32)
    assert PROVIDER.resolve("lstm_forward_steps")(*forward) is None
    dh = PROVIDER.resolve("lstm_backward_steps")(*_backward_arguments(rng, forward, True))
    assert isinstance(dh, np.ndarray) and dh.shape == (2, 5)


@pytest.mark.parametrize("bidirectional", [False, True])
def test_the_lstm_layer_gives_the_same_bits_under_both_selections(bidirectional):
    x = np.random.default_rng(1).standard_normal((6, 9, 4)).astype(np.float32)

    def run(selection):
        layer = eo.LSTM(4, 12, num_layers=2, bidirectional=bidirectional, seed=0)
        inputs = eo.tensor(x, requires_grad=True)
        with eo.kernels.use(selection), threadpool_limits(1):
            out = layer(inputs)
            (out * out).sum().backward()
        return [out.data, inputs.grad] + [p.grad for p in layer.parameters()]

    expected, got = run("numpy"), run("numba")
    assert len(got) == len(expected) == 2 + 2 * 4 * (2 if bidirectional else 1)
    for index, (a, b) in enumerate(zip(got, expected)):
        _same_bits(a, b, f"result {index}")
