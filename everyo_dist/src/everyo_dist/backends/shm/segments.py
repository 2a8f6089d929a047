"""POSIX shared-memory segments that cannot outlive the job that made them.

Every segment is named ``everyo-<pid>-<job>-<part>``: ``pid`` is the process responsible for
the segment (the ``spawn`` parent, or rank 0 of a group created by ``init``), ``job`` a random
id shared by all segments of one job. Names are unlinked as soon as every rank has mapped the
segment (a mapping outlives its name), the ``spawn`` parent removes whatever its job left after
the workers stopped, and :func:`sweep_stale_segments` — called whenever a job starts — removes
segments whose responsible process is dead (a parent killed with SIGKILL never cleans up).

We use ``_posixshmem`` + ``mmap`` directly rather than ``multiprocessing.shared_memory``:
the latter registers every segment with a resource-tracker process that unlinks and warns on
its own schedule, which fights the explicit lifetime above.
"""

from __future__ import annotations

import _posixshmem
import mmap
import os
import re
import secrets
from pathlib import Path

PREFIX = "everyo-"
_NAME = re.compile(r"^everyo-(\d+)-([0-9a-f]+)-")
SHM_DIRECTORY = Path("/dev/shm")


def new_job_id() -> str:
    """A random id naming one job's segments."""
    return secrets.token_hex(6)


def segment_name(job: str, part: str, owner_pid: int | None = None) -> str:
    """``everyo-<pid>-<job>-<part>``; the pid defaults to the calling process's."""
    return f"{PREFIX}{owner_pid if owner_pid is not None else os.getpid()}-{job}-{part}"


def parse_name(name: str) -> tuple[int, str] | None:
    """``(owner_pid, job)`` of one of our segment names, else None."""
    match = _NAME.match(name.lstrip("/"))
    return (int(match.group(1)), match.group(2)) if match else None


class Segment:
    """One mapped shared-memory segment; ``.buf`` is a writable memoryview of it."""

    def __init__(self, name: str, size: int, create: bool):
        self.name = name
        flags = os.O_RDWR | (os.O_CREAT | os.O_EXCL if create else 0)
        fd = _posixshmem.shm_open("/" + name, flags, mode=0o600)
        try:
            if create:
                os.ftruncate(fd, size)
            else:
                size = os.fstat(fd).st_size
            self._mmap = mmap.mmap(fd, size)
        except BaseException:
            if create:
                unlink(name)
            raise
        finally:
            os.close(fd)
        self.size = size
        self.buf = memoryview(self._mmap)

    def close(self) -> None:
        """Unmap (the name stays until :func:`unlink`)."""
        if self.buf is not None:
            try:
                self.buf.release()
                self._mmap.close()
            except BufferError:  # a NumPy view still points into it; unmapped when collected
                pass
            self.buf = None


def unlink(name: str) -> bool:
    """Remove the name ``name``; True if it existed."""
    try:
        _posixshmem.shm_unlink("/" + name)
        return True
    except FileNotFoundError:
        return False


def process_alive(pid: int) -> bool:
    """Whether ``pid`` is a live (not zombie) process."""
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
        return stat.rsplit(")", 1)[1].split()[0] != "Z"
    except (OSError, IndexError):
        return True


def our_segments(job: str | None = None) -> list[str]:
    """Names of EveryO segments in /dev/shm (of one job, when given) owned by this user."""
    try:
        entries = list(SHM_DIRECTORY.iterdir())
    except OSError:
        return []
    names = []
    for entry in entries:
        parsed = parse_name(entry.name)
        if parsed is None or (job is not None and parsed[1] != job):
            continue
        try:
            if entry.stat().st_uid != os.getuid():
                continue
        except OSError:
            continue
        names.append(entry.name)
    return names


def remove_job_segments(job: str) -> list[str]:
    """Unlink every segment of ``job``; returns the names removed."""
    return [name for name in our_segments(job) if unlink(name)]


def sweep_stale_segments() -> list[str]:
    """Unlink segments whose responsible process is dead; returns the names removed."""
    removed = []
    for name in our_segments():
        pid, _ = parse_name(name)
        if not process_alive(pid) and unlink(name):
            removed.append(name)
    return removed
