"""Attacks and faults against the tcp backend: the server survives each one, refuses it
visibly, and legitimate ranks still complete. Kills and hangs are bounded in time."""

from __future__ import annotations

import logging
import os
import signal
import socket
import struct
import time

import numpy as np
import pytest
from tcp_harness import finish, mean_over_threads, start_ranks

from everyo.distributed import DistributedError
from everyo.distributed_tcp import AuthenticationError, TCPRendezvousServer, init_tcp_process_group
from everyo_dist.backends.tcp import rendezvous
from everyo_dist.backends.tcp.auth import connect_handshake, token_key
from everyo_dist.backends.tcp.frames import HEADER_SIZE, FrameKind, pack_header

TOKEN = "correct horse battery staple"


def _legitimate_ranks_complete(server):
    means = mean_over_threads(server.port, token=TOKEN)
    for mean in means:
        np.testing.assert_array_equal(mean, np.full(3, 0.5, np.float32))


def _closed_by_server(sock, within=5.0):
    """True when the server closes ``sock`` (EOF or reset) within ``within`` seconds."""
    sock.settimeout(within)
    try:
        while sock.recv(4096):
            pass
    except ConnectionResetError:
        return True
    except TimeoutError:
        return False
    return True


def _authenticated_socket(server, token=TOKEN):
    sock = socket.create_connection(("127.0.0.1", server.port), timeout=5)
    connect_handshake(sock, token_key(token), 5, "the test server")
    return sock


def test_wrong_token_is_refused_on_both_sides_and_the_server_keeps_serving(caplog):
    with TCPRendezvousServer(world_size=2, token=TOKEN) as server:
        with caplog.at_level(logging.WARNING, logger="everyo.distributed_tcp"):
            with pytest.raises(AuthenticationError, match="refused this process's token"):
                init_tcp_process_group("127.0.0.1", server.port, rank=0, world_size=2,
                                       token="guess", timeout=5)
            with pytest.raises(AuthenticationError, match="wrong or missing"):
                init_tcp_process_group("127.0.0.1", server.port, rank=0, world_size=2,
                                       timeout=5)  # no token at all
            deadline = time.monotonic() + 5
            while len(server.refusals) < 2 and time.monotonic() < deadline:
                time.sleep(0.01)
        assert len(server.refusals) == 2
        assert all("AuthenticationError" in reason for _, reason in server.refusals)
        assert sum("refused" in r.message for r in caplog.records) == 2
        _legitimate_ranks_complete(server)


def test_a_server_that_does_not_know_the_token_is_not_trusted_by_the_worker():
    # the client checks the server's proof too: an impostor server accepting any answer fails
    with socket.create_server(("127.0.0.1", 0)) as impostor:
        port = impostor.getsockname()[1]
        import threading

        def fake_server():
            conn, _ = impostor.accept()
            with conn:
                conn.sendall(b"EOTH" + bytes([1]) + os.urandom(32))
                conn.recv(68)
                conn.sendall(bytes([1]) + os.urandom(32))  # "accepted", with a forged proof
                time.sleep(0.5)

        thread = threading.Thread(target=fake_server)
        thread.start()
        with pytest.raises(AuthenticationError, match="could not prove it knows the token"):
            init_tcp_process_group("127.0.0.1", port, rank=0, world_size=2, token=TOKEN,
                                   timeout=5)
        thread.join()


def test_no_token_on_a_non_loopback_address_is_refused_before_binding(monkeypatch):
    def must_not_bind(*args, **kwargs):
        raise AssertionError("the server bound a socket without a token")

    monkeypatch.setattr(rendezvous, "listen", must_not_bind)
    for host in ("0.0.0.0", "10.77.0.1"):
        with pytest.raises(DistributedError, match="without a token"):
            TCPRendezvousServer(host, 0, world_size=2)
        with pytest.raises(DistributedError, match="without a token"):
            TCPRendezvousServer(host, 0, world_size=2, token="")


def test_garbage_from_a_raw_socket_is_dropped():
    with TCPRendezvousServer(world_size=2, token=TOKEN) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as sock:
            sock.sendall(b"GET / HTTP/1.1\r\nHost: x\r\n\r\n" + os.urandom(4096))
            assert _closed_by_server(sock)
        _legitimate_ranks_complete(server)
        assert any("bad handshake magic" in reason for _, reason in server.refusals)


def test_an_oversized_length_is_refused_without_reading_it():
    with TCPRendezvousServer(world_size=2, token=TOKEN) as server:
        with _authenticated_socket(server) as sock:
            sock.sendall(pack_header(FrameKind.REGISTER, "uint8", 2**40))
            assert _closed_by_server(sock)
        with _authenticated_socket(server) as sock:  # a data frame bigger than its shape
            header = bytearray(pack_header(FrameKind.REGISTER, "uint8", 10))
            struct.pack_into("<Q", header, 12, 2**62)
            sock.sendall(bytes(header))
            assert _closed_by_server(sock)
        _legitimate_ranks_complete(server)
        assert sum("more than the" in reason for _, reason in server.refusals) == 2


