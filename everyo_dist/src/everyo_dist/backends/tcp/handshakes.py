"""``PendingHandshakes``: a cap on the connections a tcp listener is still authenticating.

The rendezvous server and every rank's peer listener accept connections from anyone who can
reach the port and authenticate each one in a thread of its own, so that a silent stranger
cannot delay a real peer. Without a cap, a flood of connections that never speak would start
one thread per connection until the process runs out of threads. With it, at most
``MAX_PENDING_HANDSHAKES`` handshakes run at once; when a new connection arrives while the
table is full, the OLDEST pending handshake is cut off (its socket is shut down, which wakes
its thread at once) and the newcomer takes its place.

Why the oldest and not the newcomer: a real peer finishes its handshake in milliseconds, while
a flood's connections sit silent until the handshake timeout. Refusing newcomers would let
``MAX_PENDING_HANDSHAKES`` silent connections lock every real peer out for that whole timeout;
evicting the oldest means a flood only ever displaces other flood connections, unless it opens
``MAX_PENDING_HANDSHAKES`` new connections within one real handshake.
"""

from __future__ import annotations

import itertools
import logging
import socket
import threading
import time
from collections import OrderedDict

log = logging.getLogger("everyo.distributed_tcp")

#: Connections one listener authenticates at the same time (each holds one thread).
MAX_PENDING_HANDSHAKES = 64


def _cut_off(guard: socket.socket) -> None:
    try:
        guard.shutdown(socket.SHUT_RDWR)  # wakes the thread blocked reading from it
    except OSError:
        pass
    guard.close()


class PendingHandshakes:
    """Run one handshake thread per accepted connection, at most ``limit`` at a time.

    Args:
        limit: how many handshakes may be pending at once.
        name: prefix of the threads' names (for debugging).

    Example:
        >>> table = PendingHandshakes(limit=2, name="doc")
        >>> table.limit, table.evicted
        (2, 0)
    """

    def __init__(self, limit: int = MAX_PENDING_HANDSHAKES, name: str = "everyo-handshake"):
        if int(limit) < 1:
            raise ValueError(f"limit must be at least 1, got {limit}")
        self.limit, self.name = int(limit), name
        self.evicted = 0  # handshakes cut off to make room, for diagnostics and tests
        self._lock = threading.Lock()
        # id -> a duplicate of the connection's descriptor: shutting it down reaches the
        # connection even after the thread has wrapped its own socket in TLS
        self._pending: OrderedDict[int, socket.socket] = OrderedDict()
        self._threads: set[threading.Thread] = set()
        self._ids = itertools.count()

    def __len__(self) -> int:
        with self._lock:
            return len(self._pending)

    def start(self, sock: socket.socket, address, serve) -> None:
        """Authenticate ``sock`` with ``serve(sock, address, finished)`` in a new thread.

        ``serve`` must call ``finished()`` once the handshake has succeeded and before it keeps
        the socket; ``finished()`` returns False when the handshake was cut off meanwhile (the
        socket is then dead and ``serve`` must drop it).
        """
        try:
            guard = sock.dup()
        except OSError:  # out of descriptors: this connection cannot be served
            sock.close()
            return
        with self._lock:
            while len(self._pending) >= self.limit:
                _, oldest = self._pending.popitem(last=False)
                self.evicted += 1
                _cut_off(oldest)
            key = next(self._ids)
            self._pending[key] = guard
        if self.evicted and self.evicted % self.limit == 1:
            log.warning("%s: more than %d connections pending authentication; cutting off "
                        "the oldest (%d so far)", self.name, self.limit, self.evicted)

        def finished() -> bool:
            with self._lock:
                mine = self._pending.pop(key, None)
            if mine is None:
                return False
            mine.close()
            return True

        def run() -> None:
            try:
                serve(sock, address, finished)
            finally:
                finished()  # a failed handshake frees its place too
                with self._lock:
                    self._threads.discard(thread)

        thread = threading.Thread(target=run, daemon=True, name=f"{self.name}-{key}")
        with self._lock:
            self._threads.add(thread)
        thread.start()

    def close(self, timeout: float = 2.0) -> None:
        """Cut off every pending handshake (the listener is shutting down) and wait up to
        ``timeout`` seconds for their threads to end."""
        with self._lock:
            pending, self._pending = list(self._pending.values()), OrderedDict()
            threads = list(self._threads)
        for guard in pending:
            _cut_off(guard)
        deadline = time.monotonic() + timeout
        for thread in threads:
            thread.join(max(deadline - time.monotonic(), 0))
