"""Size and axis lists given PyTorch's two ways, ``f(2, 3)`` or ``f((2, 3))``: one parser for
the creation functions, ``reshape``/``view``, ``expand``, ``permute`` and ``transpose``; and
``Size``, what ``t.size`` returns (NumPy's int, PyTorch's ``size()``)."""

from __future__ import annotations

from typing import overload

import numpy as np

from everyo.axes import check_axis
from everyo.errors import EveryOError


def unpacked(args: tuple) -> tuple:
    """``args`` itself, or the one tuple/list/array it holds: ``(2, 3)``, ``((2, 3),)`` and
    ``([2, 3],)`` are all ``(2, 3)``."""
    if len(args) == 1 and isinstance(args[0], (tuple, list, np.ndarray)):
        return tuple(args[0])
    return args


def _is_int(value) -> bool:
    return isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))


def sizes(args: tuple, op: str, minus_one: str = "never") -> tuple[int, ...]:
    """The sizes in ``args`` (varargs or one sequence) as Python ints, or an ``EveryOError``.

    Args:
        args: what the caller passed (``*shape``).
        op: the function's name, for the message.
        minus_one: where a size may be ``-1``: ``"never"``, ``"once"`` (inferred, as in
            ``reshape``) or ``"any"`` (kept, as in ``expand``).

    Example:
        >>> sizes(((2, 3),), "zeros")
        (2, 3)
        >>> sizes((2, -1), "zeros")
        Traceback (most recent call last):
        ...
        everyo.errors.EveryOError: zeros: size -1 in (2, -1) is negative
    """
    shape = unpacked(args)
    for size in shape:  # the hot case first: plain ints, -1 where allowed
        if type(size) is not int or size < -1:
            break
    else:
        unknown = shape.count(-1)
        if not unknown or (unknown == 1 and minus_one != "never") or minus_one == "any":
            return shape
    for size in shape:
        if not _is_int(size):
            raise EveryOError(f"{op}: sizes must be ints, got {size!r} ({type(size).__name__})")
    # NOTE: the checks look at int(size) and the sizes are returned as given: an int subclass
    # (the ONNX tracer's symbolic sizes) keeps what it knows, and is never compared.
    values = [int(size) for size in shape]
    if minus_one == "once" and values.count(-1) > 1:
        raise EveryOError(f"{op}: only one size may be -1 (inferred), got {tuple(values)}")
    for value in values:
        if value < -1 or (value == -1 and minus_one == "never"):
            raise EveryOError(f"{op}: size {value} in {tuple(values)} is negative")
    return tuple(size if type(size) is not int and isinstance(size, int) else value
                 for size, value in zip(shape, values))


def axes(args: tuple, ndim: int, op: str) -> tuple[int, ...]:
    """The axes in ``args`` (varargs or one sequence), each checked by ``check_axis`` and kept
    as given (negative ones too)."""
    found = unpacked(args)
    for axis in found:
        if type(axis) is not int or not -ndim <= axis < ndim:
            check_axis(axis, ndim, op)  # (the rule and its message; plain ints in range pass)
    return tuple(found)


class Size(int):
    """``t.size``: the number of elements, an int as NumPy's ``size`` is; called, it is
    PyTorch's ``t.size()`` (the shape, a tuple) or ``t.size(axis)`` (one axis' length).

    Example:
        >>> import everyo as eo
        >>> x = eo.zeros(2, 3)
        >>> x.size, x.size(), x.size(-1)
        (6, (2, 3), 3)
    """

    shape: tuple

    def __new__(cls, count: int, shape: tuple) -> Size:
        size = int.__new__(cls, count)
        size.shape = shape
        return size

    @overload
    def __call__(self) -> tuple: ...

    @overload
    def __call__(self, dim: int) -> int: ...

    def __call__(self, dim=None):
        if dim is None:
            return self.shape
        if not self.shape:
            raise EveryOError(f"size({dim!r}): a 0-d tensor has no axes")
        return self.shape[check_axis(dim, len(self.shape), "size", self.shape)]

    def __reduce__(self):  # pickled, copied and saved as the plain int it is
        return (int, (int(self),))