def test_unknown_frame_kinds_and_versions_are_refused():
    with TCPRendezvousServer(world_size=2, token=TOKEN) as server:
        for offset, value in ((5, 99), (4, 7)):  # kind 99; version 7
            with _authenticated_socket(server) as sock:
                header = bytearray(pack_header(FrameKind.REGISTER, "uint8", 2))
                header[offset] = value
                sock.sendall(bytes(header) + b"{}")
                assert _closed_by_server(sock)
        _legitimate_ranks_complete(server)
        reasons = " ".join(reason for _, reason in server.refusals)
        assert "unknown frame kind 99" in reasons and "version 7" in reasons


def test_a_truncated_frame_is_dropped():
    with TCPRendezvousServer(world_size=2, token=TOKEN, handshake_timeout=1.0) as server:
        with _authenticated_socket(server) as sock:  # half a header, then hang up
            sock.sendall(pack_header(FrameKind.REGISTER, "uint8", 40)[:HEADER_SIZE // 2])
        with _authenticated_socket(server) as sock:  # full header, short payload, then silence
            sock.sendall(pack_header(FrameKind.REGISTER, "uint8", 40) + b'{"rank":')
            assert _closed_by_server(sock, within=5)
        _legitimate_ranks_complete(server)
        deadline = time.monotonic() + 5
        while len(server.refusals) < 2 and time.monotonic() < deadline:
            time.sleep(0.01)
        assert len(server.refusals) == 2


def test_a_connection_that_never_finishes_the_handshake_is_dropped_after_the_timeout():
    with TCPRendezvousServer(world_size=2, token=TOKEN, handshake_timeout=0.5) as server:
        with socket.create_connection(("127.0.0.1", server.port)) as silent:
            started = time.monotonic()
            _legitimate_ranks_complete(server)  # not blocked by the silent connection
            assert _closed_by_server(silent, within=5)
            assert time.monotonic() - started < 4
        assert any("timed out" in reason for _, reason in server.refusals)


@pytest.mark.parametrize("world_size", [3, 6])  # 6 float32 ranks run the chain schedule
def test_a_sigkilled_rank_is_named_by_the_others_within_the_timeout(tmp_path, world_size):
    with TCPRendezvousServer(world_size=world_size, token="test-token") as server:
        procs = start_ranks("hammer", world_size, server.port, tmp_path, extra=(1, tmp_path))
        ready = tmp_path / "ready"
        deadline = time.monotonic() + 30
        while not ready.exists() and time.monotonic() < deadline:
            time.sleep(0.02)
        assert ready.exists(), "rank 1 never got going"
        time.sleep(0.2)  # well inside the all-reduce loop
        killed_at = time.time()
        os.kill(int(ready.read_text()), signal.SIGKILL)
        outputs = finish(procs, 30)
    for rank in (0, *range(2, world_size)):
        error_file = tmp_path / f"rank{rank}.err"
        assert error_file.exists(), f"rank {rank} saw no error: {outputs}"
        kind, when, message = error_file.read_text().split("|", 2)
        assert kind == "PeerLostError", message
        assert "rank 1" in message and "all_reduce_mean" in message
        assert float(when) - killed_at < 10  # the group timeout is 30 s: this is detection
        if rank == 2:  # its ring predecessor was rank 1: the link itself is named
            assert "link between rank 2 (127.0.0.1) and rank 1 (127.0.0.1)" in message, message
            assert "died" in message, message


def test_a_rank_that_never_arrives_is_named_in_the_timeout(tmp_path, monkeypatch):
    monkeypatch.setitem(__import__("tcp_harness").WORKER_ENV, "EVERYO_TIMEOUT", "2")
    with TCPRendezvousServer(world_size=2, token="test-token") as server:
        procs = start_ranks("skip", 2, server.port, tmp_path, extra=(1,))
        started = time.monotonic()
        finish(procs[:1], 20)
        elapsed = time.monotonic() - started
        procs[1].kill()
        procs[1].wait()
    kind, _, message = (tmp_path / "rank0.err").read_text().split("|", 2)
    assert kind == "CollectiveTimeoutError", message
    assert "all_reduce_sum #0" in message and "rank 1" in message
    assert elapsed < 15


def test_a_rank_that_died_before_the_group_formed_can_be_restarted():
    with TCPRendezvousServer(world_size=2, token=TOKEN) as server:
        from everyo_dist.backends.tcp.frames import FrameKind, control_frame

        with _authenticated_socket(server) as ghost:  # registers rank 0, then dies
            ghost.sendall(control_frame(FrameKind.REGISTER, {"rank": 0, "world_size": 2,
                                                             "port": 9}))
            time.sleep(0.2)
        _legitimate_ranks_complete(server)  # the real rank 0 replaces the dead registration
