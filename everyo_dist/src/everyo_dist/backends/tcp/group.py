"""``init_tcp_process_group``: join a rendezvous, connect the ring, return a ``ProcessGroup``."""

from __future__ import annotations

import logging
import os
import queue
import threading
import time

import numpy as np

from everyo_dist.backends.tcp.auth import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    AuthenticationError,
    accept_handshake,
    check_handshake_timeout,
    connect_handshake,
    token_key,
)
from everyo_dist.backends.tcp.compression import compresses, wire_dtype_of
from everyo_dist.backends.tcp.frames import (
    FrameKind,
    ProtocolError,
    check_peer_table,
    control_frame,
    read_control,
)
from everyo_dist.backends.tcp.handshakes import PendingHandshakes
from everyo_dist.backends.tcp.rendezvous import TCPRendezvousServer
from everyo_dist.backends.tcp.ring import Ring
from everyo_dist.backends.tcp.sockets import (
    ACCEPT_RETRY_SECONDS,
    accept_failure_passes,
    dial,
    is_loopback,
    listen,
    require_token_off_loopback,
    wrap_tls,
)
from everyo_dist.backends.tcp.tls import tls_contexts_from_environment
from everyo_dist.contract import Collective
from everyo_dist.errors import DistributedError
from everyo_dist.fingerprint import CollectiveOp
from everyo_dist.group import (
    ProcessGroup,
    SingleRankTransport,
    check_membership,
)
from everyo_dist.recycling import ResultBuffers

log = logging.getLogger("everyo.distributed_tcp")


class TCPProcessGroup(ProcessGroup):
    """A process group whose collectives run over an authenticated TCP ring.

    Create it with :func:`init_tcp_process_group` (or ``eo.distributed.init(backend="tcp")``).
    """

    rendezvous = None  # the TCPRendezvousServer this rank hosts (serve_rendezvous), if any

    def close(self) -> None:
        super().close()
        if self.rendezvous is not None:
            self.rendezvous.close()


class TCPTransport:
    """The tcp backend's transport: the collectives of :class:`Ring`, and on any failure an
    ABORT frame downstream so the peers learn the reason now instead of at their timeout."""

    name = "tcp"

    def __init__(self, ring: Ring, wire_dtype: np.dtype | None = None):
        self._ring = ring
        self._wire = wire_dtype
        self._results = ResultBuffers()

    # Every data frame carries the sender's fingerprint and the receiver checks it against its
    # own (ring.py), so only the barrier spends a round on fingerprints alone.
    def exchange_fingerprints(self, call: Collective, packed: bytes) -> list[bytes]:
        if call.fingerprint.op == CollectiveOp.BARRIER:
            self._guarded(call, self._ring.barrier)
        return [packed] * call.world_size

    def all_reduce(self, call: Collective, flat: np.ndarray, mean: bool,
                   out: np.ndarray) -> None:
        if compresses(self._wire, flat.dtype):  # see compression.py for the accuracy cost
            # NOTE: values past the wire dtype's range become inf, as documented; NumPy's
            # overflow warning would be a raw exception under -W error (or a warnings filter)
            with np.errstate(over="ignore"):
                narrow = flat.astype(self._wire)
                np.copyto(out, self._guarded(call, self._ring.all_reduce, narrow, mean,
                                             self._results.like(narrow)), casting="unsafe")
        elif np.may_share_memory(flat, out):  # the ring still sends from flat while out fills
            np.copyto(out, self._guarded(call, self._ring.all_reduce, flat, mean,
                                         self._results.like(flat)))
        else:
            self._guarded(call, self._ring.all_reduce, flat, mean, out)

    def broadcast(self, call: Collective, flat: np.ndarray, src: int) -> np.ndarray:
        return self._guarded(call, self._ring.broadcast, flat, src)

    def all_gather(self, call: Collective, flat: np.ndarray) -> np.ndarray:
        return self._guarded(call, self._ring.all_gather, flat)

    def _guarded(self, call: Collective, primitive, *args):
        self._ring.call = call
        try:
            return primitive(*args)
        except BaseException as exc:
            self._ring.abort(exc)  # peers learn now instead of at their timeout
            raise

    def scratch_bytes(self) -> int:
        """Bytes of work buffers the ring keeps between collectives (see ``Ring.scratch``)."""
        return self._ring.scratch_bytes()

    def local_host(self) -> str:
        """The address this rank's ring connections use (its host as its peers see it)."""
        return self._ring.to_next.getsockname()[0]

    def close(self) -> None:
        self._ring.close()


