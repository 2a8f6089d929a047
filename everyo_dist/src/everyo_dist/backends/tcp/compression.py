"""Opt-in wire compression for the tcp backend's reductions (``wire_dtype=``).

A float32/float64 vector is rounded to ``float16`` or ``bfloat16`` before it leaves the rank,
reduced in float64 as always, and the result travels back in the same narrow dtype before it is
widened to the caller's dtype: half (float32) or a quarter (float64) of the bytes, as Horovod's
``Compression.fp16`` does. The cost is accuracy, paid twice (each rank's input and the result
are rounded): float16 keeps 11 significant bits (relative error up to 2**-11, about 5e-4, down
to its smallest normal value 6.1e-5; below that the error is up to 2**-25 absolute per
rounding, so values under 3e-8 arrive as 0; values above 65504 overflow to inf);
bfloat16 keeps float32's range but only 8 significant bits (about 4e-3). Every rank still
receives the same bits. The exact float64 path stays the default.
"""

from __future__ import annotations

import ml_dtypes  # (a dependency of everyo-core, which imports it too)
import numpy as np

from everyo_dist.errors import DistributedError

WIRE_DTYPES = ("float16", "bfloat16")


def wire_dtype_of(name) -> np.dtype | None:
    """The NumPy dtype for ``wire_dtype=`` (None: no compression).

    Example:
        >>> wire_dtype_of("float16"), wire_dtype_of(None)
        (dtype('float16'), None)
    """
    if name is None or name == "":
        return None
    if name == "float16":
        return np.dtype(np.float16)
    if name == "bfloat16":
        return np.dtype(ml_dtypes.bfloat16)
    raise DistributedError(f"wire_dtype must be one of {', '.join(WIRE_DTYPES)} (or None), "
                           f"got {name!r}")


def compresses(wire: np.dtype | None, dtype: np.dtype) -> bool:
    """Whether a reduction of ``dtype`` travels in ``wire`` (only wider floats shrink)."""
    return wire is not None and dtype.kind == "f" and dtype.itemsize > wire.itemsize
