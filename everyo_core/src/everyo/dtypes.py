"""The dtypes a tensor may hold: NumPy's, plus ``bfloat16`` from ``ml_dtypes``.

NumPy has no bfloat16; ``ml_dtypes`` (JAX's package) adds one as a NumPy dtype with casts,
promotion rules and ufunc loops. Importing it registers the name, so ``np.dtype("bfloat16")``
works everywhere afterwards. NumPy reports the new dtype with ``kind == "V"`` (a user-defined
type), so "is this a float?" must be asked through :func:`is_floating`, never ``dtype.kind``.
"""

from __future__ import annotations

import ml_dtypes
import numpy as np

from everyo.errors import EveryOError

FLOAT16 = np.dtype(np.float16)
BFLOAT16 = np.dtype(ml_dtypes.bfloat16)
FLOAT32 = np.dtype(np.float32)

#: The 16-bit floating dtypes: stored in 16 bits, computed with through float32.
HALF_DTYPES = frozenset({FLOAT16, BFLOAT16})


def resolve_dtype(dtype, what: str = "dtype") -> np.dtype:
    """``dtype`` (a name, a NumPy dtype or type) as a NumPy dtype, else a clear ``EveryOError``.

    Args:
        dtype: e.g. ``"float32"``, ``"bfloat16"``, ``np.float16``, ``torch.float64``.
        what: what the dtype is for, named in the error.

    Returns:
        The ``np.dtype``.

    Example:
        >>> resolve_dtype("bfloat16").name
        'bfloat16'
    """
    if type(dtype).__name__ == "dtype" and type(dtype).__module__ == "torch":
        # PyTorch's dtype, by its name (torch.float64 -> "float64"): torch is not imported
        dtype = str(dtype).removeprefix("torch.")
    if not isinstance(dtype, np.dtype):
        try:
            dtype = np.dtype(dtype)
        except TypeError:
            raise EveryOError(f"{what}: unknown dtype {dtype!r}") from None
    if dtype.kind not in "biufcV":
        raise EveryOError(f"{what}: dtype {dtype.name} is not numeric; a tensor holds "
                          f"booleans, integers or floating-point numbers")
    if dtype.kind == "V" and dtype != BFLOAT16:
        # NOTE: ml_dtypes also registers float8/int4 types; no EveryO op computes with them.
        raise EveryOError(f"{what}: dtype {dtype.name} is not supported; the 16-bit floats are "
                          f"'float16' and 'bfloat16'")
    return dtype


def is_floating(dtype) -> bool:
    """True for float16, bfloat16, float32, float64 (and complex): dtypes that carry gradients.

    Example:
        >>> is_floating(BFLOAT16), is_floating(np.dtype("int32"))
        (True, False)
    """
    return dtype.kind in "fc" or dtype == BFLOAT16



def result_dtype(*arrays) -> np.dtype:
    """``np.result_type`` of ``arrays``, where float16 meeting bfloat16 gives float32.

    NOTE: NumPy knows no common type for the two 16-bit floats (ml_dtypes' ufunc loops compute
    such a pair in float32, ``np.result_type`` refuses it); float32 is also PyTorch's answer.

    Example:
        >>> result_dtype(np.ones(1, BFLOAT16), np.ones(1, FLOAT16)).name
        'float32'
    """
    try:
        return np.result_type(*arrays)
    except np.exceptions.DTypePromotionError:
        if {a.dtype for a in arrays} <= HALF_DTYPES | {FLOAT32}:
            return FLOAT32
        raise
