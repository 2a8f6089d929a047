"""Mutual HMAC-SHA256 challenge-response: both ends prove they hold the shared token.

Every connection (worker to rendezvous server, worker to worker) runs this before a single
frame is read. The accepting side sends a random nonce; the connecting side answers with its
own nonce and ``HMAC(token, "client" | server nonce | client nonce)``; the accepting side checks
it with ``hmac.compare_digest`` and, only if it matches, proves itself with
``HMAC(token, "server" | client nonce | server nonce)``. The token itself never crosses the
wire, fresh nonces make a recorded exchange useless for replay, and the role labels stop a
peer from reflecting one side's answer back at it.
"""

from __future__ import annotations

import hashlib
import hmac
import secrets
import struct
import time

from everyo_dist.backends.tcp.frames import ProtocolError, recv_exact
from everyo_dist.errors import DistributedError
from everyo_dist.group import MAX_TIMEOUT

NONCE_SIZE = 32
DIGEST_SIZE = 32
_HELLO = struct.Struct(f"<4sB{NONCE_SIZE}s")           # accepting side: magic, version, nonce
_ANSWER = struct.Struct(f"<4s{NONCE_SIZE}s{DIGEST_SIZE}s")  # connecting side
_VERDICT = struct.Struct(f"<B{DIGEST_SIZE}s")          # accepting side: accepted?, proof
HELLO_MAGIC, ANSWER_MAGIC = b"EOTH", b"EOTA"
VERSION = 1
DEFAULT_HANDSHAKE_TIMEOUT = 10.0


def check_handshake_timeout(value) -> float:
    """``handshake_timeout`` as a positive, finite number of seconds, else a DistributedError
    (socket timeouts refuse inf, NaN and negatives with bare OverflowError/ValueError).

    Example:
        >>> check_handshake_timeout(10)
        10.0
    """
    try:
        seconds = float(value)
    except (TypeError, ValueError):
        seconds = float("nan")
    if isinstance(value, bool) or not 0 < seconds <= MAX_TIMEOUT:
        raise DistributedError(f"handshake_timeout must be a positive number of seconds, at "
                               f"most {MAX_TIMEOUT:g}, got {value!r}")
    return seconds


class AuthenticationError(DistributedError):
    """The other end does not hold the same token (or is not an EveryO peer at all)."""


def token_key(token: str | bytes | None) -> bytes:
    """The HMAC key for ``token``; no token is the empty key (allowed on loopback only)."""
    if token is None:
        return b""
    return token.encode("utf-8") if isinstance(token, str) else bytes(token)


def _mac(key: bytes, label: bytes, first: bytes, second: bytes) -> bytes:
    return hmac.new(key, b"everyo-tcp-v1 " + label + first + second, hashlib.sha256).digest()


def accept_handshake(sock, key: bytes, timeout: float = DEFAULT_HANDSHAKE_TIMEOUT) -> None:
    """Authenticate the peer that connected to us, then prove ourselves to it.

    Raises ``AuthenticationError`` (after telling the peer it was refused) on a wrong token,
    ``ProtocolError`` on bytes that are not a handshake, ``TimeoutError`` when the peer does not
    finish within ``timeout`` seconds.
    """
    deadline = time.monotonic() + timeout
    server_nonce = secrets.token_bytes(NONCE_SIZE)
    sock.settimeout(timeout)
    sock.sendall(_HELLO.pack(HELLO_MAGIC, VERSION, server_nonce))
    magic, client_nonce, answer = _ANSWER.unpack(
        recv_exact(sock, _ANSWER.size, deadline, "the handshake answer"))
    if magic != ANSWER_MAGIC:
        raise ProtocolError(f"bad handshake magic {magic!r} (not an EveryO tcp peer)")
    if not hmac.compare_digest(answer, _mac(key, b"client", server_nonce, client_nonce)):
        sock.sendall(_VERDICT.pack(0, bytes(DIGEST_SIZE)))
        raise AuthenticationError("the connecting peer does not know the token")
    sock.sendall(_VERDICT.pack(1, _mac(key, b"server", client_nonce, server_nonce)))


def connect_handshake(sock, key: bytes, timeout: float = DEFAULT_HANDSHAKE_TIMEOUT,
                      where: str = "the server") -> None:
    """Prove we hold the token to the side we connected to, and check its proof in return."""
    deadline = time.monotonic() + timeout
    sock.settimeout(timeout)
    try:
        magic, version, server_nonce = _HELLO.unpack(
            recv_exact(sock, _HELLO.size, deadline, f"the handshake from {where}"))
        if magic != HELLO_MAGIC:
            raise ProtocolError(f"{where} is not an EveryO tcp endpoint (bad handshake magic)")
        if version != VERSION:
            raise ProtocolError(f"{where} speaks handshake version {version}, this side "
                                f"{VERSION}; run the same everyo-dist version everywhere")
        client_nonce = secrets.token_bytes(NONCE_SIZE)
        sock.sendall(_ANSWER.pack(ANSWER_MAGIC, client_nonce,
                                  _mac(key, b"client", server_nonce, client_nonce)))
        accepted, proof = _VERDICT.unpack(
            recv_exact(sock, _VERDICT.size, deadline, f"the handshake verdict from {where}"))
    except ConnectionError as exc:
        raise AuthenticationError(f"{where} closed the connection during the authentication "
                                  f"handshake ({exc}); is the token right?") from None
    except TimeoutError:
        raise AuthenticationError(f"{where} did not complete the authentication handshake "
                                  f"within {timeout:g}s (not an EveryO tcp endpoint, or it "
                                  "expects TLS and this side did not use it?)") from None
    if not accepted:
        raise AuthenticationError(f"{where} refused this process's token: the token is wrong "
                                  "or missing (pass the same token= / EVERYO_TOKEN to every "
                                  "rank and to the rendezvous server)")
    if not hmac.compare_digest(proof, _mac(key, b"server", client_nonce, server_nonce)):
        raise AuthenticationError(f"{where} could not prove it knows the token; refusing to "
                                  "talk to it (wrong token on its side, or an impostor)")
