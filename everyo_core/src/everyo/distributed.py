"""Data-parallel training: ``from everyo.distributed import spawn, init, average_gradients``.

The names are those of the module a plugin registers as ``"distributed"`` (everyo-dist does);
without one, importing this raises an ``ImportError`` saying what to install.
"""

from everyo.install_hints import fill_from_public_module

__all__ = fill_from_public_module("distributed", globals())
