"""Axis arguments: one rule for every op that takes an axis (published in ``everyo.kernels``)."""

from __future__ import annotations

from typing import Any

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


#: An argument left out (``None`` is a value ``dim`` may have).
UNSET: Any = ...

#: Why a PyTorch ``dim=`` does not carry over to these functions unchanged.
_DIM_DIFFERS = {
    "max": "PyTorch's max(dim=) returns (values, indices): here max(axis=) gives the values "
           "and argmax(axis=) the indices",
    "min": "PyTorch's min(dim=) returns (values, indices): here min(axis=) gives the values "
           "and argmin(axis=) the indices",
    "var": "PyTorch's var(dim=) is the sample variance (correction=1); here var(axis=) is the "
           "population variance unless ddof=1",
}


def pytorch_axis(name: str, axis, keepdims, dim=UNSET, keepdim=UNSET,
                 default_axis=None) -> tuple:
    """``(axis, keepdims)`` with PyTorch's spellings ``dim=``/``keepdim=`` accepted for
    EveryO's ``axis=``/``keepdims=`` where they mean the same (one of each pair, not both);
    where PyTorch's function returns something else for ``dim=`` (``max``, ``min``, ``var``)
    it is an ``EveryOError`` saying what to call instead, never a silent difference.
    ``axis`` equal to ``default_axis`` counts as not given.

    Example:
        >>> pytorch_axis("sum", None, False, dim=1, keepdim=True)
        (1, True)
    """
    if dim is not UNSET:
        if name in _DIM_DIFFERS:
            raise EveryOError(f"{name}: dim= is not taken: {_DIM_DIFFERS[name]}")
        if axis is not default_axis and axis != default_axis:  # (axis given too)
            raise EveryOError(f"{name}: got both axis={axis!r} and PyTorch's dim={dim!r}; "
                              f"pass one")
        # PyTorch's sum/mean(dim=[]) reduce every axis (NumPy's axis=() reduces none)
        empty = isinstance(dim, (tuple, list)) and not dim
        axis = None if empty and name in ("sum", "mean") else dim
    if keepdim is not UNSET:
        if keepdims:
            raise EveryOError(f"{name}: got both keepdims and PyTorch's keepdim; pass one")
        keepdims = keepdim
    return axis, keepdims
