"""Conversions between float32 and the 16-bit floats, as fast as NumPy allows, bit-identical to
``astype``.

Every 16-bit product (matmul, conv2d under autocast) converts its operands up to float32, calls
BLAS and rounds the result down once, and every cast node converts a weight or a gradient: on
a CPU these conversions, not the arithmetic, are what mixed precision costs. What each function
does and why it beats ``astype`` (the figures are in docs/benchmarks.md, "Mixed precision",
where they are measured and kept true):

* float32 -> bfloat16: rounding on the integer view (add ``0x7FFF`` plus the lowest kept bit,
  keep the upper half: round to nearest, ties to even, carries running into the exponent
  exactly as they should, so subnormals and overflow to inf come out right) in cache-sized
  blocks, faster than ml_dtypes' ``astype``. NaNs, whose payload that rounding could carry into
  the sign or turn into inf, are converted by ``astype`` itself.
* float32 -> float16: NumPy's ``astype`` is a single C loop; a bit-manipulation version in
  NumPy needs a dozen passes (variable shift for subnormals, overflow, sign) and is slower, so
  we keep ``astype`` and only run it block by block, which keeps the source in cache.
* up to float32: bfloat16 is the upper half of a float32 (ml_dtypes converts at memory speed).
  float16 is looked up, block by block, in a table of the 65,536 patterns (built with
  ``astype``): the same cost whatever the value, where ``astype`` slows down sharply on
  subnormals, and float16 gradients are full of subnormals.

* float32 -> float32 holding a 16-bit value (``rounded_float32``: what a product needs from a
  float32 weight it treats as 16-bit, without making the 16-bit array at all). For float16, the
  magic-constant rounding ``(|x| + C) - C`` with ``C = 2**(max(e, -14) + 13)`` built from x's
  exponent bits rounds to nearest, ties to even, at float16's spacing, normal and subnormal
  alike, in eight in-cache passes: cheaper than ``astype(float16)`` alone, and it saves the
  widening afterwards. bfloat16 rounds on the bits as above and clears the lower half.

``tests/core/test_half_precision.py`` checks every function here against ``astype`` on all
65,536 16-bit patterns and on float32 edge cases (subnormals, overflow, NaN payloads, ties);
``benchmarks/check_rounded_float32.py`` checks ``rounded_float32`` on all 2**32 float32
patterns (too slow for the suite).
"""

from __future__ import annotations

import numpy as np

from everyo.dtypes import BFLOAT16, FLOAT16, FLOAT32, HALF_DTYPES
from everyo.kernel_definitions import Kernel
from everyo.kernel_table import kernel

#: Elements converted per block: source, scratch and output stay within the L2 cache.
BLOCK = 1 << 16


#: float16 bit pattern -> its float32 value, from NumPy's own conversion (256 KiB: fits in L2).
_LOOKUP_BLOCK = 1 << 14
_FLOAT16_TO_FLOAT32 = np.arange(1 << 16, dtype=np.uint32).astype(np.uint16).view(
    FLOAT16).astype(FLOAT32)


def widen(x: np.ndarray) -> np.ndarray:
    """A 16-bit float array in float32 (exact); any other array as it is.

    Example:
        >>> widen(np.array([1.5], BFLOAT16)).dtype.name
        'float32'
    """
    if x.dtype == FLOAT16:
        # NOTE: a lookup costs the same for every value; astype slows down on subnormals,
        # which is what float16 gradients are full of (see the module docstring). The lookup
        # walks the bits in memory order: a transposed operand (swapaxes in matmul's backward)
        # is looked up through its transpose, which is C-ordered.
        bits = x.view(np.uint16)
        if bits.flags.c_contiguous:
            return kernel.float16_to_float32(bits)
        if bits.flags.f_contiguous:
            return kernel.float16_to_float32(bits.T).T
        return x.astype(FLOAT32)
    return x.astype(FLOAT32) if x.dtype == BFLOAT16 else x


