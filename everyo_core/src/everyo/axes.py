"""Axis arguments: one rule for every op that takes an axis (published in ``everyo.kernels``)."""

from __future__ import annotations

import numpy as np

from everyo.errors import EveryOError


def check_axis(axis, ndim: int, op: str, shape: tuple | None = None) -> int:
    """``axis`` as a non-negative axis of a tensor with ``ndim`` axes, or an ``EveryOError``.

    The rule (PyTorch's): an int or NumPy integer, negatives counting from the end, never a
    bool (``True`` is not axis 1) or a float; an out-of-range axis is an error, never wrapped
    around. A 0-d tensor takes axis 0 or -1, as if it had one axis.

    Args:
        axis: what the caller passed.
        ndim: the number of axes (for ``stack``, the result's: one more than the inputs').
        op: the op's name, for the message.
        shape: the tensor's shape, for the message (optional).

    Returns:
        The axis as a Python int in ``[0, max(ndim, 1))``.

    Example:
        >>> check_axis(-1, 3, "softmax")
        2
        >>> check_axis(True, 3, "softmax")
        Traceback (most recent call last):
        ...
        everyo.errors.EveryOError: softmax: axis must be an int, got True (bool)
    """
    if isinstance(axis, (bool, np.bool_)) or not isinstance(axis, (int, np.integer)):
        raise EveryOError(f"{op}: axis must be an int, got {axis!r} ({type(axis).__name__})")
    bound = max(ndim, 1)
    if not -bound <= axis < bound:
        where = f"shape {tuple(shape)}" if shape is not None else f"a tensor with {ndim} axes"
        raise EveryOError(f"{op}: axis {axis} is out of range for {where}")
    return int(axis) % bound


def check_axes(axes, ndim: int, op: str, shape: tuple | None = None) -> tuple[int, ...]:
    """A tuple or list of axes, each by :func:`check_axis`'s rule, as sorted non-negative axes;
    an axis listed twice (``(1, -1)`` of a 2-D tensor) is an ``EveryOError``.

    Example:
        >>> check_axes((-1, 0), 3, "sum")
        (0, 2)
    """
    checked = [check_axis(a, ndim, op, shape) for a in axes]
    if len(set(checked)) != len(checked):
        twice = next(a for a in checked if checked.count(a) > 1)
        raise EveryOError(f"{op}: axis {twice} is listed twice in {tuple(axes)}")
    return tuple(sorted(checked))
