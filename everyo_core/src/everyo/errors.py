"""The exception hierarchy every EveryO distribution raises from."""


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


class PluginError(EveryOError):
    """A plugin registered something invalid, or the same name twice."""


class MissingDistributionError(EveryOError, AttributeError):
    """``eo.<name>`` belongs to a first-party distribution that is not installed (or not loaded).

    An ``AttributeError``, so ``hasattr(eo, "autocast")`` stays a clean probe.
    """


class MissingDistributionModuleError(EveryOError, ImportError):
    """``import everyo.distributed`` without everyo-dist: the ``ImportError`` twin of
    :class:`MissingDistributionError`."""
