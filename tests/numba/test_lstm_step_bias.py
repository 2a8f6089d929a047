"""``lstm_forward_steps`` with its ``bias`` argument: everyo-numba adds the bias inside each
step (``(acts + bias) + product``) where the reference adds it to every step first; both must
give the same bits (bound: 0 ulps, as the rest of the LSTM loops, see
test_recurrent_kernels.py), and the provider must really run (not decline to the reference).
"""

from __future__ import annotations

import numpy as np
import pytest
from threadpoolctl import threadpool_limits

import everyo as eo

pytest.importorskip("numba", reason="everyo-numba's kernels need Numba")

PROVIDER = eo.registry("kernels").providers().get("numba")
pytestmark = pytest.mark.skipif(PROVIDER is None, reason="everyo-numba is not installed")

SHAPES = [(32, 32, 128), (5, 1, 17), (3, 7, 5)]  # (steps, batch, hidden)


def _arguments(rng, steps, batch, hidden, dtype):
    acts = (rng.standard_normal((steps, batch, 4 * hidden)) * 0.7).astype(dtype)
    w = (rng.standard_normal((hidden, 4 * hidden)) * 0.6 / np.sqrt(hidden)).astype(dtype)
    hs = np.zeros((steps + 2, batch, hidden), dtype)
    cs = np.zeros((steps + 1, batch, hidden), dtype)
    hs[0] = rng.standard_normal((batch, hidden)).astype(dtype)
    cs[0] = rng.standard_normal((batch, hidden)).astype(dtype)
    # (a bias of large and small entries, so that its rounding against the projection and
    # the product shows in the last bits when the additions' order changes)
    bias = (rng.standard_normal(4 * hidden) * 10.0 ** rng.integers(-3, 2, 4 * hidden))
    return acts, w, hs, cs, np.zeros((steps, batch, hidden), dtype), bias.astype(dtype)


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("shape", SHAPES, ids=lambda s: "x".join(map(str, s)))
def test_the_step_bias_gives_the_reference_bits(shape, dtype):
    def run(selection):
        arguments = _arguments(np.random.default_rng(5), *shape, dtype)
        with eo.kernels.use(selection), threadpool_limits(1):
            assert eo.kernels.kernel.lstm_forward_steps(*arguments) is None
        return arguments[:5]

    expected, got = run("numpy"), run("numba")
    for name, a, b in zip(("acts", "w", "hs", "cs", "tanh_c"), got, expected):
        bits = np.dtype(f"u{a.dtype.itemsize}")
        differ = np.count_nonzero(a.view(bits) != b.view(bits))
        assert differ == 0, f"{name}: {differ} of {a.size} elements differ"


def test_the_step_bias_matters_and_the_provider_runs_it():
    arguments = _arguments(np.random.default_rng(0), 4, 3, 6, np.float32)
    without = tuple(a.copy() for a in arguments[:5])
    assert PROVIDER.resolve("lstm_forward_steps")(*arguments) is None
    PROVIDER.resolve("lstm_forward_steps")(*without)
    assert not np.array_equal(arguments[2], without[2])  # (the bias reached the states)


def test_a_bias_of_another_dtype_goes_to_the_reference():
    arguments = _arguments(np.random.default_rng(0), 4, 3, 6, np.float32)
    wider = arguments[:5] + (arguments[5].astype(np.float64),)
    assert PROVIDER.resolve("lstm_forward_steps")(*wider) is NotImplemented