def init_tcp_process_group(host: str, port: int, *, rank: int, world_size: int,
                           token: str | bytes | None = None, timeout: float | None = None,
                           ssl_context=None, server_ssl_context=None,
                           handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                           wire_dtype: str | None = None) -> TCPProcessGroup:
    """Join the job whose ``TCPRendezvousServer`` listens on ``host:port``.

    Registers with the server (retrying until ``timeout`` if it is not up yet), learns where
    the other ranks listen, and connects to the next rank of the ring while accepting the
    previous one. Every connection is authenticated with ``token`` in both directions.

    Args:
        host: the rendezvous server's address.
        port: its port.
        rank: this process's rank, unique in ``0 .. world_size - 1``.
        world_size: number of ranks; must match the server's.
        token: the shared secret (required when any address involved is not loopback).
        timeout: seconds to wait for the group to form, and for each collective afterwards.
        ssl_context: client-side ``ssl.SSLContext`` for outgoing connections (TLS).
        server_ssl_context: server-side context for the connection the previous rank opens to
            this one; required with ``ssl_context`` when ``world_size > 1``.
        handshake_timeout: seconds a peer may take to authenticate.
        wire_dtype: ``"float16"`` or ``"bfloat16"`` to send float reductions compressed
            (see ``everyo_dist.backends.tcp.compression`` for the accuracy cost); every rank
            must pass the same. None (default): exact.
    Returns:
        A ``TCPProcessGroup``.

    Example:
        >>> from everyo.distributed_tcp import TCPRendezvousServer, init_tcp_process_group
        >>> with TCPRendezvousServer(world_size=1, token="t") as server:
        ...     with init_tcp_process_group("127.0.0.1", server.port, rank=0, world_size=1,
        ...                                 token="t", timeout=10) as group:
        ...         print(group.all_reduce_mean(np.float32([1.0, 2.0])))
        [1. 2.]
    """
    rank, world_size, timeout = check_membership(rank, world_size, timeout)
    handshake_timeout = check_handshake_timeout(handshake_timeout)
    wire = wire_dtype_of(wire_dtype)
    if (ssl_context is None) != (server_ssl_context is None) and world_size > 1:
        raise DistributedError("TLS between ranks needs both ssl_context (outgoing) and "
                               "server_ssl_context (incoming); see make_tls_contexts()")
    key = token_key(token)
    deadline = time.monotonic() + timeout
    listener, peers = _register(host, port, rank, world_size, token, key, deadline, timeout,
                                ssl_context, handshake_timeout)
    if world_size == 1:
        listener.close()
        return TCPProcessGroup(rank, world_size, SingleRankTransport("tcp"), timeout)
    try:
        to_next, from_prev = _connect_ring(int(rank), int(world_size), peers, listener, key,
                                           deadline, handshake_timeout, ssl_context,
                                           server_ssl_context)
    finally:
        listener.close()
    return TCPProcessGroup(rank, world_size, TCPTransport(Ring(rank, world_size, to_next, from_prev), wire),
                           timeout)


def _register(host, port, rank, world_size, token, key, deadline, timeout, ssl_context,
              handshake_timeout):
    """Register with the rendezvous server at ``host:port``; ``(listener, peer table)``, the
    listener being where this rank's previous rank connects."""
    where = f"the rendezvous server {host}:{port}"
    server = dial(host, port, deadline, "the rendezvous server")
    try:
        server = wrap_tls(server, ssl_context, False, handshake_timeout, where, host)
        connect_handshake(server, key, handshake_timeout, where)
        local_host = server.getsockname()[0]
        require_token_off_loopback(local_host, token, f"rank {rank}'s peer listener")
        listener = listen(local_host, 0)
        try:
            server.sendall(control_frame(FrameKind.REGISTER, {
                "rank": int(rank), "world_size": int(world_size),
                "port": listener.getsockname()[1]}))
            return listener, check_peer_table(read_control(server, deadline, FrameKind.PEERS),
                                              world_size)
        except BaseException as exc:
            listener.close()
            raise _registration_error(exc, rank, world_size, timeout, where) from None
    finally:
        server.close()


