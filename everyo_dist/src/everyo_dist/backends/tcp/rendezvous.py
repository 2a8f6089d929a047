"""``TCPRendezvousServer``: where the ranks of a tcp job find each other.

Each worker connects, authenticates (``auth.py``), and registers its rank and the port of its
own peer listener. Once all ``world_size`` ranks of a round have registered, the server sends
every one of them the table of peer addresses and starts a new round; the workers then connect
to each other directly and the server carries no collective traffic. Anything that fails the
handshake or sends a malformed frame is logged, disconnected and forgotten: the server keeps
serving the legitimate ranks. At most ``MAX_PENDING_HANDSHAKES`` connections are
authenticated at once (``handshakes.py``), so a flood of silent connections cannot exhaust the
server's threads or lock the real ranks out.
"""

from __future__ import annotations

import logging
import select
import socket
import threading
import time
from collections import deque

import numpy as np

from everyo_dist.backends.tcp.auth import (
    DEFAULT_HANDSHAKE_TIMEOUT,
    accept_handshake,
    check_handshake_timeout,
    token_key,
)
from everyo_dist.backends.tcp.frames import FrameKind, abort_frame, control_frame, read_control
from everyo_dist.backends.tcp.handshakes import MAX_PENDING_HANDSHAKES, PendingHandshakes
from everyo_dist.backends.tcp.sockets import (
    ACCEPT_RETRY_SECONDS,
    accept_failure_passes,
    listen,
    require_token_off_loopback,
    tune,
    wrap_tls,
)
from everyo_dist.errors import DistributedError

log = logging.getLogger("everyo.distributed_tcp")

#: The most recent refusals kept in ``TCPRendezvousServer.refusals`` (a flood must not grow it).
KEPT_REFUSALS = 256


def _hung_up(sock: socket.socket) -> bool:
    """True when a parked registration's peer has closed its end (it died).

    A registered worker sends nothing more until it has the peer table, so a readable socket
    means end-of-file (or a protocol violation): either way the registration is void.
    """
    poller = select.poll()  # not select(): it fails on descriptors above 1023
    try:
        poller.register(sock, select.POLLIN)
        return bool(poller.poll(0))
    except (OSError, ValueError):
        return True


