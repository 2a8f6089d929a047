"""everyo-numba's norm kernels beyond the shared table (``support/kernel_cases.py``): rows long
enough for the SIMD-lane sums and position counts that leave a tail, the parameters' gradients
against float64 over many positions, partial ``needs``, and results that own their memory."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.kernel_cases import ULPS

pytest.importorskip("numba", reason="everyo-numba's kernels need Numba")

REGISTRY = eo.registry("kernels")
PROVIDER = REGISTRY.providers().get("numba")
pytestmark = pytest.mark.skipif(PROVIDER is None, reason="everyo-numba is not installed")


def _numba(name):
    return PROVIDER.resolve(name)


def _normwise_ulps(got, expected) -> float:
    """``got``'s largest distance from ``expected``, in eps of its dtype times its magnitude."""
    expected64 = np.asarray(expected, np.float64)
    scale = np.max(np.abs(expected64)) * np.finfo(got.dtype).eps
    return float(np.max(np.abs(got.astype(np.float64) - expected64)) / scale)


def _input(shape, dtype, offset=1000.0, seed=0):
    rng = np.random.default_rng(seed)
    return (offset + rng.standard_normal(shape)).astype(dtype)


# (kernel, x shape, the forward's trailing arguments): rows of 4099 (SIMD lanes and a tail),
# two normalised axes, 63 positions (blocks of four and a tail of three), one group per channel.
FORWARDS = [
    ("layer_norm", (3, 4099), (1, 1e-5)),
    ("layer_norm", (2, 5, 67), (2, 1e-5)),
    ("group_norm", (2, 7, 9, 16), (4, 1e-5)),
    ("group_norm", (3, 63, 6), (6, 1e-5)),
]


def _forward_args(kind, x, rest, affine):
    shape = x.shape[x.ndim - rest[0]:] if kind == "layer_norm" else x.shape[-1:]
    rng = np.random.default_rng(1)
    weight = (1 + 0.1 * rng.standard_normal(shape)).astype(x.dtype) if affine else None
    bias = rng.standard_normal(shape).astype(x.dtype) if affine else None
    return (x, weight, bias) + rest


@pytest.mark.parametrize("affine", [True, False])
@pytest.mark.parametrize("dtype", [np.float32, np.float64])
@pytest.mark.parametrize("kind, shape, rest", FORWARDS, ids=[f"{k}-{s}" for k, s, _ in FORWARDS])
def test_long_rows_and_position_tails_agree_with_the_reference(kind, shape, rest, dtype, affine):
    # NOTE: float32 on a large offset (the float64 sums' headroom is the point); float64 sums
    # float64 values, whose mean is off by its own rounding in any order: a moderate offset.
    offset = 1000.0 if dtype == np.float32 else 10.0
    args = _forward_args(kind, _input(shape, dtype, offset), rest, affine)
    forward = f"{kind}_forward"
    expected = REGISTRY[forward].reference(*args)
    got = _numba(forward)(*args)
    for a, b in zip(got, expected):
        assert a.shape == b.shape and a.dtype == b.dtype
        assert _normwise_ulps(a, b) <= ULPS[forward]
    # the statistics against float64 on the large offset (the reference's rule: within 4 eps)
    exact = REGISTRY[forward].reference(*(a.astype(np.float64) if isinstance(a, np.ndarray)
                                          else a for a in args))[0]
    if dtype == np.float32:
        assert _normwise_ulps(got[0], exact) <= 4
    g = np.random.default_rng(2).standard_normal(shape).astype(dtype)
    backward = f"{kind}_backward"
    weight, trailing = args[1], rest[0]
    back_args = (g, got[1], got[2], weight, trailing, (True, affine, affine))
    expected_grads = REGISTRY[backward].reference(*back_args)
    for a, b in zip(_numba(backward)(*back_args), expected_grads):
        if b is None:
            assert a is None
            continue
        assert a.shape == b.shape and a.dtype == b.dtype
        assert _normwise_ulps(a, b) <= ULPS[backward]


@pytest.mark.parametrize("kind", ["layer_norm", "group_norm", "batch_norm"])
def test_the_parameter_gradients_are_float64_accurate_over_many_positions(kind):
    # NOTE: 2^15 rows (2^19 positions for the channel norms): a float32 sum row after row (the
    # reference's) drifts by tens of ulps there; these sums stay within 2 eps of float64.
    x = _input((32, 64, 64, 8) if kind != "layer_norm" else (2 ** 15, 8), np.float32, 5.0)
    c = x.shape[-1]
    rest = {"layer_norm": (1, 1e-5), "group_norm": (2, 1e-5), "batch_norm": (1e-5,)}[kind]
    weight = np.linspace(0.5, 1.5, c, dtype=np.float32)
    out = _numba(f"{kind}_forward")(x, weight, np.zeros(c, np.float32), *rest)
    xhat, inv_std = out[1], out[2]
    g = np.random.default_rng(3).standard_normal(x.shape).astype(np.float32)
    middle = {"layer_norm": (1,), "group_norm": (2,), "batch_norm": (True,)}[kind]
    _, gw, gb = _numba(f"{kind}_backward")(g, xhat, inv_std, weight, *middle, (True, True, True))
    lead = tuple(range(x.ndim - 1))
    exact_w = (g.astype(np.float64) * xhat.astype(np.float64)).sum(axis=lead)
    exact_b = g.astype(np.float64).sum(axis=lead)
    assert _normwise_ulps(gw, exact_w) <= 2
    assert _normwise_ulps(gb, exact_b) <= 2


