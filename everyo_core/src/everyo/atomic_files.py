"""Atomic file writes shared by ``eo.save`` and ``eo.export_onnx``.

A file is written to a temporary file beside its target and renamed over it, so a crash never
leaves a half-written checkpoint or model. The temporary file is created with mode
``0o666 & ~umask``, as ``open()`` would create the target, and is named after the writing
process (``.everyo-<pid>@<host>-<random>.tmp``): the next write into the same directory
removes what a killed writer left behind. A public module (everyo-onnx's exporter uses it).
"""

from __future__ import annotations

import os
import secrets
import socket
import time
from typing import BinaryIO, Callable

from everyo.errors import (
    EveryOFileNotFoundError,
    EveryOIsADirectoryError,
    EveryOSerializationError,
)

_HOST = socket.gethostname().replace("-", "_")
_PREFIX, _SUFFIX = ".everyo-", ".tmp"
#: A temporary file this old is abandoned whoever wrote it (another host, an older EveryO).
STALE_AFTER_SECONDS = 3600.0


def remove_stale_temporaries(directory: str) -> list:
    """Delete the ``.everyo-*.tmp`` files that killed writes left in ``directory``.

    A temporary file is stale when it names a process of this host that no longer runs, or
    when it is older than :data:`STALE_AFTER_SECONDS`; a write still running (here or on
    another host sharing the directory) keeps its file. Returns the removed paths.
    """
    removed = []
    now = time.time()
    for name in os.listdir(directory):
        if not (name.startswith(_PREFIX) and name.endswith(_SUFFIX)):
            continue
        full = os.path.join(directory, name)
        owner = name[len(_PREFIX):].split("-", 1)[0]
        pid, _, host = owner.partition("@")
        try:
            dead = host == _HOST and pid.isdigit() and not _process_alive(int(pid))
            if dead or now - os.path.getmtime(full) > STALE_AFTER_SECONDS:
                os.unlink(full)
                removed.append(full)
        except OSError:  # gone already (another write cleaned it), or not ours to remove
            continue
    return removed


def _process_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:  # exists, owned by someone else
        return True
    return True


def _create_temporary(directory: str) -> tuple[int, str]:
    while True:
        name = f"{_PREFIX}{os.getpid()}@{_HOST}-{secrets.token_hex(6)}{_SUFFIX}"
        path = os.path.join(directory, name)
        try:
            # NOTE: mode 0o666 lets the umask decide, as for any new file (mkstemp: 0600)
            return os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o666), path
        except FileExistsError:
            continue


def file_path(path, caller: str) -> str:
    """``path`` (a ``str``, ``bytes`` or ``os.PathLike``) as a string; anything else (``None``,
    a number, an open file) is an ``EveryOSerializationError`` naming ``caller`` and the type."""
    try:
        path = os.fspath(path)
    except TypeError:
        raise EveryOSerializationError(f"{caller}: a path must be a str or os.PathLike, got "
                                       f"{type(path).__name__}") from None
    return os.fsdecode(path)


def require_file(path: str, caller: str) -> None:
    """Refuse a ``path`` that names no file, with an error that is also ``FileNotFoundError``."""
    if not os.path.exists(path):
        raise EveryOFileNotFoundError(f"{caller}: no such file: {path}")


def write_atomically(path, write: Callable[[BinaryIO], object], caller: str = "save") -> None:
    """Call ``write(file)`` on a new temporary file beside ``path``, then rename it over
    ``path``; on any failure (or interruption) the temporary file is removed and ``path`` is
    left as it was. Sweeps the directory's stale temporaries first."""
    path = file_path(path, caller)
    if not path:  # (abspath("") is the working directory: its parent would get the file)
        raise EveryOSerializationError(f"{caller}: the path is empty; name the file to write")
    directory = os.path.dirname(os.path.abspath(path))
    # NOTE: checked before anything is written: the final rename would raise OSError's own
    if not os.path.isdir(directory):
        raise EveryOFileNotFoundError(f"{caller}: the directory {directory} of {path} does "
                                      f"not exist; create it first")
    if os.path.isdir(path):
        raise EveryOIsADirectoryError(f"{caller}: {path} is a directory; name a file in it")
    remove_stale_temporaries(directory)
    fd, temporary = _create_temporary(directory)
    try:
        with os.fdopen(fd, "wb") as handle:
            write(handle)
            handle.flush()
            os.fsync(handle.fileno())
        os.replace(temporary, path)
    except BaseException:
        if os.path.exists(temporary):
            os.unlink(temporary)
        raise
