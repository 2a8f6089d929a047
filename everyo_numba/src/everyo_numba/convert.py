"""The 16-bit <-> float32 conversions in compiled loops, bit for bit ``astype``'s.

- float16 -> float32: arithmetic on the bits (exponent rebias; subnormals as an integer
  times 2**-24), vectorised: ~2x the reference's table lookup as a compiled gather, and the
  same cost for every value (``astype`` slows down on subnormals). NaNs: the reference.
- float32 -> float16: round to nearest, ties to even (the magic-constant addition below), then
  the exact encoding of the rounded value; 65520 and above become inf, as in ``astype``. The
  same cost for every value, where ``astype`` slows down several times on subnormal results
  (what scaled float16 gradients are full of). An array holding a NaN goes to the reference
  (``astype`` decides NaN payloads). Both checked against ``astype`` on every non-NaN pattern
  (all 2**32 float32 ones for the way down) while being written.

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

#: (every constant of the rounding loops a uint32: a comparison or shift that mixes in a
#: Python int is done in int64 or float64, which kept LLVM from vectorising the loop, ~10x)
_U32 = np.uint32


def float16_to_float32(bits):
    if bits.dtype != np.uint16 or not bits.flags.c_contiguous:
        return NotImplemented
    out = np.empty(bits.shape, np.float32)
    if _widen_float16(bits.reshape(-1), out.reshape(-1).view(np.uint32)):
        return NotImplemented  # a NaN: astype's payload (and quieting) rules, the reference's
    return out


@njit
def _widen_float16(source, target):
    """float16 bits -> float32 bits; True when a NaN was met (the caller redoes the array).

    NOTE: arithmetic, not the reference's table: a gather kept the loop at ~0.7 ns per
    element, this vectorises (~0.35). Normal and infinite values rebias the exponent (15 ->
    127, 31 -> 255); subnormals are their integer mantissa times 2**-24, exact in float32.
    """
    nan = _U32(0)
    for k in range(source.size):
        half = _U32(source[k])
        magnitude = half & _U32(0x7FFF)
        rebias = _U32(112 << 23) if magnitude < _U32(0x7C00) else _U32(224 << 23)
        normal = (magnitude << _U32(13)) + rebias
        subnormal = as_uint32(np.float32(np.int32(magnitude)) * np.float32(2.0**-24))
        nan |= _U32(magnitude > _U32(0x7C00))
        target[k] = ((half & _U32(0x8000)) << _U32(16)) | (
            normal if magnitude >= _U32(0x400) else subnormal)
    return nan != _U32(0)


def float32_to_float16(x):
    return _narrowed(x, np.float16, _narrow_float16)


def _narrowed(x, dtype, narrow):
    """``x`` (C-ordered native float32) narrowed to the 16-bit ``dtype`` by ``narrow`` on the
    bits; anything else, or a NaN (astype's payload rules), is left to the reference."""
    if x.dtype != np.float32 or not x.flags.c_contiguous:
        return NotImplemented
    out = np.empty(x.shape, dtype)
    if narrow(x.reshape(-1).view(np.uint32), out.reshape(-1).view(np.uint16)):
        return NotImplemented
    return out


@njit
def _narrow_float16(source, target):
    """float32 bits -> float16 bits; True when a NaN was met (the caller redoes the array).

    NOTE: ``_float16_value``'s rounding (magic-constant addition), then the exact float16
    encoding of the rounded value: normal ones rebias the exponent (127 -> 15, a rounding up
    to 2**-14 included), subnormal ones are their value times 2**24, an integer below 1024.
    """
    nan = _U32(0)
    for k in range(source.size):
        bits = source[k]
        magnitude = bits & _U32(0x7FFFFFFF)
        magic = as_float32(max(magnitude & _U32(0x7F800000), _U32(113 << 23)) + _U32(13 << 23))
        rounded = (as_float32(magnitude) + magic) - magic
        rounded_bits = as_uint32(rounded)
        normal = (rounded_bits >> _U32(13)) - _U32(112 << 10)
        subnormal = _U32(np.int32(rounded * np.float32(2.0**24)))
        half = normal if rounded_bits >= _U32(113 << 23) else subnormal
        half = _U32(0x7C00) if magnitude >= _U32(0x477FF000) else half
        nan |= _U32(magnitude > _U32(0x7F800000))
        target[k] = np.uint16(((bits >> _U32(16)) & _U32(0x8000)) | half)
    return nan != _U32(0)


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
    return _narrowed(x, ml_dtypes.bfloat16, _narrow_bfloat16)


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
