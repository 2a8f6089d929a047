"""Opt-in wire compression (``wire_dtype=``): the result is exactly the float64 reduction of
the rounded inputs, rounded again, identical on every rank; the default stays exact."""

from __future__ import annotations

import numpy as np
import pytest
from tcp_harness import run_threads

from everyo.distributed import DistributedError
from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group


def _reduce_over_threads(arrays, wire_dtype, mean=True):
    with TCPRendezvousServer(world_size=len(arrays), token="compress") as server:
        def rank_job(rank):
            with init_tcp_process_group("127.0.0.1", server.port, rank=rank,
                                        world_size=len(arrays), token="compress", timeout=20,
                                        wire_dtype=wire_dtype) as group:
                reduce = group.all_reduce_mean if mean else group.all_reduce_sum
                return reduce(arrays[rank])

        return run_threads(rank_job, len(arrays))


def _expected(arrays, wire, mean):
    total = sum(a.astype(wire).astype(np.float64) for a in arrays)
    if mean:
        total = total / len(arrays)
    return total.astype(wire).astype(arrays[0].dtype)


@pytest.mark.parametrize("wire_name", ["float16", "bfloat16"])
@pytest.mark.parametrize("ranks", [2, 3])
def test_compressed_reduction_is_the_rounded_reduction_on_every_rank(wire_name, ranks):
    if wire_name == "bfloat16":
        ml_dtypes = pytest.importorskip("ml_dtypes")
        wire = np.dtype(ml_dtypes.bfloat16)
    else:
        wire = np.dtype(np.float16)
    rng = np.random.default_rng(ranks)
    arrays = [rng.standard_normal(50_001).astype(np.float32) for _ in range(ranks)]
    results = _reduce_over_threads(arrays, wire_name)
    expected = _expected(arrays, wire, mean=True)
    for result in results:
        assert result.dtype == np.float32
        assert result.tobytes() == expected.tobytes()
    stacked = np.stack(arrays).astype(np.float64)
    exact = stacked.mean(axis=0)
    error = np.abs(results[0] - exact)
    unit = 2.0 ** -11 if wire_name == "float16" else 2.0 ** -8  # half an ulp at 1.0
    # each input rounded once (relative to its own size), the result rounded once more
    bound = unit * np.abs(stacked).mean(axis=0) + unit * np.abs(exact) + 2.0 ** -24
    assert np.all(error <= bound * 1.001), np.max(error / bound)
    assert np.max(error) > 0  # compression did happen


def test_the_default_stays_exact_and_integers_are_never_compressed():
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(1000).astype(np.float32) for _ in range(2)]
    exact = (arrays[0].astype(np.float64) + arrays[1]) / 2
    for result in _reduce_over_threads(arrays, None):
        assert result.tobytes() == exact.astype(np.float32).tobytes()
    integers = [np.arange(10, dtype=np.int64) * 100_000 for _ in range(2)]
    for result in _reduce_over_threads(integers, "float16", mean=False):
        np.testing.assert_array_equal(result, integers[0] * 2)


def test_an_unknown_wire_dtype_is_refused_before_connecting():
    with pytest.raises(DistributedError, match="wire_dtype must be one of float16, bfloat16"):
        init_tcp_process_group("127.0.0.1", 1, rank=0, world_size=2, token="x" * 16,
                               timeout=5, wire_dtype="int8")


def test_float16_overflow_becomes_inf_without_a_warning_that_could_raise():
    # the cast to float16 warned "overflow encountered in cast", a raw RuntimeWarning
    # exception under -W error (or a warnings filter that turns warnings into errors)
    import warnings

    arrays = [np.float32([1e6, 1.0]), np.float32([2.0, 3.0])]
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        results = _reduce_over_threads(arrays, "float16", mean=False)
    for result in results:
        assert np.isinf(result[0]) and result[1] == 4.0
