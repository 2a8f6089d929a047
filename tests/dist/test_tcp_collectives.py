"""The tcp backend with real processes on loopback: every primitive against the float64
reference, bit-identical ranks, the documented MLP, mismatches, TLS, start-up order."""

from __future__ import annotations

import socket
import time

import numpy as np
import pytest
from dist_workers import make_data, rank_data, train_single_process
from tcp_harness import (
    finish,
    load_results,
    make_test_certificates,
    mean_over_threads,
    run_ranks,
    run_threads,
    start_ranks,
)

import everyo.distributed as dist
from everyo.distributed import DistributedError
from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group, make_tls_contexts
from everyo_dist.reduction import reduce_rows_f64

SHAPES = [(5, 7), (1,), (0,), (1001,)]


@pytest.fixture(scope="module", params=[2, 3])
def primitive_results(request, tmp_path_factory):
    world_size = request.param
    return world_size, run_ranks("primitives", world_size, tmp_path_factory.mktemp("tcp"))


def test_every_primitive_matches_the_float64_reference(primitive_results):
    world_size, results = primitive_results
    for dtype in ("float32", "float64"):
        for index, shape in enumerate(SHAPES):
            rows = [rank_data(r, shape, dtype, seed=index).reshape(-1) for r in range(world_size)]
            key = f"{dtype}-{index}"
            for op, mean in (("sum", False), ("mean", True)):
                expected = reduce_rows_f64(rows, mean, dtype).reshape(shape)
                for result in results:
                    got = result[f"{op}-{key}"]
                    assert got.dtype == np.dtype(dtype) and got.shape == shape
                    assert got.tobytes() == expected.tobytes(), (op, key)  # rank order
            stacked = np.stack([r.reshape(shape) for r in rows])
            for result in results:
                np.testing.assert_array_equal(result[f"gather-{key}"], stacked)
                np.testing.assert_array_equal(result[f"bcast-{key}"], stacked[-1])
    for result in results:
        np.testing.assert_array_equal(result["int-sum"],
                                      np.arange(5) * sum(range(1, world_size + 1)))
        assert result["int-sum"].dtype == np.int64


def test_ranks_are_bit_identical(primitive_results):
    world_size, results = primitive_results
    assert [int(r["rank"]) for r in results] == list(range(world_size))
    for key in results[0]:
        if key in ("rank", "is_main"):
            continue
        for other in results[1:]:
            assert results[0][key].tobytes() == other[key].tobytes(), key


@pytest.mark.parametrize("world_size", [2, 4])  # 256 rows: equal shards, so equal arithmetic
def test_spec_mlp_matches_single_process_training(world_size, tmp_path):
    results = run_ranks("train", world_size, tmp_path)
    inputs, targets = make_data()
    reference = train_single_process(inputs, targets)
    for index, expected in enumerate(reference):
        for result in results:
            np.testing.assert_allclose(result[f"w{index}"], expected, atol=1e-5, rtol=0)
            assert result[f"w{index}"].tobytes() == results[0][f"w{index}"].tobytes()


def test_mismatched_shapes_name_both_ranks(tmp_path):
    with TCPRendezvousServer(world_size=2, token="test-token") as server:
        procs = start_ranks("mismatch", 2, server.port, tmp_path)
        finish(procs, 40)
    for rank in range(2):
        kind, _, message = (tmp_path / f"rank{rank}.err").read_text().split("|", 2)
        assert kind == "CollectiveMismatchError", message
        assert "float32[4]" in message and "float32[5]" in message
        assert f"rank {rank} called" in message and f"rank {1 - rank} called" in message


def test_init_through_the_backend_registry_and_environment(monkeypatch):
    with TCPRendezvousServer(world_size=2, token="env-token") as server:
        monkeypatch.setenv("EVERYO_MASTER_ADDR", "127.0.0.1")
        monkeypatch.setenv("EVERYO_MASTER_PORT", str(server.port))
        monkeypatch.setenv("EVERYO_TOKEN", "env-token")
        monkeypatch.setenv("EVERYO_WORLD_SIZE", "2")

        def rank_job(rank):
            with dist.init(backend="tcp", rank=rank, timeout=20) as group:
                assert group.backend == "tcp" and group.world_size == 2
                return group.all_gather(np.int32([rank]))

        for gathered in run_threads(rank_job, 2):
            np.testing.assert_array_equal(gathered, [[0], [1]])