@pytest.mark.parametrize("needs", [(False, True, True), (True,), (True, False, True),
                                   (False, False, False)])
@pytest.mark.parametrize("kind", ["layer_norm", "group_norm", "batch_norm"])
def test_partial_needs_agree_with_the_reference(kind, needs):
    x = _input((4, 6, 5, 8), np.float32, 3.0)
    weight = np.linspace(0.5, 1.5, 8, dtype=np.float32)
    rest = {"layer_norm": (1, 1e-5), "group_norm": (2, 1e-5), "batch_norm": (1e-5,)}[kind]
    _, xhat, inv_std, *_ = REGISTRY[f"{kind}_forward"].reference(x, weight, None, *rest)
    g = np.random.default_rng(4).standard_normal(x.shape).astype(np.float32)
    middle = {"layer_norm": (1,), "group_norm": (2,), "batch_norm": (True,)}[kind]
    args = (g, xhat, inv_std, weight, *middle, needs)
    expected = REGISTRY[f"{kind}_backward"].reference(*args)
    got = _numba(f"{kind}_backward")(*args)
    for a, b in zip(got, expected):
        assert (a is None) == (b is None)
        if b is not None:
            assert _normwise_ulps(a, b) <= ULPS[f"{kind}_backward"]


@pytest.mark.parametrize("kind", ["layer_norm", "group_norm", "batch_norm"])
def test_results_own_their_memory(kind):
    # NOTE: autograd copies a gradient that is a view (it may alias another array): a kernel
    # returning reshaped views of its buffers costs the step one more pass over the input.
    x = _input((2, 3, 4, 8), np.float32, 3.0)
    weight = np.ones(8, np.float32)
    rest = {"layer_norm": (1, 1e-5), "group_norm": (2, 1e-5), "batch_norm": (1e-5,)}[kind]
    forward = _numba(f"{kind}_forward")(x, weight, np.zeros(8, np.float32), *rest)
    middle = {"layer_norm": (1,), "group_norm": (2,), "batch_norm": (True,)}[kind]
    grads = _numba(f"{kind}_backward")(np.ones_like(x), forward[1], forward[2], weight, *middle,
                                       (True, True, True))
    for array in forward[:2] + grads:
        assert array.flags.owndata


@pytest.mark.parametrize("dtype", [np.float32, np.float64])
def test_group_norm_keeps_each_samples_statistics_to_that_sample(dtype):
    # NOTE: the loops keep per-sample statistics in (samples, channels) tables; samples of very
    # different offsets and scales, compared sample by sample in ulps of that sample's own
    # magnitude, catch any statistic taken from another sample.
    # float64's offsets stay within ten of its scale (as above: its mean's own rounding).
    rng = np.random.default_rng(3)
    offsets = [1000.0, -5.0, 0.0, 40.0] if dtype == np.float32 else [10.0, -0.005, 0.0, 28.0]
    offsets = np.array(offsets).reshape(4, 1, 1, 1)
    scales = np.array([1.0, 1e-3, 100.0, 7.0]).reshape(4, 1, 1, 1)
    shape = (4, 5, 7, 16)
    x = (offsets + scales * rng.standard_normal(shape)).astype(dtype)
    args = _forward_args("group_norm", x, (4, 1e-5), affine=True)
    got = _numba("group_norm_forward")(*args)
    expected = REGISTRY["group_norm_forward"].reference(*args)
    g = (rng.standard_normal(shape) * scales[::-1]).astype(dtype)
    back_args = (g, got[1], got[2], args[1], 4, (True, True, True))
    grads = _numba("group_norm_backward")(*back_args)
    expected_grads = REGISTRY["group_norm_backward"].reference(*back_args)
    for b in range(shape[0]):
        for name, a, e in (("out", got[0], expected[0]), ("xhat", got[1], expected[1]),
                           ("inv_std", got[2], expected[2]), ("gx", grads[0], expected_grads[0])):
            kernel_name = "group_norm_backward" if name == "gx" else "group_norm_forward"
            assert _normwise_ulps(a[b], e[b]) <= ULPS[kernel_name], (name, b)
    for a, e in zip(grads[1:], expected_grads[1:]):
        assert _normwise_ulps(a, e) <= ULPS["group_norm_backward"]
