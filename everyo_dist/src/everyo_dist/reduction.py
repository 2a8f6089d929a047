"""The one reduction every backend performs: rows added in rank order in float64 (integers in
int64, exactly), divided by a count for a mean, rounded once to the result's dtype.

Every backend calls :func:`reduce_rows` (or :func:`reduce_rows_f64`, its allocating form), so
``shm``, ``tcp`` and ``mpi`` runs agree bit for bit: the same additions in the same order. It is
the ``reduce_rows`` kernel (:mod:`everyo_dist.reduction_kernels` holds the NumPy reference);
a provider's compiled loop keeps the reference's bits.
"""

from __future__ import annotations

import numpy as np

from everyo.errors import EveryOError
from everyo.kernels import kernel
from everyo_dist.reduction_kernels import REDUCE_BLOCK, accumulator_dtype, scale
from everyo_dist.reduction_kernels import reduce_rows as reference_reduce_rows

__all__ = ["COMPILED_FROM", "REDUCE_BLOCK", "accumulator_dtype", "reduce_rows",
           "reduce_rows_f64", "scale"]

#: Calls on fewer elements than this run the NumPy reference whatever the kernel selection: a
#: provider's loop saves at most ~5 us on them (docs/distributed.md, "Writing a backend"), so a
#: job whose collectives are all small never pays the provider's start-up (~1 s: Numba's import
#: and its cache's load, at the first call). The bits are the same either way.
COMPILED_FROM = 4096


def reduce_rows(rows, out: np.ndarray, divisor: int = 1,
                scratch: np.ndarray | None = None) -> np.ndarray:
    """``out = cast((rows[0] + rows[1] + ...) / divisor)``, added in row order in float64
    (integer results: exactly, in int64; see :func:`accumulator_dtype`): the ``reduce_rows``
    kernel (:mod:`everyo_dist.reduction_kernels`), compiled when a provider supplies it and
    ``out`` has at least :data:`COMPILED_FROM` elements.

    Args:
        rows: equally long 1-D arrays (any numeric dtypes), in rank order.
        out: the destination, as long as a row; its dtype is the result's. It may be one of
            the rows (an in-place reduction).
        divisor: what the float64 sum is divided by (``len(rows)`` for a mean, else 1).
        scratch: optional work array of the accumulator dtype and at least
            ``2 * REDUCE_BLOCK`` elements, reused across calls to save allocations.
    Returns:
        ``out``.

    Example:
        >>> out = np.empty(2, np.float32)
        >>> reduce_rows([np.float32([1, 2]), np.float32([2, 4])], out, divisor=2)
        array([1.5, 3. ], dtype=float32)
    """
    # NOTE: the common case in one pass of attribute reads; a row longer than out was reduced
    # by its prefix, silently, and the other misfits raised NumPy's raw errors
    length = out.shape[0] if out.ndim == 1 else -1
    if not (len(rows) and length >= 0 and type(divisor) is int and divisor >= 1
            and out.flags.writeable and out.dtype.kind in "biufcV"
            and (divisor == 1 or out.dtype.kind not in "biu")
            and all(type(row) is np.ndarray and row.shape == (length,)
                    and row.dtype.kind in "biufcV" for row in rows)):
        divisor = _checked(rows, out, divisor)
    if length < COMPILED_FROM:  # (before kernel.reduce_rows: its first read imports Numba)
        reference_reduce_rows(rows, out, divisor, scratch)
    else:
        kernel.reduce_rows(rows, out, divisor, scratch)
    return out


def _checked(rows, out, divisor) -> int:
    """``divisor`` as an int (a NumPy integer is one), or the error naming what of
    ``reduce_rows``' arguments does not fit."""
    if not isinstance(out, np.ndarray) or out.ndim != 1:
        raise EveryOError(f"reduce_rows: out must be a 1-D array, got shape "
                          f"{getattr(out, 'shape', type(out).__name__)}")
    if not out.flags.writeable:
        raise EveryOError(f"reduce_rows: out (shape {out.shape}) is read-only")
    if not len(rows):
        raise EveryOError("reduce_rows: no rows to reduce (one per rank)")
    for r, row in enumerate(rows):
        if not (isinstance(row, np.ndarray) and row.shape == out.shape
                and row.dtype.kind in "biufcV"):
            what = (f"shape {row.shape}, dtype {row.dtype}" if isinstance(row, np.ndarray)
                    else f"a {type(row).__name__}")
            raise EveryOError(f"reduce_rows: row {r} ({what}) does not fit out {out.shape} "
                              f"({out.dtype}): every row is a 1-D numeric array of out's length")
    if isinstance(divisor, bool) or not isinstance(divisor, (int, np.integer)) or divisor < 1:
        raise EveryOError(f"reduce_rows: divisor must be a positive int, got {divisor!r}")
    if divisor != 1 and out.dtype.kind in "biu":
        raise EveryOError(f"reduce_rows: an integer result ({out.dtype}) cannot be divided by "
                          f"{divisor} (a mean of integers): reduce into a floating out")
    if out.dtype.kind not in "biufcV":
        raise EveryOError(f"reduce_rows: out has dtype {out.dtype}, not a number")
    return int(divisor)


def reduce_rows_f64(rows, mean: bool, dtype, out: np.ndarray | None = None) -> np.ndarray:
    """The reference every backend matches: :func:`reduce_rows` of ``rows``, divided by their
    number when ``mean``, in ``dtype``.

    Args:
        rows: a sequence of equally long 1-D arrays, one per rank, in rank order.
        mean: divide the sum by ``len(rows)``.
        dtype: the result's dtype.
        out: optional destination of that dtype and length.
    Returns:
        The reduced 1-D array (``out`` when given).

    Example:
        >>> reduce_rows_f64([np.float32([1, 2]), np.float32([2, 4])], True, "float32")
        array([1.5, 3. ], dtype=float32)
    """
    if out is None:
        out = np.empty(len(rows[0]), dtype)
    return reduce_rows(rows, out, len(rows) if mean else 1)
