"""Recognise a NumPy array that is a slice of a larger one (``self.mask[:t, :t]``).

A forward that keeps a mask or a table as a plain NumPy attribute and slices it with a size
read from ``x.shape`` hands the op a view whose shape follows the input. The tracer cannot see
NumPy's slicing, but it can see that the operand is a view of a larger array: where the view's
start and step are recovered here, the graph holds the whole array and a ``Slice`` whose end
follows the input's size, instead of the traced length baked in.
"""

from __future__ import annotations

import numpy as np


def slice_of_base(view: np.ndarray):
    """``(base, starts, steps)`` such that ``view == base[starts[i]::steps[i], ...]`` cropped
    to ``view.shape``, or None when ``view`` is not such a basic slice.

    Example:
        >>> table = np.arange(20).reshape(4, 5).copy()  # owns its data: NumPy records the
        >>> # owner as every view's .base, so a view of a reshaped view cannot be traced back
        >>> base, starts, steps = slice_of_base(table[1:3, ::2])
        >>> base is table, starts, steps
        (True, [1, 0], [1, 2])
    """
    base = view  # NOTE: NumPy's .base is the array owning the memory, not the sliced one
    while isinstance(base.base, np.ndarray) and base.base.ndim == view.ndim \
            and base.base.dtype == view.dtype:
        base = base.base
    if base is view or not base.flags.c_contiguous or base.size == 0:
        return None
    offset = view.__array_interface__["data"][0] - base.__array_interface__["data"][0]
    starts, steps = [], []
    for size, stride, base_stride in zip(base.shape, view.strides, base.strides):
        start, offset = divmod(offset, base_stride) if base_stride else (0, offset)
        step, remainder = divmod(stride, base_stride) if base_stride else (1, 0)
        if remainder or step <= 0 or not 0 <= start < size:
            return None
        starts.append(int(start))
        steps.append(int(step))
    if offset or not np.array_equal(base[tuple(slice(s, s + n * k, k) for s, n, k in zip(
            starts, view.shape, steps))], view):
        return None
    return base, starts, steps