def narrow(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    """``x.astype(dtype)``, bit for bit, faster when a float32 array goes to 16 bits.

    Args:
        x: any array.
        dtype: the target dtype (a ``np.dtype``).

    Returns:
        A new array of ``dtype`` (``x`` itself when it already has that dtype).

    Example:
        >>> narrow(np.array([1.0, 1.00390625, 1.01171875], np.float32), BFLOAT16).tolist()
        [1.0, 1.0, 1.015625]
    """
    if dtype == FLOAT32 and x.dtype in HALF_DTYPES:
        return widen(x)  # (e.g. a 16-bit gradient reaching a float32 weight through its cast)
    if x.dtype == FLOAT32 and x.size >= 2 * BLOCK:
        if dtype == BFLOAT16:
            return kernel.float32_to_bfloat16(x)
        if dtype == FLOAT16:
            return kernel.float32_to_float16(x)
    return x.astype(dtype, copy=False)


def rounded_float32(x: np.ndarray, dtype: np.dtype, out: np.ndarray | None = None) -> np.ndarray:
    """``x.astype(dtype).astype(float32)``, bit for bit, without the 16-bit array.

    Args:
        x: a float32 array (other dtypes go through ``astype``).
        dtype: ``float16`` or ``bfloat16`` (a ``np.dtype``).
        out: a C-contiguous float32 array of ``x``'s shape to write into; may be ``x`` itself
            (a scratch result of the caller's, rounded in place).

    Returns:
        A float32 array (``out`` if given) whose values are all exactly representable in
        ``dtype``: what a product computes with when it treats ``x`` as a ``dtype`` operand.

    Example:
        >>> rounded_float32(np.array([1.00048828125, 1e-8, 3.0], np.float32), FLOAT16)
        array([1., 0., 3.], dtype=float32)
    """
    if x.dtype != FLOAT32 or x.size < 2 * BLOCK or dtype not in HALF_DTYPES:
        rounded = x.astype(dtype).astype(FLOAT32)
        if out is None:
            return rounded
        out[...] = rounded
        return out
    if out is None:
        out = np.empty(x.shape, FLOAT32)
    # NOTE: a kernel (one compiled pass with a provider; the reference below otherwise)
    rounding = kernel.round_to_float16_values if dtype == FLOAT16 \
        else kernel.round_to_bfloat16_values
    rounding(np.ascontiguousarray(x), out)
    return out


def round_to_float16_values(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The ``round_to_float16_values`` kernel's reference: eight in-cache passes per block."""
    return _round_in_blocks(x, out, _round_block_float16)


def round_to_bfloat16_values(x: np.ndarray, out: np.ndarray) -> np.ndarray:
    """The ``round_to_bfloat16_values`` kernel's reference: the bit rounding per block."""
    return _round_in_blocks(x, out, _round_block_bfloat16)


def _round_in_blocks(x: np.ndarray, out: np.ndarray, round_block) -> np.ndarray:
    source, target = x.reshape(-1), out.reshape(-1)
    in_place = np.may_share_memory(source, target)  # (bounds only: cheap, conservative)
    exponents = np.empty(min(BLOCK, source.size), np.uint32)
    # (rounding in place needs the source's signs until the last pass: a scratch block)
    scratch = np.empty(exponents.size, FLOAT32) \
        if in_place and round_block is _round_block_float16 else None
    for start in range(0, source.size, BLOCK):
        stop = start + BLOCK
        size = min(BLOCK, source.size - start)
        round_block(source[start:stop], target[start:stop], exponents[:size],
                    target[start:stop] if scratch is None else scratch[:size])
    return out


#: float32 exponent fields (bits 23-30) of the float16 rounding
_EXPONENT_BITS = np.uint32(0x7F800000)
_FLOAT16_SMALLEST_NORMAL = np.uint32((127 - 14) << 23)  # 2**-14: below it, fixed spacing 2**-24
_FLOAT16_MANTISSA_SHIFT = np.uint32(13 << 23)  # float32 keeps 13 mantissa bits more
_FLOAT16_TOP_BINADE = (127 + 15) << 23  # [2**15, 2**16): may round up to 2**16, i.e. inf
_FLOAT16_BEYOND = (127 + 16) << 23  # 2**16 and more (inf, NaN included): astype


def _round_block_float16(source, target, exponents, scratch) -> None:
    """One block of ``rounded_float32(..., FLOAT16)``; ``scratch`` may be ``target``.

    NOTE: adding C = 2**(e + 13) (e: the float16 exponent of |x|, at least -14) puts |x| in a
    binade where float32's spacing is float16's spacing at |x|, so the addition itself rounds
    |x| to nearest, ties to even, exactly as astype would; subtracting C again is exact
    (Sterbenz). copysign puts back the sign (including that of a result rounded to zero).
    In float16's top binade a value rounds up to 2**16 exactly when astype overflows it to inf
    (|x| >= 65520), so 2**16 becomes inf there; blocks holding |x| >= 2**16, inf or NaN (NaN
    payloads: rare; loss-scaled gradients that overflowed) go through astype instead.
    """
    np.bitwise_and(source.view(np.uint32), _EXPONENT_BITS, out=exponents)
    largest = exponents.max()
    if largest >= _FLOAT16_BEYOND:
        target[...] = source.astype(FLOAT16)
        return
    np.maximum(exponents, _FLOAT16_SMALLEST_NORMAL, out=exponents)
    exponents += _FLOAT16_MANTISSA_SHIFT
    magic = exponents.view(FLOAT32)
    np.abs(source, out=scratch)
    scratch += magic
    scratch -= magic
    if largest >= _FLOAT16_TOP_BINADE:
        scratch[scratch == 2.0**16] = np.inf  # (|x| >= 65520: float16 overflows to inf)
    np.copysign(scratch, source, out=target)


def _round_block_bfloat16(source, target, exponents, scratch) -> None:
    """One block of ``rounded_float32(..., BFLOAT16)``: the bit rounding of
    ``float32_to_bfloat16`` with the lower half cleared instead of shifted out."""
    if np.isnan(source.max()):  # (a NaN payload could carry into the sign: astype)
        target[...] = source.astype(BFLOAT16)
        return
    bits, rounded = source.view(np.uint32), exponents  # (the scratch holds the rounding)
    np.right_shift(bits, 16, out=rounded)
    np.bitwise_and(rounded, 1, out=rounded)
    rounded += 0x7FFF
    rounded += bits
    np.bitwise_and(rounded, 0xFFFF0000, out=target.view(np.uint32))


def float16_to_float32(bits: np.ndarray) -> np.ndarray:
    """The ``float16_to_float32`` kernel's reference: table lookup of C-ordered float16 bits,
    in blocks: ``np.take`` widens its indices to intp first, and a block's worth of them stays
    in cache."""
    out = np.empty(bits.shape, FLOAT32)
    source, target = bits.reshape(-1), out.reshape(-1)
    for start in range(0, source.size, _LOOKUP_BLOCK):
        np.take(_FLOAT16_TO_FLOAT32, source[start:start + _LOOKUP_BLOCK],
                out=target[start:start + _LOOKUP_BLOCK])
    return out


def float32_to_float16(x: np.ndarray) -> np.ndarray:
    """The ``float32_to_float16`` kernel's reference: ``astype`` block by block (the source
    stays in cache)."""
    return _blockwise_astype(x, FLOAT16)


def _blockwise_astype(x: np.ndarray, dtype: np.dtype) -> np.ndarray:
    out = np.empty(x.shape, dtype)
    source, target = x.reshape(-1), out.reshape(-1)
    for start in range(0, source.size, BLOCK):
        np.copyto(target[start:start + BLOCK], source[start:start + BLOCK], casting="unsafe")
    return out


def float32_to_bfloat16(x: np.ndarray) -> np.ndarray:
    """The ``float32_to_bfloat16`` kernel's reference. Round to nearest, ties to even, on the
    bits: ``(b + 0x7FFF + ((b >> 16) & 1)) >> 16``."""
    out = np.empty(x.shape, BFLOAT16)
    # (native float32 bits: a byte-swapped array, as loaded from a foreign file, is copied)
    bits = np.ascontiguousarray(x, dtype=FLOAT32).reshape(-1).view(np.uint32)
    target = out.reshape(-1).view(np.uint16)
    scratch = np.empty(min(BLOCK, bits.size), np.uint32)
    for start in range(0, bits.size, BLOCK):
        block = bits[start:start + BLOCK]
        rounded = scratch[:block.size]
        np.right_shift(block, 16, out=rounded)
        np.bitwise_and(rounded, 1, out=rounded)
        rounded += 0x7FFF
        rounded += block
        rounded >>= 16
        target[start:start + BLOCK] = rounded
    if x.size and np.isnan(x.max()):  # max propagates NaN: one pass, no mask unless needed
        nan = np.isnan(x)
        out[nan] = x[nan].astype(BFLOAT16)
    return out


KERNELS = {
    "float16_to_float32": Kernel(float16_to_float32, """
        bits: a C-contiguous uint16 array of float16 bit patterns, any shape. Returns a new
        float32 array of that shape holding their values: exactly astype(float32)'s bits,
        NaN payloads included, whatever the value (subnormals as fast as the rest). Overwrites
        nothing."""),
    "float32_to_float16": Kernel(float32_to_float16, """
        x: a float32 array, any shape and strides. Returns a new float16 array: exactly
        astype(float16)'s bits (round to nearest, ties to even; overflow to inf; NaN payloads
        as astype keeps them). Overwrites nothing."""),
    "float32_to_bfloat16": Kernel(float32_to_bfloat16, """
        x: a float32 array, any shape and strides. Returns a new bfloat16 array: exactly
        astype(bfloat16)'s bits (round to nearest, ties to even; overflow to inf; NaN payloads
        as astype keeps them). Overwrites nothing."""),
    "round_to_float16_values": Kernel(round_to_float16_values, """
        x: a C-contiguous float32 array, any shape; out: a C-contiguous float32 array of x's
        shape, or x itself (rounded in place; no other overlap). Writes into out exactly
        x.astype(float16).astype(float32)'s bits (round to nearest, ties to even, at float16's
        spacing, subnormals included; 65520 and above to inf; NaN payloads as astype keeps
        them) and returns out. Overwrites nothing else."""),
    "round_to_bfloat16_values": Kernel(round_to_bfloat16_values, """
        x: a C-contiguous float32 array, any shape; out: a C-contiguous float32 array of x's
        shape, or x itself (rounded in place; no other overlap). Writes into out exactly
        x.astype(bfloat16).astype(float32)'s bits (round to nearest, ties to even; NaN
        payloads as astype keeps them) and returns out. Overwrites nothing else."""),
}
