"""The one Numba configuration every kernel of this provider is compiled with.

- ``cache=True``: compiled once per machine, kept next to the module (or in Numba's user cache
  directory when the package's folder is read-only).
- ``error_model="numpy"``: a division by zero gives inf/NaN, as NumPy's does, never a Python
  exception.
- No ``fastmath`` and no ``parallel``: IEEE arithmetic in the order the loops say, on the
  calling thread, so every result is the same from run to run and at every thread count.
- ``nogil=True``: a data-parallel rank's communication thread keeps running meanwhile.

One exception, :data:`njit_sum`, for a float64 sum whose order the kernel's contract leaves open.
"""

from __future__ import annotations

import numba
from numba import types
from numba.extending import intrinsic

#: ``@njit`` as every kernel uses it.
njit = numba.njit(cache=True, error_model="numpy", nogil=True)

#: ``@njit`` for a function that only adds up a float64 sum whose order the contract leaves
#: open (a norm's statistics): its additions may be reassociated (``fastmath={"reassoc"}``, no
#: other flag), so LLVM runs them in SIMD lanes, 3-4x faster than one strict chain of adds. The
#: order is the compiled code's: the same bits from run to run and at every thread count, though
#: a CPU with another vector width may round the last bit of a float64 sum differently. Nothing
#: else goes in such a function: reassociation would undo rounding-sensitive arithmetic (a
#: mean's rounding residue subtracted after the mean); the caller does that in ``@njit`` code.
njit_sum = numba.njit(cache=True, error_model="numpy", nogil=True, fastmath={"reassoc"})

#: The dtypes the compiled loops take (NumPy has no float16 or bfloat16 arithmetic in Numba);
#: the kernels widen 16-bit operands to float32 themselves or leave them to the reference.
COMPILED_DTYPES = frozenset({"float32", "float64"})


def native(*arrays) -> bool:
    """True when every array (None skipped) is in native byte order.

    Numba compiles native-order arrays only (a ``>f4`` array is a typing error), and the 16-bit
    paths read the integer bits, which a swapped array holds in the other order: every kernel
    leaves a call with a non-native array (NumPy loads one from a file written on the other
    endianness) to the reference. ``dtype.name`` does not tell: ``>f4`` is "float32" too.
    """
    return all(a is None or a.dtype.isnative for a in arrays)


@intrinsic
def as_float32(typingctx, bits):
    """In a compiled loop: the float32 whose bits are the uint32 ``bits`` (a register move,
    no conversion; LLVM vectorises it, where a view of a one-element array would not)."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.float32))
    return types.float32(types.uint32), codegen


@intrinsic
def as_uint32(typingctx, value):
    """In a compiled loop: the bits of the float32 ``value``, as a uint32."""
    def codegen(context, builder, signature, args):
        return builder.bitcast(args[0], context.get_value_type(types.uint32))
    return types.uint32(types.float32), codegen
