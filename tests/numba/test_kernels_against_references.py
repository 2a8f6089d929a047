"""Every kernel everyo-numba implements, against its NumPy reference, on a table of shapes,
dtypes (float32, float64, float16, bfloat16) and layouts (contiguous, non-contiguous,
negative strides, read-only, broadcast, empty, non-native byte order), with special values
(ties, NaN, -inf) where the kernel must treat them as the reference does.

Bounds (the contract each implementation states):

- ``EXACT`` kernels (max pooling, the optimizers' steps, the LSTM time loops, ...) give the
  reference's bits;
- the others agree within ``ULPS`` units of the dtype's epsilon times the largest magnitude of
  the reference's output (a normwise bound: the loops sum in another order, in float64 where
  the reference sums in the computation dtype).

Each implementation is also deterministic: the same bits twice, and at one and two BLAS
threads (the compiled loops run on the calling thread only).
"""

from __future__ import annotations

import sys

import numpy as np
import pytest
from threadpoolctl import ThreadpoolController

import everyo as eo
from support.kernel_cases import CASES, EXACT, SCRATCH, ULPS, USES_BLAS, case_ids

pytest.importorskip("numba", reason="everyo-numba's kernels need Numba")

REGISTRY = eo.registry("kernels")
PROVIDER = REGISTRY.providers().get("numba")
pytestmark = pytest.mark.skipif(PROVIDER is None, reason="everyo-numba is not installed")


_CONTROLLERS: dict = {}


def _blas_threads(count: int):
    """``threadpool_limits(count)`` without its cost per call: finding the loaded BLAS
    libraries (1.3 ms, 6 s over the table) is done again only when a module was imported since
    (Numba loads SciPy's OpenBLAS, which its compiled ``np.dot`` calls, at a kernel's first
    call)."""
    key = len(sys.modules)
    if key not in _CONTROLLERS:
        _CONTROLLERS.clear()
        _CONTROLLERS[key] = ThreadpoolController()
    return _CONTROLLERS[key].limit(limits=count)


def _as_tuple(result) -> tuple:
    """A result as a flat tuple of arrays (and Nones): lists of per-parameter arrays too."""
    if isinstance(result, (tuple, list)):
        return tuple(leaf for item in result for leaf in _as_tuple(item))
    return (result,)


def _eps(dtype: np.dtype) -> float:
    return float(np.finfo(np.float32 if dtype.kind == "V" else dtype).eps) \
        if dtype.name != "bfloat16" else 2.0 ** -7


def _assert_close(name: str, got, expected) -> None:
    for index, (a, b) in enumerate(zip(_as_tuple(got), _as_tuple(expected))):
        where = f"{name} output {index}"
        if not isinstance(b, np.ndarray):  # None, or a verdict such as a bool
            assert a == b and type(a) is type(b), (where, a, b)
            continue
        assert a.shape == b.shape and a.dtype == b.dtype, (where, a.shape, b.shape, a.dtype,
                                                          b.dtype)
        if name in EXACT:  # the same bits (NaN payloads and the sign of zero included)
            bits = np.dtype(f"u{a.dtype.itemsize}")
            np.testing.assert_array_equal(a.view(bits), b.view(bits), err_msg=where)
            continue
        a64, b64 = a.astype(np.float64), b.astype(np.float64)
        assert np.array_equal(np.isnan(a64), np.isnan(b64)), where
        # (infinities, in the output or in an input compared unchanged, exactly where they were)
        infinite = np.isinf(b64)
        assert np.array_equal(a64[infinite], b64[infinite]), where
        finite = np.isfinite(b64)
        scale = np.max(np.abs(b64[finite]), initial=0.0)
        bound = ULPS[name] * _eps(b.dtype) * scale
        worst = np.max(np.abs(a64[finite] - b64[finite]), initial=0.0)
        assert worst <= bound, f"{where}: off by {worst:.3g}, bound {bound:.3g}"


def _arrays(name: str, args) -> tuple:
    """The array arguments (lists of them flattened), but scratch whose contents the contract
    leaves open."""
    kept = [a for index, a in enumerate(args) if index not in SCRATCH.get(name, ())]
    return tuple(a for a in _as_tuple(kept) if isinstance(a, np.ndarray))


@pytest.mark.parametrize("name, build", CASES, ids=case_ids())
def test_the_provider_agrees_with_the_reference(name, build):
    # NOTE: two independent sets of the same arguments, so that what a kernel writes into its
    # arguments (the contract says which) is compared as well as what it returns.
    args, mine = build(np.random.default_rng(0)), build(np.random.default_rng(0))
    expected = REGISTRY[name].reference(*args)
    with eo.kernels.use("numba"):
        got = getattr(eo.kernels.kernel, name)(*mine)  # (NotImplemented: the reference ran)
    _assert_close(name, got, expected)
    _assert_close(name, _arrays(name, mine), _arrays(name, args))


@pytest.mark.parametrize("name, build", CASES, ids=case_ids())
def test_the_provider_is_deterministic_run_to_run_and_across_thread_counts(name, build):
    implementation = PROVIDER.resolve(name)

    def run():  # fresh arguments each time: some kernels write into theirs
        args = build(np.random.default_rng(1))
        return _as_tuple(implementation(*args)) + _arrays(name, args)

    with _blas_threads(1):
        first, second = run(), run()
    if first[0] is NotImplemented:
        return
    with _blas_threads(2):
        third = run()
    for a, b, c in zip(first, second, third):
        if not isinstance(a, np.ndarray):
            assert a == b == c
            continue
        bits = np.dtype(f"u{a.dtype.itemsize}")
        np.testing.assert_array_equal(a.view(bits), b.view(bits))
        if name not in USES_BLAS:  # (a GEMM inside: BLAS decides its bits per thread count)
            np.testing.assert_array_equal(a.view(bits), c.view(bits))


def test_the_provider_covers_every_kernel_the_table_lists():
    assert {name for name, _ in CASES} == set(PROVIDER.implementations)


@pytest.mark.parametrize("name, args", [
    ("layer_norm_forward", lambda x: (x, None, None, 1, 1e-5)),
    ("batch_norm_forward", lambda x: (x, None, None, 1e-5)),
    ("group_norm_forward", lambda x: (x, None, None, 2, 1e-5)),
])
@pytest.mark.parametrize("selection", ["numpy", "numba"])
def test_norm_statistics_keep_float64_accuracy_on_a_large_offset(name, args, selection):
    # NOTE: a mean of 1000 over values of spread 1: statistics summed in float32, or a float32
    # mean without its rounding residue, put the output off by hundreds of ulps.
    x64 = 1000.0 + np.random.default_rng(2).standard_normal((8, 6, 6, 4))
    x = x64.astype(np.float32)
    with eo.kernels.use(selection):
        out = getattr(eo.kernels.kernel, name)(*args(x))[0]
    exact = REGISTRY[name].reference(*args(x.astype(np.float64)))[0]
    assert out.dtype == np.float32
    assert np.max(np.abs(out - exact)) <= 4 * np.finfo(np.float32).eps * np.max(np.abs(exact))
