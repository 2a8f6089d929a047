"""The float16 <-> float32 conversions in compiled loops, bit for bit ``astype``'s.

- float16 -> float32: the reference's table lookup (the 65,536 patterns' float32 values, built
  with ``astype``) as one compiled gather, without ``np.take``'s widening of every index to
  intp (about 2x).
- float32 -> float16: round to nearest, ties to even, on the integer bits, branch-free so that
  LLVM vectorises it: the normal range rebiased with the carry of the rounding running into
  the exponent (65520 and above become inf, as in ``astype``), the subnormal range as an
  integer shift with its remainder rounded. The same cost for every value, where ``astype``
  slows down several times on subnormal results (what scaled float16 gradients are full of).
  An array holding a NaN goes to the reference (``astype`` decides NaN payloads).

Checked against ``astype`` in the test suite: every float16 pattern, and the float32 values on
and around each float16 rounding boundary (ties, one ulp either side, overflow, underflow).
"""

from __future__ import annotations

import numpy as np

from everyo_numba.jit import njit

#: float16 bit pattern -> its float32 value, from NumPy's own conversion.
_FLOAT16_VALUES = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(
    np.float16).astype(np.float32)


def float16_to_float32(bits):
    if bits.dtype != np.uint16 or not bits.flags.c_contiguous:
        return NotImplemented
    out = np.empty(bits.shape, np.float32)
    _lookup(bits.reshape(-1), _FLOAT16_VALUES, out.reshape(-1))
    return out


@njit
def _lookup(bits, table, out):
    for k in range(bits.size):
        out[k] = table[bits[k]]


def float32_to_float16(x):
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        return NotImplemented
    out = np.empty(x.shape, np.float16)
    if _round_to_float16(x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16)):
        return NotImplemented  # a NaN: astype's payload rules
    return out


@njit
def _round_to_float16(source, target):
    """float32 bits -> float16 bits; True when a NaN was met (the caller redoes the array)."""
    one = np.uint32(1)
    nan = False
    for k in range(source.size):
        bits = source[k]
        magnitude = bits & np.uint32(0x7FFFFFFF)
        # normal results ([2**-14, 65520)): rebias 127 -> 15, round on the 13 dropped bits
        normal = (magnitude - np.uint32(112 << 23) + np.uint32(0xFFF)
                  + ((magnitude >> 13) & one)) >> 13
        # subnormal results: (implicit bit | mantissa) * 2**(e - 150) in units of 2**-24 is
        # the mantissa shifted right by 126 - e (capped: far below, everything rounds to 0)
        exponent = magnitude >> 23
        mantissa = (magnitude & np.uint32(0x7FFFFF)) | np.uint32(0x800000)
        shift = np.uint32(126) - exponent if exponent < 126 else one  # (never a shift by 32)
        shift = shift if shift < 31 else np.uint32(31)  # (nor by -1 below)
        kept = mantissa >> shift
        rest = mantissa & ((one << shift) - one)
        half = one << (shift - one)
        up = (rest > half) | ((rest == half) & ((kept & one) == one))
        subnormal = kept + (one if up else np.uint32(0))
        result = normal if magnitude >= np.uint32(113 << 23) else subnormal
        result = np.uint32(0x7C00) if magnitude >= np.uint32(0x477FF000) else result
        nan |= magnitude > np.uint32(0x7F800000)
        target[k] = np.uint16(((bits >> 16) & np.uint32(0x8000)) | result)
    return nan
