"""Multi-machine process groups: ``from everyo.distributed_tcp import TCPRendezvousServer``.

The names are those of the module a plugin registers as ``"distributed_tcp"`` (everyo-dist does);
without one, importing this raises an ``ImportError`` saying what to install.
"""

from everyo.install_hints import fill_from_public_module

__all__ = fill_from_public_module("distributed_tcp", globals())
