"""Mean and variance of the normalisation layers, accurate in float32.

NumPy sums float32 pairwise only along the contiguous axis; over the leading axes of a
channels-last tensor it adds sequentially, and with a large mean the rounding error reaches
1e-5 of the output. Accumulating the two reductions in float64 (NumPy converts in small
buffered chunks, no float64 copy of the input) brings the output within ~1e-6 of a float64
computation at a small cost (measured in docs/benchmarks.md).
"""

from __future__ import annotations

import numpy as np


def moments(x: np.ndarray, axes: tuple, keepdims: bool = True) -> tuple:
    """``(mean, x - mean, biased variance)`` over ``axes``, all in ``x``'s dtype.

    Example:
        >>> m, c, v = moments(np.array([[1.0, 3.0]], np.float32), (1,))
        >>> m.tolist(), c.tolist(), v.tolist()
        ([[2.0]], [[-1.0, 1.0]], [[1.0]])
    """
    wide = np.float64 if x.dtype != np.float64 else None
    mean = mean_over(x, axes, keepdims, wide)
    # NOTE: the mean rounded to float32 is off by up to half an ulp of the mean (4e-6 at 100),
    # an offset every centered value would keep: subtract the rounding residue as well.
    high = mean.astype(x.dtype, copy=False)
    centered = x - high
    if wide is not None:
        centered -= (mean - high).astype(x.dtype)
    var = mean_over(np.square(centered), axes, keepdims, wide)
    return high, centered, var.astype(x.dtype, copy=False)


def mean_over(x: np.ndarray, axes: tuple, keepdims: bool = True, dtype=None) -> np.ndarray:
    """Mean over ``axes`` accumulated in ``dtype`` (None: ``x``'s), one axis at a time,
    largest first.

    NOTE: one NumPy reduction over several non-adjacent axes runs 3-5x slower than reducing
    the largest axis first (into a much smaller array) and then the others, with or without
    a dtype conversion (measured: GroupNorm's (1, 3) axes of a (32, 1024, 8, 8) float32 array,
    4.1 ms against 0.74 ms).

    Example:
        >>> mean_over(np.ones((2, 3, 4), np.float32), (0, 2)).shape
        (1, 3, 1)
    """
    total = x
    for axis in sorted(axes, key=lambda a: -x.shape[a]):
        total = total.sum(axis=axis, keepdims=True, dtype=dtype)
    count = int(np.prod([x.shape[a] for a in axes]))
    mean = total / count
    return mean if keepdims else mean.reshape([n for a, n in enumerate(x.shape) if a not in axes])
