"""The ``reduce_rows`` kernel: the one reduction every backend performs, as a NumPy reference a
kernel provider (``everyo.kernels``) may replace with a compiled loop of the same bits.

Rows are added in rank order in float64 (integers in int64, exactly), the sum divided by a count
for a mean, and rounded once to the result's dtype. The reference goes block by block so that
its float64 accumulator stays in cache; element by element, the arithmetic is the same.
"""

from __future__ import annotations

import numpy as np

from everyo.kernels import Kernel

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
    """The reference: ``out = cast((rows[0] + rows[1] + ...) / divisor)``, added in row order
    in float64 (integer results: exactly, in int64), NumPy block by block."""
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


KERNELS = {
    "reduce_rows": Kernel(reduce_rows, """
        rows: a non-empty sequence of equally long 1-D arrays (any numeric dtypes, any strides),
        in rank order; out: the writable 1-D destination of that length, its dtype the result's
        (it may be one of the rows: an element is written only after every row's element at
        that index was read); divisor: a positive int; scratch: optional accumulator-dtype
        work array the implementation may use or ignore. Writes and returns out =
        cast((rows[0] + rows[1] + ... ) / divisor): each element widened to float64 (int64 for
        integer results), added in row order, divided by divisor (a power of two: multiplied by
        its exact reciprocal, the same bits) when divisor != 1, then rounded once to out's
        dtype. Exactly the reference's bits: every backend's results agree bit for bit. IEEE
        results (inf, NaN, overflow to inf) without warnings."""),
}
