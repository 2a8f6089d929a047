"""The exception hierarchy every EveryO distribution raises from."""

from __future__ import annotations

import math
from contextlib import contextmanager
from typing import Iterator


class EveryOError(Exception):
    """Base class of every error EveryO raises on purpose."""

    #: The module path a layer error was raised under (set once by ``Module.__call__``).
    _everyo_layer_path: object = None


class EveryOSerializationError(EveryOError):
    """Saving, loading or exporting a model failed (corrupt file, unsupported layer, ...)."""


class EveryOFileNotFoundError(EveryOSerializationError, FileNotFoundError):
    """A file to load does not exist (also a ``FileNotFoundError``, as PyTorch raises)."""


class EveryOIsADirectoryError(EveryOSerializationError, IsADirectoryError):
    """A file to write is a directory (also an ``IsADirectoryError``, what ``open`` raises)."""


class EveryOIndexError(EveryOError, IndexError):
    """An index is out of range or malformed for the tensor's shape."""


class EveryOMemoryError(EveryOError, MemoryError):
    """An array is too large to allocate (also a ``MemoryError``, as NumPy and PyTorch raise);
    the message names what was being created, the shape, the dtype and the bytes."""


#: NumPy's words for a size past what an index can count (a ``ValueError``, not a
#: ``MemoryError``): ``np.empty(2**63)`` and ``np.empty((10**30,))``.
_TOO_BIG = ("array is too big", "Maximum allowed dimension exceeded")


@contextmanager
def allocating(what: str, shape: tuple | None = None, dtype=None) -> Iterator[None]:
    """Turn NumPy's failure to allocate inside the block into an :class:`EveryOMemoryError`
    naming ``what`` (``"zeros"``, ``"Linear(...)"``), the shape and the bytes. Without
    ``shape``/``dtype`` they are read from NumPy's error (its ``ArrayMemoryError`` carries
    them). The one place EveryO names an allocation that cannot be made.

    Example:
        >>> import numpy as np
        >>> try:
        ...     with allocating("zeros", (10**8, 10**8), np.dtype("float32")):
        ...         np.zeros((10**8, 10**8), np.float32)
        ... except MemoryError as exc:
        ...     print(type(exc).__name__, str(exc)[:61])
        EveryOMemoryError zeros: a float32 tensor of shape (100000000, 100000000) needs
    """
    try:
        yield
    except (MemoryError, ValueError) as exc:
        if isinstance(exc, ValueError) and not any(words in str(exc) for words in _TOO_BIG):
            raise
        shape = tuple(shape) if shape is not None else getattr(exc, "shape", None)
        dtype = dtype if dtype is not None else getattr(exc, "dtype", None)
        if shape is None or dtype is None:
            raise EveryOMemoryError(f"{what}: a tensor is too large to allocate "
                                    f"({type(exc).__name__}: {exc})") from None
        raise EveryOMemoryError(f"{what}: a {dtype.name} tensor of shape {tuple(shape)} needs "
                                f"{_bytes(math.prod(shape) * dtype.itemsize)} bytes, more than "
                                f"can be allocated") from None


def _bytes(needed: int) -> str:
    """``needed`` to 3 digits; past a float's range (where ``:.3g`` raises OverflowError)
    its leading digit and power of ten."""
    if needed < 10**300:
        return f"{needed:.3g}"
    power = int(math.log10(needed))  # (not len(str()): Python caps int-to-str at 4300 digits)
    while needed // 10**power >= 10:
        power += 1
    while needed // 10**power == 0:
        power -= 1
    return f"about {needed // 10**power}e+{power}"


class PluginError(EveryOError):
    """A plugin registered something invalid, or the same name twice."""


class MissingDistributionError(EveryOError, AttributeError):
    """``eo.<name>`` belongs to a first-party distribution that is not installed (or not loaded).

    An ``AttributeError``, so ``hasattr(eo, "autocast")`` stays a clean probe.
    """


class MissingDistributionModuleError(EveryOError, ImportError):
    """``import everyo.distributed`` without everyo-dist: the ``ImportError`` twin of
    :class:`MissingDistributionError`."""
