"""Multi-machine process groups over authenticated TCP (``everyo.distributed_tcp``).

Start a :class:`TCPRendezvousServer` somewhere every rank can reach, then call
:func:`init_tcp_process_group` on every rank; the group's collectives run over a ring of
direct, authenticated worker-to-worker connections. See ``docs/distributed.md``.
"""

from everyo_dist.backends.tcp.auth import AuthenticationError
from everyo_dist.backends.tcp.frames import ProtocolError
from everyo_dist.backends.tcp.group import TCPProcessGroup, init_tcp_process_group
from everyo_dist.backends.tcp.rendezvous import TCPRendezvousServer
from everyo_dist.backends.tcp.tls import make_tls_contexts

__all__ = ["TCPRendezvousServer", "init_tcp_process_group", "TCPProcessGroup",
           "make_tls_contexts", "AuthenticationError", "ProtocolError"]
