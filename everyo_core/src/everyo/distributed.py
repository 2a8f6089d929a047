"""Data-parallel training: ``from everyo.distributed import spawn, init, average_gradients``.

The names are those of the module a plugin registers as ``"distributed"`` through
``everyo_register_modules`` (everyo-dist does). Without one, importing this module raises an
``ImportError`` saying what to install.
"""

from everyo.first_party import public_module

_provider = public_module("distributed")
__all__ = list(_provider.__all__)
globals().update({name: getattr(_provider, name) for name in __all__})
