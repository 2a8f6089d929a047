"""The shm process group's collectives, with 3 real worker processes, against a NumPy float64
reference; and the single-rank group created by ``init``."""

from __future__ import annotations

import dist_workers
import numpy as np
import pytest

from everyo.distributed import ProcessGroup, init, spawn

# (the workers keep the default provider: its compiled reduction runs on the long vector)
pytestmark = pytest.mark.kernel_provider
SHAPES = [(7,), (3, 5), (300_000,)]  # the last one outgrows the first shared buffer
WORLD = 3


@pytest.fixture(scope="module")
def three_rank_results():
    return spawn(dist_workers.primitives, WORLD, args=(SHAPES,), timeout=60)


def _reference_rows(dtype, index):
    return [dist_workers.rank_data(rank, SHAPES[index], dtype, seed=index) for rank in range(WORLD)]


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index", range(len(SHAPES)))
def test_reductions_match_the_float64_reference_on_every_rank(three_rank_results, dtype, index,
                                                              clean_shm):
    rows = _reference_rows(dtype, index)
    total = np.zeros(SHAPES[index], np.float64)
    for row in rows:  # rank order, in float64
        total += row
    for result in three_rank_results:
        key = f"{dtype}-{index}"
        assert result[f"sum-{key}"].dtype == np.dtype(dtype)
        assert result[f"sum-{key}"].shape == SHAPES[index]
        np.testing.assert_array_equal(result[f"sum-{key}"], total.astype(dtype))
        np.testing.assert_array_equal(result[f"mean-{key}"], (total / WORLD).astype(dtype))
    first = three_rank_results[0]
    for result in three_rank_results[1:]:  # bit-identical, not merely close
        for kind in ("sum", "mean"):
            key = f"{kind}-{dtype}-{index}"
            assert result[key].tobytes() == first[key].tobytes()


def test_float64_reduction_beats_a_float32_sum(three_rank_results):
    """The float32 sum of mixed-magnitude inputs differs from the float64 one: the group must
    return the float64 result (rounded once), not the float32 one."""
    rows = _reference_rows("float32", 2)
    naive = rows[0] + rows[1] + rows[2]
    exact = (rows[0].astype(np.float64) + rows[1] + rows[2]).astype(np.float32)
    assert not np.array_equal(naive, exact)  # otherwise this test proves nothing
    np.testing.assert_array_equal(three_rank_results[0]["sum-float32-2"], exact)


@pytest.mark.parametrize("dtype", ["float32", "float64"])
@pytest.mark.parametrize("index", range(len(SHAPES)))
def test_all_gather_and_broadcast(three_rank_results, dtype, index):
    rows = _reference_rows(dtype, index)
    for result in three_rank_results:
        gathered = result[f"gather-{dtype}-{index}"]
        assert gathered.shape == (WORLD, *SHAPES[index]) and gathered.dtype == np.dtype(dtype)
        np.testing.assert_array_equal(gathered, np.stack(rows))
        np.testing.assert_array_equal(result[f"bcast-{dtype}-{index}"], rows[WORLD - 1])


def test_ranks_and_integer_sum(three_rank_results):
    assert [r["rank"] for r in three_rank_results] == [0, 1, 2]
    assert [r["is_main"] for r in three_rank_results] == [True, False, False]
    assert {r["world_size"] for r in three_rank_results} == {WORLD}
    for result in three_rank_results:
        assert result["int-sum"].dtype == np.int64
        np.testing.assert_array_equal(result["int-sum"], np.arange(5) * 6)


def test_scalars_empty_arrays_tensors_and_out(three_rank_results):
    reference_mean = three_rank_results[0]["mean-float32-2"]
    for result in three_rank_results:
        assert result["scalar-sum"].shape == () and result["scalar-sum"] == 0.5 + 1.5 + 2.5
        assert result["empty-mean"].shape == (0, 3) and result["empty-mean"].dtype == np.float32
        assert result["empty-gather"].shape == (WORLD, 0)
        np.testing.assert_array_equal(result["tensor-mean"], np.float32([1.0, 1.0]))
        assert result["in-place-is-out"]
        assert result["in-place-mean"].tobytes() == reference_mean.tobytes()


def test_single_rank_group_from_init(clean_shm):
    with init(backend="shm", rank=0, world_size=1) as group:
        assert isinstance(group, ProcessGroup)
        assert (group.rank, group.world_size, group.is_main, group.backend) == (0, 1, True, "shm")
        x = np.float32([1.5, -2.0])
        np.testing.assert_array_equal(group.all_reduce_mean(x), x)
        np.testing.assert_array_equal(group.all_gather(x), x[None])
        group.barrier()
    with pytest.raises(Exception, match="closed"):
        group.barrier()


def test_bad_arguments_are_refused_by_name(clean_shm):
    with init(backend="shm", rank=0, world_size=1) as group:
        with pytest.raises(Exception, match="integer array"):
            group.all_reduce_mean(np.arange(3))
        with pytest.raises(Exception, match="src must be a rank"):
            group.broadcast(np.zeros(2), src=3)
        with pytest.raises(Exception, match="dtype"):
            group.all_gather(np.array(["a"]))
        group.barrier()  # none of those poisoned the group


@pytest.mark.parametrize("backend", ["shm", "tcp"])
@pytest.mark.parametrize("length", [5, 70_000])  # tcp's ring: a whole message, and blocks
def test_integer_sums_are_exact_and_wrap_like_numpy(backend, length):
    results = spawn(dist_workers.large_integer_sums, 3, args=(length,), backend=backend,
                    timeout=60)
    for name in results[0]:
        expected = np.sum([ranked[name][0] for ranked in results], axis=0, dtype=name)
        for ranked in results:
            assert ranked[name][1].dtype == name
            assert ranked[name][1].tobytes() == expected.tobytes(), name


@pytest.mark.parametrize("timeout", [float("inf"), 1e300, "soon", [5]])
@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_a_timeout_no_wait_can_express_is_refused_by_name(backend, timeout, clean_shm):
    from everyo.distributed import DistributedError

    with pytest.raises(DistributedError, match="timeout must be"):
        init(backend=backend, rank=0, world_size=1, timeout=timeout,
             **({"master_addr": "127.0.0.1", "master_port": 1} if backend == "tcp" else {}))


def test_python_floats_beyond_float32_become_infinities_without_a_warning():
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("error")
        with init(backend="shm", rank=0, world_size=1) as group:
            total = group.all_reduce_sum([1e39, -1e39, 1.0])
    np.testing.assert_array_equal(total, np.float32([np.inf, -np.inf, 1.0]))
