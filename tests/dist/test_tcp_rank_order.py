"""The flat tcp ring sums in rank order: bit-identical to the canonical reduction (and so to
shm, mpi and tcp_hierarchical) at every world size, for every dtype, both schedules (ring and
chain), sums and means, empty, short and long vectors; DistributedDataParallel on it equals
``average_gradients``; a peer whose multi-part message is wrong is named."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dist_workers import WIDE_LENGTHS, ddp_or_average, make_data, wide_data, wide_reductions
from tcp_harness import run_threads

from everyo.distributed import spawn
from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group
from everyo_dist.backends.tcp.allreduce import link_bytes, plan
from everyo_dist.backends.tcp.frames import DTYPE_CODE_OF, pack_data_header
from everyo_dist.backends.tcp.progress import TRAILER_OK
from everyo_dist.backends.tcp.ring import Ring
from everyo_dist.contract import Collective
from everyo_dist.errors import DistributedError
from everyo_dist.fingerprint import CollectiveOp, Fingerprint
from everyo_dist.reduction import reduce_rows_f64

HERE = Path(__file__).resolve().parent


def _over_threads(world_size, job, **options):
    """``job(group)`` on every rank of a tcp group whose ranks are threads of this process."""
    with TCPRendezvousServer(world_size=world_size, token="t") as server:
        def rank_main(rank):
            with init_tcp_process_group("127.0.0.1", server.port, rank=rank,
                                        world_size=world_size, token="t", timeout=60,
                                        **options) as group:
                return job(group)

        return run_threads(rank_main, world_size)


def _assert_canonical(results, world_size, lengths=WIDE_LENGTHS):
    """Every rank's every result equals ``reduce_rows_f64`` of the ranks' rows, bit for bit."""
    for key in results[0]:
        op, dtype, length = key.split("-")
        rows = [wide_data(rank, dtype, int(length)) for rank in range(world_size)]
        expected = reduce_rows_f64(rows, op == "mean", dtype)
        for rank, result in enumerate(results):
            assert result[key].dtype == expected.dtype, (key, rank)
            assert result[key].tobytes() == expected.tobytes(), (key, rank)


@pytest.mark.parametrize("world_size", [3, 4, 5, 8])
def test_the_flat_ring_is_the_canonical_reduction_bit_for_bit(world_size):
    # lengths below the world size leave chunks empty; 4 ranks of float64 and 8 ranks take
    # the chain, the others the ring (see the schedule test below)
    results = _over_threads(world_size, wide_reductions)
    _assert_canonical(results, world_size)


def test_long_vectors_are_folded_block_by_block_to_the_same_bits():
    # chunks of more than one fold block (131072 items): the owned chunk is finished while it
    # arrives, the chain adds each block as it streams past
    length = 400_003
    for world_size, dtypes in ((3, ("float64", "float32")), (4, ("float64",))):
        assert {plan(length, world_size, np.dtype(d).itemsize) for d in dtypes} == \
            ({"ring"} if world_size == 3 else {"chain"})
        results = _over_threads(world_size, lambda group, dtypes=dtypes: wide_reductions(
            group, dtypes, (length,)))
        _assert_canonical(results, world_size, (length,))


@pytest.mark.parametrize("wire", ["float16", "bfloat16"])
def test_compressed_reductions_are_the_canonical_reduction_of_the_rounded_inputs(wire):
    ml_dtypes = pytest.importorskip("ml_dtypes")
    wire_dtype = np.dtype(np.float16 if wire == "float16" else ml_dtypes.bfloat16)
    world_size, length = 3, 1001

    def job(group):
        mine = wide_data(group.rank, "float16", length).astype(np.float32)
        return group.all_reduce_sum(mine), group.all_reduce_mean(mine)

    results = _over_threads(world_size, job, wire_dtype=wire)
    rows = [wide_data(r, "float16", length).astype(np.float32).astype(wire_dtype)
            for r in range(world_size)]
    for index, mean in enumerate((False, True)):
        expected = reduce_rows_f64(rows, mean, wire_dtype).astype(np.float32)
        for result in results:
            assert result[index].tobytes() == expected.tobytes()


def test_the_schedule_is_the_one_with_fewer_bytes_on_the_busiest_link():
    # 4 float32 ranks, chunks of 1000: the link 3 -> 0 carries rows 1..3, 1..2 and 3 of three
    # chunks (6 chunks' worth) plus 3 finished chunks: 9 bytes per element; the chain 8 + 4
    assert link_bytes(4000, 4, 4) == {"ring": 9 * 4000, "chain": 12 * 4000}
    assert link_bytes(3000, 3, 4) == {"ring": 20000, "chain": 24000}  # 3 + 2 chunks of 4 bytes
    assert link_bytes(2000, 2, 4) == {"ring": 8000}  # the classic ring: one chunk each way
    assert plan(4000, 4, 4) == "ring" and plan(4000, 4, 8) == "chain"  # 18 against 16
    assert plan(10**6, 5, 4) == "ring" and plan(10**6, 6, 4) == "chain"
    assert plan(10**6, 6, 2) == "ring" and plan(10**6, 7, 2) == "chain"


def _wide_over(backend, world_size):
    return spawn(wide_reductions, world_size, backend=backend, timeout=60)


MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or \
    shutil.which("mpiexec")


def _wide_over_mpi(world_size, outdir):
    pytest.importorskip("mpi4py")
    if MPIEXEC is None:
        pytest.skip("mpiexec not found (pip install 'everyo-dist[mpi]')")
    done = subprocess.run([MPIEXEC, "-n", str(world_size), sys.executable,
                           str(HERE / "mpi_harness.py"), "wide", str(outdir)],
                          capture_output=True, text=True, timeout=120,
                          env={**os.environ, "OMP_NUM_THREADS": "1",
                               "OPENBLAS_NUM_THREADS": "1", "MKL_NUM_THREADS": "1"})
    assert done.returncode == 0, done.stderr
    results = []
    for rank in range(world_size):
        with np.load(Path(outdir) / f"rank{rank}.npz") as data:
            results.append({key: data[key] for key in data.files})
    return results


@pytest.mark.parametrize("world_size", [3, 4])
def test_tcp_shm_and_mpi_return_the_same_bits(world_size, tmp_path):
    over_tcp, over_shm = _wide_over("tcp", world_size), _wide_over("shm", world_size)
    _assert_canonical(over_tcp, world_size)
    for rank in range(world_size):
        assert over_tcp[rank].keys() == over_shm[rank].keys()
        for key, value in over_tcp[rank].items():
            assert value.tobytes() == over_shm[rank][key].tobytes(), (key, rank)
    over_mpi = _wide_over_mpi(world_size, tmp_path)
    for rank in range(world_size):
        for key, value in over_tcp[rank].items():
            assert value.tobytes() == over_mpi[rank][key].tobytes(), (key, rank)


def test_ddp_on_tcp_with_three_ranks_matches_average_gradients_bit_for_bit():
    # tiny buckets cut the gradient vector elsewhere than one flat all-reduce does; rank order
    # is elementwise, so the cuts cannot change a bit
    inputs, targets = make_data(rows=64)
    ddp = spawn(ddp_or_average, 3, args=(inputs, targets, True), backend="tcp", timeout=60)
    reference = spawn(ddp_or_average, 3, args=(inputs, targets, False), backend="tcp",
                      timeout=60)
    for rank in range(3):
        assert len(ddp[rank]) == len(reference[rank])
        for mine, theirs in zip(ddp[rank], reference[rank]):
            assert mine.dtype == theirs.dtype and mine.tobytes() == theirs.tobytes()


# -- a confused or hostile predecessor ----------------------------------------------------------

def _tcp_pair():
    """Two connected loopback TCP sockets (the ring names its peers' hosts)."""
    with socket.create_server(("127.0.0.1", 0)) as listener:
        near = socket.create_connection(listener.getsockname())
        far, _ = listener.accept()
    return near, far


def _lone_ring(rank, world_size, vector):
    """A :class:`Ring` for ``rank`` whose neighbours are the test: returns the ring, the
    socket the test writes prev's frames into, and the one it may read next's from."""
    to_next, next_end = _tcp_pair()
    from_prev, prev_end = _tcp_pair()
    ring = Ring(rank, world_size, to_next, from_prev)
    fingerprint = Fingerprint.of(0, CollectiveOp.ALL_REDUCE_SUM, vector)
    ring.call = Collective(rank, world_size, 5.0, time.monotonic() + 5.0, fingerprint)
    return ring, prev_end, next_end, fingerprint.pack()


def _frame(packed, step, array):
    return pack_data_header(DTYPE_CODE_OF[array.dtype], array.nbytes, packed, step) + \
        array.tobytes() + TRAILER_OK


def _reduce_against(rank, world_size, vector, frames):
    """Run ``rank``'s all-reduce with ``frames`` from its predecessor; the error it raises."""
    ring, prev_end, next_end, packed = _lone_ring(rank, world_size, vector)
    try:  # what the rank sends next is a few hundred bytes: the socket buffer holds it
        prev_end.sendall(b"".join(_frame(packed, step, array) for step, array in frames))
        with pytest.raises(DistributedError) as caught:
            ring.all_reduce(vector, False, np.empty_like(vector))
        return str(caught.value)
    finally:
        ring.close()
        prev_end.close()
        next_end.close()


# 3 ranks, 9 float32 items (chunks of 3). Rank 0: step 0 brings chunk 2 as rank 2's raw row
# (frame 0); step 1 brings chunk 1 as the raw rows of ranks 1 and 2 (frames 3 and 4). Rank 1:
# step 1 brings chunk 2 as rank 2's raw row (frame 3) then rank 0's own row (frame 4). Rank 2:
# step 1 brings chunk 0 as the float64 partial sum x0 + x1 (frame 3).
_ROW = np.arange(3, dtype=np.float32)
_X0 = (0, _ROW)  # what rank 1 receives first: rank 0's row of chunk 0


@pytest.mark.parametrize("rank, frames, problem", [
    (0, [(0, _ROW), (3, _ROW), (4, _ROW.astype(np.float64))],
     "rank 2 sent step 4 with 24 bytes (dtype code"),
    (0, [(0, _ROW), (3, _ROW[:2]), (4, _ROW)], "rank 2 sent step 3 with 8 bytes"),
    (0, [(0, _ROW), (3, _ROW), (5, _ROW)], "rank 2 sent step 5"),
    (0, [(0, _ROW.astype(np.int32))], "expected step 0 with 12 bytes of float32"),
    (1, [_X0, (3, _ROW), (4, _ROW.astype(np.float64))],
     "rank 0 sent step 4 with 24 bytes (dtype code"),
    (2, [(0, _ROW), (3, _ROW)], "expected step 3 with 24 bytes of float64"),
], ids=["raw-row-in-another-dtype", "short-part", "extra-part", "wrong-first-row",
        "partial-in-float64-where-rank-0-sends-its-row", "partial-not-in-float64"])
def test_every_part_of_a_ring_message_is_validated(rank, frames, problem):
    message = _reduce_against(rank, 3, np.ones(9, np.float32), frames)
    assert problem in message, message


def test_every_frame_of_the_chain_is_validated():
    # 8 float32 ranks take the chain: rank 1 expects rank 0's own row (float32), then the result
    vector = np.ones(16, np.float32)
    assert plan(vector.size, 8, 4) == "chain"
    message = _reduce_against(1, 8, vector, [(0, vector.astype(np.float64))])
    assert "rank 0 sent step 0 with 128 bytes" in message and "float32" in message, message


def test_non_native_byte_order_and_strided_inputs_reduce_like_their_native_values():
    # big-endian rows (e.g. loaded from a file written elsewhere) and strided views travel as
    # native contiguous copies: the same bits as the native rows, in a native-order result
    world_size, length = 3, 1001

    def job(group):
        mine = wide_data(group.rank, "float64", length)
        swapped = mine.astype(mine.dtype.newbyteorder())
        strided = np.repeat(mine, 2)[::2]
        return (group.all_reduce_sum(swapped), group.all_reduce_mean(swapped),
                group.all_reduce_sum(strided))

    results = _over_threads(world_size, job)
    rows = [wide_data(rank, "float64", length) for rank in range(world_size)]
    expected = [reduce_rows_f64(rows, mean, "float64") for mean in (False, True, False)]
    for result in results:
        for got, want in zip(result, expected):
            assert got.dtype == want.dtype and got.tobytes() == want.tobytes()
