"""DistributedDataParallel communication hooks (``register_comm_hook``): the built-ins'
arithmetic, PowerSGD's properties (identical on every rank, exact at full rank, error feedback
telescopes, vectors exact, warm-up exact), and the refusals, with two real processes."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.distributed import DistributedDataParallel, DistributedError, comm_hooks, init, spawn

WORLD = 2


def _same_bits(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


def test_a_registered_allreduce_hook_gives_the_defaults_bits():
    from ddp_workers import default_or_registered_allreduce

    hooked = spawn(default_or_registered_allreduce, WORLD, args=(True,), timeout=60)
    default = spawn(default_or_registered_allreduce, WORLD, args=(False,), timeout=60)
    for rank in range(WORLD):
        _same_bits(hooked[rank], default[rank])


def _mean_through(dtype, rows):
    """The promised arithmetic: each rank's values rounded to ``dtype``, added in float64 in
    rank order, divided, rounded once to ``dtype``, widened back."""
    narrowed = [np.asarray(r).astype(dtype).astype(np.float64) for r in rows]
    total = narrowed[0]
    for row in narrowed[1:]:
        total = total + row
    return (total / len(rows)).astype(dtype).astype(rows[0].dtype)


@pytest.mark.parametrize("hook_name, dtype", [("fp16_compress_hook", "float16"),
                                              ("bf16_compress_hook", "bfloat16")])
def test_16_bit_hooks_round_each_rank_once_and_the_mean_once(hook_name, dtype):
    from ddp_workers import local_and_hooked_gradients

    from everyo.dtypes import resolve_dtype

    results = spawn(local_and_hooked_gradients, WORLD, args=(hook_name,), timeout=60)
    keys = sorted(k for k in results[0] if k.startswith("hooked"))
    for key in keys:
        expected = _mean_through(resolve_dtype(dtype, "test"),
                                 [r[key.replace("hooked", "local")] for r in results])
        for rank in range(WORLD):
            assert results[rank][key].tobytes() == expected.tobytes(), key


def test_fp16_compress_hook_matches_the_tcp_wire_dtype_bit_for_bit():
    from ddp_workers import local_and_hooked_gradients

    hooked = spawn(local_and_hooked_gradients, WORLD, args=("fp16_compress_hook", 2),
                   backend="tcp", timeout=60)
    wire = spawn(local_and_hooked_gradients, WORLD, args=(None, 2), backend="tcp", timeout=60,
                 backend_options={"wire_dtype": "float16"})
    for rank in range(WORLD):
        for key in hooked[rank]:
            assert hooked[rank][key].tobytes() == wire[rank][key].tobytes(), key


@pytest.mark.parametrize("which, match", [("shape", r"float32\[\d+\].*same shape"),
                                          ("dtype", r"returned float64")])
def test_a_hook_returning_the_wrong_shape_or_dtype_fails_every_rank_by_name(which, match):
    from ddp_workers import bad_hook

    messages = spawn(bad_hook, WORLD, args=(which,), timeout=60)
    import re

    for message in messages:
        assert re.search(match, message) and "bucket 0" in message, message


def test_a_hook_failing_on_one_rank_leaves_no_step_mixed_with_another_steps_bucket():
    # rank 1 skipped its collective: its next step's all-reduce (same op, same shape) would
    # pair with rank 0's waiting one, and both ranks would carry on with mixed gradients
    from ddp_workers import hook_failing_once_on_one_rank

    zero, one = spawn(hook_failing_once_on_one_rank, WORLD, timeout=15)
    assert one[0] == "ValueError"  # the hook's own error, on its rank
    assert one[1:] == ["DistributedError"] * 2, one  # its group refuses further collectives
    assert "ok" not in zero, zero  # a named error on the waiting rank (timeout, peer lost)
    assert all(name.endswith("Error") for name in zero), zero


def test_powersgd_is_identical_on_every_rank_and_keeps_vectors_exact():
    from ddp_workers import powersgd_run

    results = spawn(powersgd_run, WORLD, args=(1, 3), timeout=60)
    for key in results[0]:
        if key.startswith("psgd"):
            assert results[0][key].tobytes() == results[1][key].tobytes(), key
    for step in range(3):
        for i in (1, 3, 5, 7):  # the biases: averaged exactly, bit for bit
            assert results[0][f"psgd{step}-{i}"].tobytes() == \
                results[0][f"exact{step}-{i}"].tobytes()
        # a rank-1 matrix approximation differs from the exact mean
        assert not np.allclose(results[0][f"psgd{step}-0"], results[0][f"exact{step}-0"],
                               rtol=1e-3)
    before, after = results[0]["stats"]
    assert after < before / 4


def test_powersgd_at_full_rank_is_the_exact_mean():
    from ddp_workers import powersgd_run

    results = spawn(powersgd_run, WORLD, args=(64, 2), timeout=60)
    for key in results[0]:
        if key.startswith("psgd"):
            exact = results[0][key.replace("psgd", "exact")]
            np.testing.assert_allclose(results[0][key], exact, rtol=2e-4,
                                       atol=2e-5 * np.abs(exact).max())


def test_powersgd_error_feedback_loses_nothing_over_steps():
    # sum of what was applied + mean of the errors left = sum of the exact means
    from ddp_workers import powersgd_run

    steps = 4
    results = spawn(powersgd_run, WORLD, args=(1, steps), timeout=60)
    placement = results[0]["bucket_params"]
    for param, bucket, start in placement:
        applied = sum(results[0][f"psgd{t}-{param}"].astype(np.float64) for t in range(steps))
        exact = sum(results[0][f"exact{t}-{param}"].astype(np.float64) for t in range(steps))
        size = exact.size
        left = np.mean([r[f"error-{bucket}"][start:start + size] for r in results], axis=0)
        np.testing.assert_allclose(applied.ravel() + left, exact.ravel(), rtol=1e-4,
                                   atol=1e-5 * np.abs(exact).max())


def test_powersgd_averages_exactly_until_start_powersgd_iter():
    from ddp_workers import powersgd_run

    results = spawn(powersgd_run, WORLD, args=(1, 3, 2), timeout=60)
    for step in range(3):
        same = results[0][f"psgd{step}-0"].tobytes() == results[0][f"exact{step}-0"].tobytes()
        assert same == (step < 2)


@pytest.mark.parametrize("option, value", [("matrix_approximation_rank", 0),
                                           ("matrix_approximation_rank", 1.5),
                                           ("start_powerSGD_iter", -1),
                                           ("min_compression_rate", float("nan")),
                                           ("orthogonalization_epsilon", -1.0)])
def test_powersgd_state_refuses_bad_options_by_name(option, value):
    with init(backend="shm", rank=0, world_size=1) as group:
        with pytest.raises(DistributedError, match=option):
            comm_hooks.PowerSGDState(group, **{option: value})


def test_powersgd_refuses_a_bucket_it_cannot_factor_by_name():
    with init(backend="shm", rank=0, world_size=1) as group:
        state = comm_hooks.PowerSGDState(group, start_powerSGD_iter=0)
        bucket = comm_hooks.GradBucket(3, np.zeros(12, np.int32),
                                       [eo.Parameter(np.zeros((3, 4), np.float32))], [0, 12],
                                       True)
        with pytest.raises(DistributedError, match="bucket 3 holds int32.*cannot factor"):
            comm_hooks.powerSGD_hook(state, bucket)


def test_a_hook_is_registered_once_and_before_the_first_forward():
    with init(backend="shm", rank=0, world_size=1) as group:
        ddp = DistributedDataParallel(eo.Linear(2, 1, seed=0), group)
        try:
            with pytest.raises(DistributedError, match="callable"):
                ddp.register_comm_hook(group, "allreduce")
            ddp.register_comm_hook(group, comm_hooks.allreduce_hook)
            with pytest.raises(DistributedError, match="already registered"):
                ddp.register_comm_hook(group, comm_hooks.allreduce_hook)
        finally:
            ddp.close()
        ddp = DistributedDataParallel(eo.Linear(2, 1, seed=0), group)
        try:
            ddp(eo.ones((3, 2))).sum().backward()
            with pytest.raises(DistributedError, match="before the first forward"):
                ddp.register_comm_hook(group, comm_hooks.fp16_compress_hook)
        finally:
            ddp.close()


def test_the_16_bit_hooks_overflow_to_inf_without_a_warning():
    import warnings

    with init(backend="shm", rank=0, world_size=1) as group:
        bucket = comm_hooks.GradBucket(0, np.float32([1e6, -1e39 * 0 + 3e38, 1.0]),
                                       [eo.Parameter(np.zeros(3, np.float32))], [0, 3], True)
        with warnings.catch_warnings():
            warnings.simplefilter("error")
            result = comm_hooks.fp16_compress_hook(group, bucket)
        assert np.isinf(result[:2]).all() and result[2] == 1.0
