"""Children that do not outlive their parent: ``spawn``'s workers and ``everyo-run``'s ranks."""

from __future__ import annotations

import ctypes
import signal

_PR_SET_PDEATHSIG = 1


def kill_me_when_parent_dies() -> None:
    """Ask the kernel to SIGKILL this process when its parent dies (Linux; a no-op elsewhere).

    Safe to call between fork and exec (``subprocess.Popen(preexec_fn=...)``): it only loads
    libc and makes one system call. The setting survives exec.
    """
    try:
        ctypes.CDLL(None, use_errno=True).prctl(_PR_SET_PDEATHSIG, signal.SIGKILL)
    except (OSError, AttributeError):
        pass