class TCPRendezvousServer:
    """Serve rendezvous for ``world_size`` ranks in a background thread.

    Args:
        host: address to bind; anything but loopback requires a ``token``.
        port: port to bind; 0 picks a free one (read it back from ``.port``).
        world_size: number of ranks that form one group.
        token: shared secret every rank must prove it holds (str or bytes).
        ssl_context: optional server-side ``ssl.SSLContext``; connections are then TLS first.
        handshake_timeout: seconds a connection may take to authenticate and register before
            it is dropped.
        max_pending_handshakes: connections authenticated at the same time; beyond it the
            oldest pending one is cut off.

    Example:
        >>> with TCPRendezvousServer(world_size=1, token="s3cret") as server:
        ...     server.port > 0
        True
    """

    def __init__(self, host: str = "127.0.0.1", port: int = 0, *, world_size: int,
                 token: str | bytes | None = None, ssl_context=None,
                 handshake_timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                 max_pending_handshakes: int = MAX_PENDING_HANDSHAKES):
        if isinstance(world_size, bool) or not isinstance(world_size, (int, np.integer)) \
                or world_size < 1:
            raise DistributedError(f"world_size must be a positive integer, got {world_size!r}")
        require_token_off_loopback(host, token, "the rendezvous server")
        self.host, self.world_size = host, int(world_size)
        self.handshake_timeout = check_handshake_timeout(handshake_timeout)
        # (peer address, reason) of the latest refusals, for diagnostics
        self.refusals: deque[tuple[str, str]] = deque(maxlen=KEPT_REFUSALS)
        self._key = token_key(token)
        self._ssl_context = ssl_context
        self._lock = threading.Lock()
        self._round: dict[int, tuple[socket.socket, str, int]] = {}
        self._closed = threading.Event()
        self._listener = listen(host, port)
        self.port = self._listener.getsockname()[1]
        self.handshakes = PendingHandshakes(max_pending_handshakes,
                                            name=f"everyo-rendezvous-{self.port}-handshake")
        self._thread = threading.Thread(target=self._accept_loop, daemon=True,
                                        name=f"everyo-rendezvous-{self.port}")
        self._thread.start()

    # -- lifecycle -------------------------------------------------------------------------
    def close(self) -> None:
        """Stop serving and drop every pending registration."""
        if self._closed.is_set():
            return
        self._closed.set()
        try:
            self._listener.shutdown(socket.SHUT_RDWR)
        except OSError:
            pass
        self._listener.close()
        self._thread.join(timeout=5)
        self.handshakes.close()
        with self._lock:
            for sock, _, _ in self._round.values():
                sock.close()
            self._round.clear()

    def __enter__(self) -> "TCPRendezvousServer":
        return self

    def __exit__(self, *exc) -> None:
        self.close()

    def __repr__(self) -> str:
        return f"TCPRendezvousServer({self.host}:{self.port}, world_size={self.world_size})"

    # -- serving ---------------------------------------------------------------------------
    def _accept_loop(self) -> None:
        failing = False
        while not self._closed.is_set():
            try:
                sock, address = self._listener.accept()
            except OSError as exc:
                if self._closed.is_set() or not accept_failure_passes(self._listener, exc):
                    return  # closed
                if not failing:  # once per streak: a shortage may last a while
                    log.warning("rendezvous %s:%d: accept failed (%s); retrying", self.host,
                                self.port, exc)
                failing = True
                time.sleep(ACCEPT_RETRY_SECONDS)
                continue
            failing = False
            self.handshakes.start(sock, address, self._serve)

    def _refuse(self, sock: socket.socket, peer: str, reason: str, tell: bool) -> None:
        log.warning("rendezvous %s:%d refused %s: %s", self.host, self.port, peer, reason)
        self.refusals.append((peer, reason))
        if tell:
            try:
                sock.settimeout(1.0)
                sock.sendall(abort_frame({"message": reason}))
            except OSError:
                pass
        sock.close()

    def _serve(self, sock: socket.socket, address, finished) -> None:
        peer = f"{address[0]}:{address[1]}"
        deadline = time.monotonic() + self.handshake_timeout
        try:
            tune(sock)
            sock = wrap_tls(sock, self._ssl_context, True, self.handshake_timeout, peer)
            accept_handshake(sock, self._key, self.handshake_timeout)
            registration = read_control(sock, deadline, FrameKind.REGISTER)
        except Exception as exc:  # wrong token, garbage, timeout: drop it, keep serving
            if self._closed.is_set():  # cut off by close(): not a refusal worth reporting
                sock.close()
                return
            self._refuse(sock, peer, f"{type(exc).__name__}: {exc}", tell=False)
            return
        if not finished():  # cut off by a flood of newer connections meanwhile
            sock.close()
            return
        rank, world_size, port = (registration.get(k) for k in ("rank", "world_size", "port"))
        if not all(isinstance(v, int) and not isinstance(v, bool) for v in (rank, world_size, port)):
            self._refuse(sock, peer, f"malformed registration {registration!r}", tell=True)
            return
        if world_size != self.world_size:
            self._refuse(sock, peer, f"rank {rank} says world_size={world_size} but the "
                         f"rendezvous server was started with world_size={self.world_size}",
                         tell=True)
            return
        if not 0 <= rank < self.world_size:
            self._refuse(sock, peer, f"rank {rank} is outside 0..{self.world_size - 1}",
                         tell=True)
            return
        if not 0 < port < 65536:
            self._refuse(sock, peer, f"rank {rank} registered peer port {port}, which no peer "
                         f"can connect to (a listening port is 1..65535)", tell=True)
            return
        with self._lock:
            for parked in [r for r, (other, _, _) in self._round.items() if _hung_up(other)]:
                # that process died before the group formed: forget it (its restart may come)
                log.warning("rendezvous: rank %d disconnected before the group formed", parked)
                self._round.pop(parked)[0].close()
            if rank in self._round:
                self._refuse(sock, peer, f"rank {rank} is already registered (from "
                             f"{self._round[rank][1]}); every rank needs a unique rank number",
                             tell=True)
                return
            self._round[rank] = (sock, address[0], port)
            if len(self._round) < self.world_size:
                return
            members, self._round = self._round, {}
        self._announce(members)

    def _announce(self, members: dict[int, tuple[socket.socket, str, int]]) -> None:
        peers = [[members[r][1], members[r][2]] for r in range(self.world_size)]
        message = control_frame(FrameKind.PEERS, {"peers": peers})
        for rank, (sock, host, _) in members.items():
            try:
                sock.settimeout(self.handshake_timeout)
                sock.sendall(message)
            except OSError as exc:
                log.warning("rendezvous could not send the peer table to rank %d at %s: %s",
                            rank, host, exc)
            finally:
                sock.close()
        log.info("rendezvous %s:%d formed a group of %d ranks", self.host, self.port,
                 self.world_size)
