"""The 16-bit <-> float32 conversions in compiled loops, bit for bit ``astype``'s.

- float16 -> float32: the reference's table lookup (the 65,536 patterns' float32 values, built
  with ``astype``) as one compiled gather, without ``np.take``'s widening of every index to
  intp (about 2x).
- float32 -> float16: round to nearest, ties to even, on the integer bits, branch-free so that
  LLVM vectorises it: the normal range rebiased with the carry of the rounding running into
  the exponent (65520 and above become inf, as in ``astype``), the subnormal range as an
  integer shift with its remainder rounded. The same cost for every value, where ``astype``
  slows down several times on subnormal results (what scaled float16 gradients are full of).
  An array holding a NaN goes to the reference (``astype`` decides NaN payloads).

- float32 -> float32 holding a float16 or bfloat16 value (``round_to_*_values``, the rounding
  a folded weight cast makes, forward on the weight and backward on its gradient): one pass
  on the bits where the reference makes eight (float16) or four (bfloat16) in-cache passes.
  float16: the reference's magic-constant addition, in registers (a bit cast between uint32
  and float32 is an LLVM intrinsic here; a variable-shift version on the integer bits ran
  2x slower, compute-bound); 65520 and above become inf. bfloat16: the reference's integer
  rounding. NaNs are left untouched and the call goes to the reference
  (``astype`` decides NaN payloads); values already rounded round to themselves, so a call
  in place that met a NaN can be redone.
- float32 -> bfloat16: the reference's integer rounding in one pass (the reference makes six
  per block); a NaN sends the call to the reference. (The way up is ml_dtypes' ``astype``,
  already at memory speed.)

Checked against ``astype`` in the test suite: every float16 pattern, and the float32 values on
and around each float16 rounding boundary (ties, one ulp either side, overflow, underflow).
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from everyo_numba.jit import as_float32, as_uint32, njit

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


def round_to_float16_values(x, out):
    return _rounded(x, out, _float16_value)


def round_to_bfloat16_values(x, out):
    return _rounded(x, out, _bfloat16_value)


def _rounded(x, out, rounding):
    if not (x.dtype == np.float32 and out.dtype == np.float32 and x.shape == out.shape
            and x.flags.c_contiguous and out.flags.c_contiguous and out.flags.writeable):
        return NotImplemented
    source, target = x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint32)
    # NOTE: in place through a loop over one array: two arrays that overlap make LLVM's
    # vectorised loop fall back to its scalar copy (an alias check at run time), ~10x slower
    if np.may_share_memory(source, target):
        if source.ctypes.data != target.ctypes.data:
            return NotImplemented  # (a partial overlap: outside the contract)
        nan = _round_in_place(target, rounding)
    else:
        nan = _round_into(source, target, rounding)
    return NotImplemented if nan else out  # a NaN (left as it was): astype's payload rules


#: (every constant of the rounding loops a uint32: a comparison or shift that mixes in a
#: Python int is done in int64 or float64, which kept LLVM from vectorising the loop, ~10x)
_U32 = np.uint32


@njit
def _float16_value(bits):
    """float32 bits -> float32 bits of the nearest float16 value (a NaN: its own bits).

    NOTE: the reference's rounding in registers: adding C = 2**(max(e, -14) + 13) puts |x| in
    the binade where float32's spacing is float16's at |x| (e: |x|'s exponent), so the float32
    addition rounds |x| to nearest, ties to even, at float16's spacing, subnormals included;
    subtracting C again is exact. 65520 and above (inf included) become inf.
    """
    magnitude = bits & _U32(0x7FFFFFFF)
    magic = as_float32(max(magnitude & _U32(0x7F800000), _U32(113 << 23)) + _U32(13 << 23))
    rounded = as_uint32((as_float32(magnitude) + magic) - magic)
    rounded = _U32(0x7F800000) if magnitude >= _U32(0x477FF000) else rounded
    return bits if magnitude > _U32(0x7F800000) else (bits & _U32(0x80000000)) | rounded


@njit
def _bfloat16_value(bits):
    """float32 bits -> float32 bits of the nearest bfloat16 value (a NaN: its own bits)."""
    rounded = (bits + _U32(0x7FFF) + ((bits >> _U32(16)) & _U32(1))) & _U32(0xFFFF0000)
    return bits if (bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000) else rounded


@njit
def _round_into(source, target, rounding):
    """``rounding`` of every element; True when a NaN was met."""
    nan = _U32(0)
    for k in range(source.size):
        bits = source[k]
        nan |= _U32((bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000))
        target[k] = rounding(bits)
    return nan != _U32(0)


@njit
def _round_in_place(data, rounding):
    nan = _U32(0)
    for k in range(data.size):
        bits = data[k]
        nan |= _U32((bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000))
        data[k] = rounding(bits)
    return nan != _U32(0)


def float32_to_bfloat16(x):
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        return NotImplemented
    out = np.empty(x.shape, ml_dtypes.bfloat16)
    if _narrow_bfloat16(x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16)):
        return NotImplemented  # a NaN: astype's payload rules
    return out


@njit
def _narrow_bfloat16(source, target):
    """float32 bits -> bfloat16 bits, the reference's rounding; True when a NaN was met."""
    nan = _U32(0)
    for k in range(source.size):
        bits = source[k]
        nan |= _U32((bits & _U32(0x7FFFFFFF)) > _U32(0x7F800000))
        target[k] = np.uint16(
            (bits + _U32(0x7FFF) + ((bits >> _U32(16)) & _U32(1))) >> _U32(16))
    return nan != _U32(0)