def _registration_error(exc: BaseException, rank, world_size, timeout, where) -> BaseException:
    """What a failed registration reports (``exc`` itself when it is not a known failure)."""
    if isinstance(exc, TimeoutError):
        return DistributedError(f"rank {rank}: the group did not form within {timeout:g}s "
                                f"(not all {world_size} ranks registered with {where})")
    if isinstance(exc, ProtocolError):
        return DistributedError(f"rank {rank}: {where} answered with an invalid frame: {exc}")
    if isinstance(exc, DistributedError):
        return DistributedError(f"rank {rank}: {where} refused the registration: {exc}")
    if isinstance(exc, OSError):  # closed or reset after the handshake: stopped, or dropped us
        return DistributedError(f"rank {rank}: {where} closed the connection before sending "
                                f"the peer table ({exc}); was it stopped, or did it drop "
                                f"this registration (see its log)?")
    return exc


def _connect_ring(rank, world_size, peers, listener, key, deadline, handshake_timeout,
                  ssl_context, server_ssl_context):
    """Accept prev (in a thread, so two ranks dialing each other cannot deadlock) and dial
    next; each connection is authenticated and then names its rank."""
    prev_rank, next_rank = (rank - 1) % world_size, (rank + 1) % world_size
    acceptor = _PeerAcceptor(listener, prev_rank, key, deadline, handshake_timeout,
                             server_ssl_context)
    next_host, next_port = peers[next_rank]
    where = f"rank {next_rank} at {next_host}:{next_port}"
    try:
        to_next = dial(next_host, int(next_port), deadline, f"rank {next_rank}")
        try:
            to_next = wrap_tls(to_next, ssl_context, False, handshake_timeout, where, next_host)
            connect_handshake(to_next, key, handshake_timeout, where)
            to_next.sendall(control_frame(FrameKind.IDENTIFY, {"rank": rank}))
        except BaseException:
            to_next.close()
            raise
        try:
            from_prev = acceptor.wait()
        except BaseException:
            to_next.close()
            raise
    finally:
        acceptor.stop()
    return to_next, from_prev


class _PeerAcceptor:
    """Accepts connections on this rank's peer listener until rank ``expected`` has
    authenticated. Each connection's handshake runs in a thread of its own, so a silent or
    slow stranger (the listener's port is in the peer table every rank receives) is dropped
    at its handshake timeout without delaying the real peer; ``PendingHandshakes`` caps how
    many such threads a flood can start."""

    def __init__(self, listener, expected: int, key, deadline, handshake_timeout, ssl_context):
        self.expected, self.deadline = expected, deadline
        self._listener, self._key = listener, key
        self._handshake_timeout, self._ssl_context = handshake_timeout, ssl_context
        self._found = queue.Queue(maxsize=1)
        self._handshakes = PendingHandshakes(name=f"everyo-accept-rank-{expected}-handshake")
        self._stopped = threading.Event()
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"everyo-accept-rank-{expected}")
        self._thread.start()

    def wait(self):
        """The authenticated socket from rank ``expected``, or an error at the deadline."""
        try:
            return self._found.get(timeout=max(self.deadline - time.monotonic(), 0) + 0.1)
        except queue.Empty:
            raise DistributedError(f"rank {self.expected} did not connect before the "
                                   f"timeout") from None

    def stop(self) -> None:
        self._stopped.set()
        self._thread.join(timeout=1.0)
        self._handshakes.close()

    def _accept_loop(self) -> None:
        self._listener.settimeout(0.1)
        failing = False
        while not self._stopped.is_set() and time.monotonic() < self.deadline:
            try:
                sock, address = self._listener.accept()
            except (TimeoutError, BlockingIOError):
                continue
            except OSError as exc:
                if not accept_failure_passes(self._listener, exc):
                    return  # the listener was closed
                if not failing:  # once per streak: a shortage may last a while
                    log.warning("peer listener: accept failed (%s); retrying", exc)
                failing = True
                time.sleep(ACCEPT_RETRY_SECONDS)
                continue
            failing = False
            self._handshakes.start(sock, address, self._handshake)

    def _handshake(self, sock, address, finished) -> None:
        peer = f"{address[0]}:{address[1]}"
        try:
            sock.setblocking(True)
            sock = wrap_tls(sock, self._ssl_context, True, self._handshake_timeout, peer)
            accept_handshake(sock, self._key, self._handshake_timeout)
            who = read_control(sock, time.monotonic() + self._handshake_timeout,
                               FrameKind.IDENTIFY)
        except (AuthenticationError, OSError, DistributedError) as exc:
            log.warning("peer listener refused %s: %s: %s", peer, type(exc).__name__, exc)
            sock.close()
            return
        if not finished():  # cut off by a flood of newer connections meanwhile
            sock.close()
            return
        if who.get("rank") != self.expected:
            log.warning("peer listener refused %s: it claims rank %r, expected rank %d",
                        peer, who.get("rank"), self.expected)
            sock.close()
            return
        try:
            self._found.put_nowait(sock)
        except queue.Full:  # a second connection claiming the same rank: keep the first
            log.warning("peer listener refused %s: rank %d is already connected", peer,
                        self.expected)
            sock.close()


