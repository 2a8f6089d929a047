"""Optional TLS for the tcp backend: the contexts for a cluster that has its own CA."""

from __future__ import annotations

import ssl
from typing import NamedTuple

from everyo_dist.errors import DistributedError

TLS_VARIABLES = ("EVERYO_TLS_CERT", "EVERYO_TLS_KEY", "EVERYO_TLS_CA")


class TLSContexts(NamedTuple):
    """``server`` wraps connections a process accepts, ``client`` the ones it opens."""

    server: ssl.SSLContext
    client: ssl.SSLContext


def make_tls_contexts(certfile: str, keyfile: str, cafile: str) -> TLSContexts:
    """Mutual-TLS contexts: present ``certfile`` and accept only peers signed by ``cafile``.

    Ranks connect to each other by IP address, so certificates are verified against the
    cluster CA rather than a host name (``check_hostname`` is off). The shared token is still
    checked inside the encrypted channel.

    Args:
        certfile: this node's certificate (PEM), signed by the cluster CA.
        keyfile: its private key (PEM).
        cafile: the cluster CA certificate (PEM) every peer's certificate must chain to.
    Returns:
        ``TLSContexts(server, client)``; pass ``server`` to ``TCPRendezvousServer(ssl_context=)``
        and ``server_ssl_context=``, ``client`` to ``init_tcp_process_group(ssl_context=)``.
    """
    server = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    client = ssl.SSLContext(ssl.PROTOCOL_TLS_CLIENT)
    for context in (server, client):
        context.minimum_version = ssl.TLSVersion.TLSv1_2
        context.load_cert_chain(certfile, keyfile)
        context.load_verify_locations(cafile)
        context.verify_mode = ssl.CERT_REQUIRED
    client.check_hostname = False
    return TLSContexts(server, client)


def tls_contexts_from_environment(environ, certfile: str | None = None,
                                  keyfile: str | None = None,
                                  cafile: str | None = None) -> TLSContexts | None:
    """The contexts for the PEM files given, else named by ``EVERYO_TLS_CERT``,
    ``EVERYO_TLS_KEY`` and ``EVERYO_TLS_CA``; None when none is set (TLS off).

    Example:
        >>> tls_contexts_from_environment({}) is None
        True
    """
    files = [given or environ.get(variable)
             for given, variable in zip((certfile, keyfile, cafile), TLS_VARIABLES)]
    if not any(files):
        return None
    if not all(files):
        raise DistributedError("TLS needs all three of tls_cert, tls_key and tls_ca "
                               "(EVERYO_TLS_CERT, EVERYO_TLS_KEY, EVERYO_TLS_CA)")
    return make_tls_contexts(*files)