@pytest.fixture(scope="module")
def tls_files(tmp_path_factory):
    return make_test_certificates(tmp_path_factory.mktemp("tls"))


def test_tls_carries_the_same_collectives(tls_files):
    server_ctx, client_ctx = make_tls_contexts(tls_files["node.pem"], tls_files["node.key"],
                                               tls_files["ca.pem"])
    with TCPRendezvousServer(world_size=2, token="tls-token", ssl_context=server_ctx) as server:
        means = mean_over_threads(server.port, token="tls-token", ssl_context=client_ctx,
                                   server_ssl_context=server_ctx)
        for mean in means:
            np.testing.assert_array_equal(mean, np.full(3, 0.5, np.float32))
        # a plaintext client is refused by the TLS server, which keeps serving
        with pytest.raises(DistributedError):
            init_tcp_process_group("127.0.0.1", server.port, rank=0, world_size=2,
                                   token="tls-token", timeout=3, handshake_timeout=2)
        means = mean_over_threads(server.port, token="tls-token", ssl_context=client_ctx,
                                   server_ssl_context=server_ctx)
        assert means[0].tobytes() == means[1].tobytes()


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def test_workers_started_before_the_server_retry_until_it_is_up(tmp_path):
    port = _free_port()
    procs = start_ranks("primitives", 2, port, tmp_path)
    time.sleep(1.5)  # the workers are dialing a closed port by now
    with TCPRendezvousServer(port=port, world_size=2, token="test-token"):
        finish(procs, 50)
    assert len(load_results(tmp_path, 2)) == 2


def test_no_server_fails_within_the_timeout_naming_the_address():
    port = _free_port()
    started = time.monotonic()
    with pytest.raises(DistributedError, match=f"127.0.0.1:{port}"):
        init_tcp_process_group("127.0.0.1", port, rank=0, world_size=2, token="t", timeout=1.0)
    assert time.monotonic() - started < 5


def test_a_group_that_never_forms_times_out_naming_the_world_size():
    with TCPRendezvousServer(world_size=3, token="t") as server:
        started = time.monotonic()
        with pytest.raises(DistributedError, match="not all 3 ranks"):
            init_tcp_process_group("127.0.0.1", server.port, rank=0, world_size=3, token="t",
                                   timeout=1.0)
        assert time.monotonic() - started < 5



def test_result_buffers_are_recycled_only_when_nobody_holds_them():
    with TCPRendezvousServer(world_size=2, token="t") as server:
        def rank_job(rank):
            with init_tcp_process_group("127.0.0.1", server.port, rank=rank, world_size=2,
                                        token="t", timeout=20) as group:
                vector = np.full(1 << 19, rank, np.float32)  # 2 MB: recycled size
                kept = group.all_reduce_sum(vector)
                view = group.all_reduce_sum(vector)[:10]  # the buffer lives on in the view
                dropped_address = group.all_reduce_sum(vector).ctypes.data
                again = group.all_reduce_sum(vector + 1)
                return kept, view, dropped_address, again

        for kept, view, dropped_address, again in run_threads(rank_job, 2):
            np.testing.assert_array_equal(kept, 1.0)  # untouched by the later calls
            np.testing.assert_array_equal(view, 1.0)
            np.testing.assert_array_equal(again, 3.0)
            assert again.ctypes.data == dropped_address  # the unreferenced one came back


def test_spawn_over_tcp_trains_to_the_same_bits_as_shm():
    from dist_workers import train_worker

    inputs, targets = make_data()
    over_tcp = dist.spawn(train_worker, world_size=2, args=(inputs, targets), backend="tcp",
                          timeout=60)
    over_shm = dist.spawn(train_worker, world_size=2, args=(inputs, targets), timeout=60)
    reference = train_single_process(inputs, targets)
    for rank in range(2):
        for ours, shm, single in zip(over_tcp[rank], over_shm[0], reference):
            np.testing.assert_array_equal(ours, shm)  # two ranks: the same rank-order sum
            np.testing.assert_allclose(ours, single, atol=1e-5)
