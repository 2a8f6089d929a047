"""Socket plumbing shared by the rendezvous server and the workers: address checks, dialing
with retries, optional TLS wrapping."""

from __future__ import annotations

import errno
import ipaddress
import socket
import time

import numpy as np

from everyo_dist.errors import DistributedError

# Large enough that a 40 MB collective moves in few system calls; the kernel caps it at
# net.core.{w,r}mem_max.
SOCKET_BUFFER_BYTES = 4 * 1024 * 1024


def is_loopback(host: str) -> bool:
    """True when ``host`` names this machine only (``127.0.0.0/8``, ``::1``, ``localhost``).

    Example:
        >>> is_loopback("127.0.0.1"), is_loopback("localhost"), is_loopback("0.0.0.0")
        (True, True, False)
    """
    if host == "localhost":
        return True
    try:
        return ipaddress.ip_address(host).is_loopback
    except ValueError:
        return False  # a host name: assume it is reachable from elsewhere


def require_token_off_loopback(host: str, token, what: str) -> None:
    """Refuse to expose an unauthenticated endpoint to a network."""
    if not token and not is_loopback(host):
        raise DistributedError(
            f"refusing to bind {what} to {host!r} without a token: anyone who can reach that "
            "address could join the job. Pass token=... (or set EVERYO_TOKEN / use "
            "everyo-run --token-file), or bind 127.0.0.1 for a single machine")


def check_port(port, what: str, listening: bool = False) -> int:
    """``port`` as an int in 1..65535 (0 too when ``listening``: any free port).

    NOTE: the resolver takes a port above 65535 modulo 65536 (99999 dials 34463, maybe another
    job's server), and a negative one fails only as "service not supported" retried until the
    timeout; bind() raises a bare OverflowError. Refused here, by name, before any of that.

    Example:
        >>> check_port(29500, "the rendezvous server"), check_port(0, "a listener", True)
        (29500, 0)
    """
    lowest = 0 if listening else 1
    if isinstance(port, str) and port.strip().isdigit():  # (from a command line, a file)
        port = int(port)
    if isinstance(port, bool) or not isinstance(port, (int, np.integer)) \
            or not lowest <= port <= 65535:
        raise DistributedError(f"{what}: port must be an integer in {lowest}..65535, got "
                               f"{port!r}")
    return int(port)


# accept() failures that pass: no descriptor or buffer free right now, or a connection that
# was reset while it waited in the backlog. The listener itself is fine.
_PASSING_ACCEPT_ERRORS = frozenset({errno.EMFILE, errno.ENFILE, errno.ENOBUFS, errno.ENOMEM,
                                    errno.ECONNABORTED, errno.EPROTO, errno.EINTR})
ACCEPT_RETRY_SECONDS = 0.05


def accept_failure_passes(listener: socket.socket, exc: OSError) -> bool:
    """Whether an accept loop should wait ``ACCEPT_RETRY_SECONDS`` and go on after ``exc``
    rather than stop: True unless the listener was closed or shut down. Stopping on any error
    let one moment without a free descriptor end a rendezvous server (or a peer listener)
    for good, and every rank after it failed its handshake."""
    return listener.fileno() >= 0 and exc.errno in _PASSING_ACCEPT_ERRORS


def tune(sock: socket.socket) -> socket.socket:
    """Disable Nagle (collectives are latency-bound) and enlarge the kernel buffers."""
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    for option in (socket.SO_SNDBUF, socket.SO_RCVBUF):
        try:
            sock.setsockopt(socket.SOL_SOCKET, option, SOCKET_BUFFER_BYTES)
        except OSError:  # pragma: no cover - some kernels refuse; defaults still work
            pass
    return sock


def listen(host: str, port: int, backlog: int = 64) -> socket.socket:
    """A listening TCP socket on ``host:port`` (``port=0``: any free port)."""
    port = check_port(port, f"cannot listen on {host}", listening=True)
    family = socket.AF_INET6 if ":" in host else socket.AF_INET
    sock = socket.socket(family, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    try:
        sock.bind((host, port))
    except OSError as exc:
        sock.close()
        raise DistributedError(f"cannot listen on {host}:{port}: {exc}") from None
    sock.listen(backlog)
    return sock


def dial(host: str, port: int, deadline: float, what: str) -> socket.socket:
    """Connect to ``host:port``, retrying until ``deadline`` while nobody listens yet."""
    port = check_port(port, f"cannot connect to {what} at {host}")
    delay = 0.02
    last_error: Exception | None = None
    while True:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise DistributedError(f"could not connect to {what} at {host}:{port} before the "
                                   f"timeout ({last_error}); is it running and reachable?")
        try:
            sock = socket.create_connection((host, port), timeout=min(remaining, 5.0))
            return tune(sock)
        except OSError as exc:  # refused, unreachable, timed out: the server may be starting
            last_error = exc
            time.sleep(min(delay, max(deadline - time.monotonic(), 0)))
            delay = min(delay * 2, 0.5)


def wrap_tls(sock: socket.socket, context, server_side: bool, timeout: float,
             where: str, server_hostname: str | None = None) -> socket.socket:
    """Run the TLS handshake on ``sock`` when a context is given (else return it unchanged)."""
    if context is None:
        return sock
    sock.settimeout(timeout)
    try:
        if server_side:
            return context.wrap_socket(sock, server_side=True)
        return context.wrap_socket(sock, server_hostname=server_hostname)
    except OSError as exc:  # ssl.SSLError is an OSError
        sock.close()
        raise DistributedError(f"TLS handshake with {where} failed: {exc}") from None
