"""The tcp ring's scratch is bounded by one piece of an all-reduce, not by the vector: a long
vector is reduced piece by piece (``allreduce.PIECE_BYTES``), with the same bits."""

from __future__ import annotations

import numpy as np
import pytest
from dist_workers import wide_data
from tcp_harness import run_threads

from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group
from everyo_dist.backends.tcp import allreduce
from everyo_dist.reduction import reduce_rows_f64

PIECE = 1 << 16  # bytes: small, so that a test-sized vector is many pieces
LENGTH = 1_000_003  # not a multiple of any piece


@pytest.mark.parametrize("world_size, dtype, schedule", [
    (2, "float32", "ring"), (3, "float32", "ring"), (4, "float64", "chain"),
    (6, "float32", "chain")])
def test_retained_scratch_is_bounded_by_one_piece_and_bits_are_unchanged(
        monkeypatch, world_size, dtype, schedule):
    monkeypatch.setattr(allreduce, "PIECE_BYTES", PIECE, raising=False)
    itemsize = np.dtype(dtype).itemsize
    assert allreduce.plan(PIECE // itemsize, world_size, itemsize) == schedule
    rows = [wide_data(rank, dtype, LENGTH) for rank in range(world_size)]

    with TCPRendezvousServer("127.0.0.1", 0, world_size=world_size, token="t") as server:
        def rank_job(rank):
            with init_tcp_process_group("127.0.0.1", server.port, rank=rank,
                                        world_size=world_size, token="t", timeout=60) as group:
                total = group.all_reduce_sum(rows[rank])
                mean = group.all_reduce_mean(rows[rank])
                return total, mean, group.transport.scratch_bytes()

        results = run_threads(rank_job, world_size)
    expected_sum = reduce_rows_f64(rows, False, dtype)
    expected_mean = reduce_rows_f64(rows, True, dtype)
    # raw rows and float64 partial sums of one piece, double-buffered: far below the vector
    bound = 2 * (8 + itemsize) * (PIECE // itemsize)
    for total, mean, scratch in results:
        assert total.tobytes() == expected_sum.tobytes()
        assert mean.tobytes() == expected_mean.tobytes()
        assert scratch <= bound, f"{scratch} bytes of scratch kept, bound {bound}"
    assert bound < LENGTH * itemsize / 4
