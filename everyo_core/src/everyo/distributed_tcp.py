"""Multi-machine process groups: ``from everyo.distributed_tcp import TCPRendezvousServer``.

The names are those of the module a plugin registers as ``"distributed_tcp"`` through
``everyo_register_modules`` (everyo-dist does). Without one, importing this module raises an
``ImportError`` saying what to install.
"""

from everyo.first_party import public_module

_provider = public_module("distributed_tcp")
__all__ = list(_provider.__all__)
globals().update({name: getattr(_provider, name) for name in __all__})
