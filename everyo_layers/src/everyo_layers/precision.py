"""The dtype in which reductions (normalisation statistics, losses, float16 pooling sums) are
formed: at least float32.

NOTE: float16 runs out quickly when many values are summed (a sum of squares of a few hundred
activations exceeds 65504) or exponentiated, so such work happens in float32 whatever the
input's dtype; float64 input stays float64, which is what gradcheck needs.
"""

from __future__ import annotations

import numpy as np


def accumulation_dtype(dtype) -> np.dtype:
    """``float16 -> float32``, ``float32 -> float32``, ``float64 -> float64``.

    Example:
        >>> accumulation_dtype(np.float16).name, accumulation_dtype(np.float64).name
        ('float32', 'float64')
    """
    return np.promote_types(dtype, np.float32)
