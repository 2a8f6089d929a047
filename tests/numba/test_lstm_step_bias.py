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
from support.lstm_arguments import lstm_forward_arguments

pytest.importorskip("numba", reason="everyo-numba's kernels need Numba")

PROVIDER = eo.registry("kernels").providers().get("numba")
pytestmark = pytest.mark.skipif(PROVIDER is None, reason="everyo-numba is not installed")

SHAPES = [(32, 32, 128), (5, 1, 17), (3, 7, 5)]  # (steps, batch, hidden)


def _arguments(rng, steps, batch, hidden, dtype):
    forward = lstm_forward_arguments(rng, steps, batch, hidden, dtype)
    # (a bias of large and small entries, so that its rounding against the projection and
    # the product shows in the last bits when the additions' order changes)
    bias = (rng.standard_normal(4 * hidden) * 10.0 ** rng.integers(-3, 2, 4 * hidden))
    return forward + (bias.astype(dtype),)


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


# --- the per-step hidden product in row blocks (everyo_numba.recurrent._block_rows) ---------

def _recurrent():
    from everyo_numba import recurrent  # (the provider's module: only with Numba installed)
    return recurrent


@pytest.mark.parametrize("shape", [(32, 128), (64, 128), (32, 64), (5, 17)])
def test_the_blocked_hidden_product_has_the_one_call_bits_whenever_chosen(shape):
    recurrent = _recurrent()
    batch, hidden = shape
    rng = np.random.default_rng(2)
    for w_shape, h_shape in (((hidden, 4 * hidden), (batch, hidden)),
                             ((4 * hidden, hidden), (batch, 4 * hidden))):
        w = rng.standard_normal(w_shape).astype(np.float32)
        h = rng.standard_normal(h_shape).astype(np.float32)
        with threadpool_limits(1):
            rows = recurrent._block_rows(h, w)
            whole, blocked = np.empty((2, batch, w.shape[1]), np.float32)
            recurrent._hidden_product(h, w, whole, 0)
            recurrent._hidden_product(h, w, blocked, rows)
        assert rows in (0, recurrent._PROBE_ROWS)
        assert np.array_equal(whole.view(np.uint32), blocked.view(np.uint32))


def test_the_probe_refuses_blocks_that_change_the_bits(monkeypatch):
    recurrent = _recurrent()
    honest = recurrent._hidden_product

    def one_ulp_off(h, w, out, rows):
        honest(h, w, out, rows)
        if rows:
            out[0, 0] = np.nextafter(out[0, 0], np.inf)

    monkeypatch.setattr(recurrent, "_hidden_product", one_ulp_off)
    w = np.ones((128, 512), np.float32)
    assert recurrent._probe_block_rows(32, w) == 0


def test_the_probe_refuses_blocks_that_are_slower(monkeypatch):
    recurrent = _recurrent()
    honest = recurrent._hidden_product

    def slow_blocks(h, w, out, rows):
        honest(h, w, out, rows)
        if rows:
            honest(h, w, out, 0)  # (the same bits, twice the work)
            honest(h, w, out, 0)

    monkeypatch.setattr(recurrent, "_hidden_product", slow_blocks)
    assert recurrent._probe_block_rows(32, np.ones((128, 512), np.float32)) == 0
    assert recurrent._probe_block_rows(recurrent._PROBE_ROWS, np.ones((4, 16), np.float32)) == 0


def test_mixed_dtype_products_stay_one_call(monkeypatch):
    recurrent = _recurrent()
    monkeypatch.setattr(recurrent, "_probe_block_rows", lambda batch, w: recurrent._PROBE_ROWS)
    monkeypatch.setattr(recurrent, "_BLOCK_ROWS", {})
    w = np.ones((128, 512), np.float32)
    assert recurrent._block_rows(np.ones((32, 128), np.float64), w) == 0
    assert recurrent._block_rows(np.ones((32, 128), np.float32), w) == recurrent._PROBE_ROWS


def test_a_weight_laid_out_unlike_the_probe_stays_one_call(monkeypatch):
    """The probe multiplies C-ordered operands; a column-major weight (BLAS's other transpose
    flag) can give other bits in 8-row calls (measured: hidden 32), so a probe's yes must not
    reach it: the provider keeps the reference's bits whatever the timing said."""
    recurrent = _recurrent()
    monkeypatch.setattr(recurrent, "_probe_block_rows", lambda batch, w: recurrent._PROBE_ROWS)
    monkeypatch.setattr(recurrent, "_BLOCK_ROWS", {})

    def run(selection):
        acts, w, hs, cs, tanh_c, bias = _arguments(np.random.default_rng(7), 6, 32, 32,
                                                   np.float64)
        with eo.kernels.use(selection), threadpool_limits(1):
            eo.kernels.kernel.lstm_forward_steps(acts, np.asfortranarray(w), hs, cs, tanh_c,
                                                 bias)
        return hs

    expected, got = run("numpy"), run("numba")
    assert np.array_equal(got.view(np.uint64), expected.view(np.uint64))
    assert recurrent._block_rows(np.ones((32, 32)), np.asfortranarray(np.ones((32, 128)))) == 0
    assert recurrent._block_rows(np.ones((32, 32)).T, np.ones((32, 128))) == 0
