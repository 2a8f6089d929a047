"""Keep the memory of freed large arrays for the next training step (glibc's malloc).

A training step allocates and frees the same large arrays every step: activations, window
matrices, gradients, communication buffers. glibc's malloc gives each freed block above its
trim threshold back to the kernel, so the next step's arrays are fresh pages, and every 4 KiB
page costs a page fault that zeroes it: a large share of a convolutional step's time (measured
in docs/benchmarks.md, "Latest figures"). A caching allocator (PyTorch's on the GPU, jemalloc
or tcmalloc by ``LD_PRELOAD``) keeps that memory instead; on glibc the same is two settings,
applied when ``everyo`` is imported:

* ``M_MMAP_THRESHOLD`` = 32 MiB (the most glibc's own dynamic threshold ever grows to): arrays
  below it come from the heap, where freed blocks are reused, rather than from a private mapping
  unmapped at ``free``;
* ``M_TRIM_THRESHOLD`` = 1 GiB: up to that much freed memory at the top of the heap stays
  mapped rather than being returned to the kernel.

The cost: a process's resident memory stays near its high-water mark instead of shrinking
between steps, and fragmentation can take it above what the process ever had in use: a freed
block below one still in use is neither returned to the kernel nor big enough for a larger
array (an example is measured in docs/benchmarks.md, "Memory the malloc settings keep").
Nothing is changed when the interpreter does not run on glibc, when
``EVERYO_MALLOC_TUNING=0``, or when the user already sets the thresholds or padding
(``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``, ``MALLOC_TOP_PAD_``,
``MALLOC_MMAP_MAX_``, or ``glibc.malloc`` tunables in ``GLIBC_TUNABLES``); other ``MALLOC_*``
variables (``MALLOC_ARENA_MAX``, ``MALLOC_PERTURB_``, ...) keep their effect and do not stop it.
"""

from __future__ import annotations

import ctypes
import os

ENV = "EVERYO_MALLOC_TUNING"
MMAP_THRESHOLD = 32 * 1024 * 1024
TRIM_THRESHOLD = 1024 * 1024 * 1024
_M_TRIM_THRESHOLD, _M_MMAP_THRESHOLD = -1, -3  # glibc's <malloc.h>
_USER_SETTINGS = ("MALLOC_MMAP_THRESHOLD_", "MALLOC_TRIM_THRESHOLD_", "MALLOC_TOP_PAD_",
                  "MALLOC_MMAP_MAX_")
_OFF = ("0", "false", "no", "off")

#: Whether :func:`tune_malloc` changed glibc's settings in this process.
tuned = False


def _glibc() -> bool:
    try:  # (platform.libc_ver() would read the interpreter's executable file)
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # not POSIX, or no such name here
        return False


def why_untouched() -> str | None:
    """The reason the settings are left as they are, or None when EveryO may set them."""
    if os.environ.get(ENV, "").strip().lower() in _OFF:
        return f"{ENV} turns it off"
    if not _glibc():
        return "the interpreter does not run on glibc"
    user = [name for name in _USER_SETTINGS if name in os.environ]
    if "glibc.malloc" in os.environ.get("GLIBC_TUNABLES", ""):
        user.append("GLIBC_TUNABLES")
    if user:
        return f"the environment already tunes malloc ({', '.join(user)})"
    return None


def tune_malloc() -> bool:
    """Apply the two settings once per process; True when they are in force.

    Example:
        >>> import everyo
        >>> from everyo import allocator
        >>> allocator.tune_malloc() == (allocator.why_untouched() is None)
        True
    """
    global tuned
    if tuned or why_untouched() is not None:
        return tuned
    mallopt = getattr(ctypes.CDLL(None), "mallopt", None)
    if mallopt is None:
        return False
    mallopt.argtypes, mallopt.restype = (ctypes.c_int, ctypes.c_int), ctypes.c_int
    # NOTE: the mmap threshold first: setting either one freezes glibc's dynamic threshold,
    # and a frozen 128 KiB default would send every large array to a fresh mapping
    tuned = bool(mallopt(_M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(_M_TRIM_THRESHOLD, TRIM_THRESHOLD))
    return tuned
