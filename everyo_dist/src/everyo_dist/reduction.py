"""The one reduction every backend performs: rows added in rank order in float64 (integers in
int64, exactly), divided by a count for a mean, rounded once to the result's dtype.

Every backend calls :func:`reduce_rows` (or :func:`reduce_rows_f64`, its allocating form), so
``shm``, ``tcp`` and ``mpi`` runs agree bit for bit: the same additions in the same order,
block by block so that the float64 accumulator stays in cache.
"""

from __future__ import annotations

import numpy as np

REDUCE_BLOCK = 1 << 15  # elements per step: two float64 blocks (512 KB) stay in cache


def scale(block: np.ndarray, divisor: int) -> None:
    """``block /= divisor`` in place; a power of two multiplies by its exact reciprocal, which
    rounds exactly like the division and is several times faster.

    Example:
        >>> block = np.float64([3.0]); scale(block, 2); block
        array([1.5])
    """
    if divisor == 1:
        return
    if divisor & (divisor - 1) == 0:
        np.multiply(block, 1.0 / divisor, out=block)
    else:
        np.divide(block, divisor, out=block)


def accumulator_dtype(dtype) -> np.dtype:
    """What sums of ``dtype`` are added in: float64 for floats, int64 for integers.

    int64 keeps every integer sum exact (float64 would round sums above 2**53) and wraps
    exactly as NumPy's own integer sums do when the result's dtype overflows; uint64 values
    travel through int64 bit for bit (two's complement), so their sums wrap the same way.

    Example:
        >>> accumulator_dtype(np.int32), accumulator_dtype(np.float16)
        (dtype('int64'), dtype('float64'))
    """
    return np.dtype(np.int64) if np.dtype(dtype).kind in "iu" else np.dtype(np.float64)


def reduce_rows(rows, out: np.ndarray, divisor: int = 1,
                scratch: np.ndarray | None = None) -> np.ndarray:
    """``out = cast((rows[0] + rows[1] + ...) / divisor)``, added in row order in float64
    (integer results: exactly, in int64; see :func:`accumulator_dtype`).

    Args:
        rows: equally long 1-D arrays (any numeric dtypes), in rank order.
        out: the destination, as long as a row; its dtype is the result's.
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
    length = len(out)
    block = min(REDUCE_BLOCK, max(length, 1))
    accumulator = accumulator_dtype(out.dtype)
    if scratch is None or len(scratch) < 2 * block or scratch.dtype != accumulator:
        scratch = np.empty(2 * block, accumulator)
    # NOTE: IEEE results without NumPy's warnings: inf + -inf is nan, a float64 sum past the
    # result dtype's range rounds to inf, as in one rank's arithmetic (a RuntimeWarning would
    # be a raw exception under -W error and break a tcp group mid-collective)
    with np.errstate(over="ignore", invalid="ignore"):
        _reduce_blocks(rows, out, divisor, scratch, block, accumulator)
    return out


def _reduce_blocks(rows, out: np.ndarray, divisor: int, scratch: np.ndarray, block: int,
                   accumulator: np.dtype) -> None:
    length = len(out)
    for start in range(0, length, block):
        stop = min(start + block, length)
        acc, widened = scratch[:stop - start], scratch[block:block + stop - start]
        np.copyto(acc, rows[0][start:stop], casting="unsafe")
        for row in rows[1:]:
            part = row[start:stop]
            if part.dtype != accumulator:  # widening first, then a plain same-type add, is faster
                np.copyto(widened, part, casting="unsafe")  # than NumPy's mixed-type add
                part = widened
            np.add(acc, part, out=acc)
        scale(acc, divisor)
        np.copyto(out[start:stop], acc, casting="unsafe")


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
