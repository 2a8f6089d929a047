"""Sleeping until a word of shared memory changes: Linux futexes, through ctypes.

A rank that waits for its peers should neither burn a core (its peer may need it) nor sleep a
fixed quantum (latency). ``futex(FUTEX_WAIT)`` sleeps in the kernel until the word at an address
differs from the value the waiter last saw — checked atomically, so a wake-up cannot be lost —
and ``futex(FUTEX_WAKE)`` wakes the sleepers after a store. Shared (not private) futexes work
across processes that map the same segment. Where futexes are unavailable (not Linux, unknown
architecture), :func:`futex_available` is False and the caller polls instead.
"""

from __future__ import annotations

import ctypes
import errno
import platform
import sys

_SYS_FUTEX = {"x86_64": 202, "amd64": 202, "aarch64": 98, "arm64": 98}.get(platform.machine())
FUTEX_WAIT, FUTEX_WAKE = 0, 1
_WAKE_ALL = 0x7FFFFFFF


class _Timespec(ctypes.Structure):
    _fields_ = [("tv_sec", ctypes.c_long), ("tv_nsec", ctypes.c_long)]


def _load_syscall():
    if not sys.platform.startswith("linux") or _SYS_FUTEX is None:
        return None
    try:
        syscall = ctypes.CDLL(None, use_errno=True).syscall
    except (OSError, AttributeError):
        return None
    syscall.restype = ctypes.c_long
    syscall.argtypes = [ctypes.c_long, ctypes.c_void_p, ctypes.c_int, ctypes.c_int,
                        ctypes.c_void_p, ctypes.c_void_p, ctypes.c_int]
    return syscall


_syscall = _load_syscall()


def futex_available() -> bool:
    return _syscall is not None


def low32(value: int) -> int:
    """The low 32 bits of ``value`` as a signed int: what a futex sees of a little-endian int64."""
    return ((value & 0xFFFFFFFF) ^ 0x80000000) - 0x80000000


def futex_wait(address: int, seen: int, timeout: float) -> None:
    """Sleep until the 32-bit word at ``address`` no longer holds ``seen`` (or ``timeout``
    seconds pass, or a signal arrives); returns at once if it already differs."""
    whole = int(timeout)
    spec = _Timespec(whole, int((timeout - whole) * 1e9))
    if _syscall(_SYS_FUTEX, address, FUTEX_WAIT, seen, ctypes.byref(spec), None, 0) == -1:
        code = ctypes.get_errno()
        if code not in (errno.EAGAIN, errno.ETIMEDOUT, errno.EINTR):
            raise OSError(code, f"futex wait failed: {errno.errorcode.get(code, code)}")


def futex_wake(address: int) -> None:
    """Wake every process sleeping on the word at ``address``."""
    _syscall(_SYS_FUTEX, address, FUTEX_WAKE, _WAKE_ALL, None, None, 0)
