"""The distributed backends' reduction (``reduce_rows``) in one compiled pass.

The reference (``everyo_dist.reduction_kernels``) makes five NumPy calls per cache-sized block:
widen the first row into a float64 accumulator, widen each further row into a second buffer and
add it, scale, narrow into the result. Here each element is widened, summed in row order, scaled
and narrowed in registers, so the rows are read once and the result written once, with no
temporaries. Element by element it is the reference's arithmetic (float64 additions in row
order, a power-of-two divisor multiplied by its exact reciprocal, any other one divided by, one
rounding to the result's dtype): the same bits, on every backend.
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import COMPILED_DTYPES, native, njit

#: How the float64 sum is scaled: not at all, times the reciprocal, divided (the reference's rule).
_KEEP, _MULTIPLY, _DIVIDE = 0, 1, 2


# NOTE: np.float64(x), not float(x): Numba types float() of a float32 as float32, which would sum
# in float32. One loop per scaling mode: a branch inside the loop, although it never changes, kept
# LLVM from vectorising the float32 narrowing (4x slower).
@njit
def _reduce_two(first, second, out, factor, mode):
    if mode == _MULTIPLY:
        for i in range(out.size):
            out[i] = (np.float64(first[i]) + np.float64(second[i])) * factor
    elif mode == _DIVIDE:
        for i in range(out.size):
            out[i] = (np.float64(first[i]) + np.float64(second[i])) / factor
    else:
        for i in range(out.size):
            out[i] = np.float64(first[i]) + np.float64(second[i])


#: Elements summed at a time by the many-row loop: its float64 block stays in L1.
_BLOCK = 1024


@njit
def _reduce_many(rows, out, factor, mode):
    # NOTE: row by row over an L1-sized float64 block (each element's additions still in row
    # order): a loop over the rows inside the element loop does not vectorise. Slices, indexed
    # from 0 by a range, spare Numba's negative-index check per element.
    block = np.empty(_BLOCK, np.float64)
    for start in range(0, out.size, _BLOCK):
        stop = min(start + _BLOCK, out.size)
        acc = block[:stop - start]
        first = rows[0][start:stop]
        for j in range(acc.size):
            acc[j] = np.float64(first[j])
        for r in range(1, len(rows)):
            row = rows[r][start:stop]
            for j in range(acc.size):
                acc[j] = acc[j] + np.float64(row[j])
        _scale_into(acc, out[start:stop], factor, mode)


@njit
def _scale_into(acc, out, factor, mode):
    if mode == _MULTIPLY:
        for j in range(acc.size):
            out[j] = acc[j] * factor
    elif mode == _DIVIDE:
        for j in range(acc.size):
            out[j] = acc[j] / factor
    else:
        for j in range(acc.size):
            out[j] = acc[j]


def _compiled(array, dtype) -> bool:
    """A 1-D C-contiguous native array of ``dtype`` (what the loops are compiled for)."""
    return array.dtype == dtype and array.ndim == 1 and array.flags.c_contiguous and native(array)


def reduce_rows(rows, out, divisor=1, scratch=None):
    dtype = out.dtype
    if dtype.name not in COMPILED_DTYPES or len(rows) == 0 or not _compiled(out, dtype) \
            or not out.flags.writeable or isinstance(divisor, bool) or not isinstance(divisor, int) \
            or divisor < 1 or not all(_compiled(row, dtype) and row.size == out.size for row in rows):
        return NotImplemented  # integers, 16-bit floats, strided or mixed rows: the reference
    if len({row.flags.writeable for row in rows}) != 1:
        return NotImplemented  # (Numba types read-only arrays apart: not one tuple type)
    if divisor == 1:
        mode, factor = _KEEP, 1.0
    elif divisor & (divisor - 1) == 0:
        mode, factor = _MULTIPLY, 1.0 / divisor
    else:
        mode, factor = _DIVIDE, float(divisor)
    if len(rows) == 2:
        _reduce_two(rows[0], rows[1], out, factor, mode)
    else:
        _reduce_many(tuple(rows), out, factor, mode)
    return out