def create_tcp_group(rank: int, world_size: int, master_addr: str | None = None,
                     master_port: int | None = None, token: str | None = None,
                     timeout: float | None = None, tls_cert: str | None = None,
                     tls_key: str | None = None, tls_ca: str | None = None,
                     handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                     wire_dtype: str | None = None,
                     serve_rendezvous: bool = False) -> TCPProcessGroup:
    """The ``"tcp"`` backend factory behind ``eo.distributed.init(backend="tcp", ...)``.

    Arguments left out come from the environment (``EVERYO_RANK`` ..., or another launcher's
    variables: see ``everyo_dist.environment``), ``EVERYO_TOKEN`` (or ``EVERYO_TOKEN_FILE``)
    and ``EVERYO_TIMEOUT``; TLS is on when ``tls_cert``/``tls_key``/``tls_ca`` (or
    ``EVERYO_TLS_CERT``, ``EVERYO_TLS_KEY``, ``EVERYO_TLS_CA``) name the PEM files. A
    ``TCPRendezvousServer`` must be listening on ``master_addr:master_port`` (``everyo-run``
    starts one); with ``serve_rendezvous`` this rank hosts it there for the group's life
    (what ``init()`` asks of rank 0 under torchrun, Slurm or ``mpiexec``).
    """
    if master_addr is None or master_port is None:
        raise DistributedError("the tcp backend needs the rendezvous address: pass master_addr= "
                               "and master_port=, or set EVERYO_MASTER_ADDR and "
                               "EVERYO_MASTER_PORT (everyo-run sets them), or MASTER_ADDR and "
                               "MASTER_PORT under another launcher")
    contexts = tls_contexts_from_environment(os.environ, tls_cert, tls_key, tls_ca)
    server, client = contexts if contexts else (None, None)
    rendezvous = _serve_rendezvous(master_addr, int(master_port), world_size, token, server) \
        if serve_rendezvous else None
    try:
        group = init_tcp_process_group(master_addr, int(master_port), rank=rank,
                                       world_size=world_size, token=token, timeout=timeout,
                                       ssl_context=client, server_ssl_context=server,
                                       handshake_timeout=handshake_timeout,
                                       wire_dtype=wire_dtype)
    except BaseException:
        if rendezvous is not None:
            rendezvous.close()
        raise
    group.rendezvous = rendezvous
    return group


def _serve_rendezvous(master_addr: str, port: int, world_size: int, token, ssl_context):
    """Host the job's rendezvous on ``port``: on ``master_addr`` when it is a loopback address,
    else on every interface (this host is the master; a name such as Slurm's ``node01`` may
    resolve to an address its peers cannot reach, Debian's ``127.0.1.1``)."""
    host = master_addr if is_loopback(master_addr) else "0.0.0.0"
    # (a port in use is a DistributedError naming host and port; no token off loopback too)
    return TCPRendezvousServer(host, port, world_size=int(world_size), token=token,
                               ssl_context=ssl_context)
