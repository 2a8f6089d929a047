"""What ``spawn`` prepares for a job of ``tcp`` workers: a loopback rendezvous with a fresh
token, so that ``spawn(..., backend="tcp")`` needs no more arguments than ``"shm"`` does."""

from __future__ import annotations

import secrets
from contextlib import contextmanager

from everyo_dist.backends.tcp.rendezvous import TCPRendezvousServer


@contextmanager
def host_launch_rendezvous(host: str, port: int, world_size: int, token: str | None,
                           ssl_context):
    """The rendezvous ``everyo-run`` hosts on node 0 for the job's ranks; yields its port."""
    with TCPRendezvousServer(host, port, world_size=world_size, token=token,
                             ssl_context=ssl_context) as server:
        yield server.port


@contextmanager
def prepare_tcp_job(world_size: int, options: dict):
    """Host the rendezvous for the job's workers unless the caller named one (``master_port``).

    Args:
        world_size: number of workers.
        options: the factory options the caller chose.
    Yields:
        ``options`` completed with ``master_addr``, ``master_port`` and ``token``.
    """
    if "master_port" in options:
        yield options
        return
    token = options.get("token") or secrets.token_hex(32)
    with host_launch_rendezvous("127.0.0.1", 0, world_size, token, None) as port:
        yield {**options, "token": token, "master_addr": "127.0.0.1", "master_port": port}
