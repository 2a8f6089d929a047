"""In-place tensor methods: ``add_``, ``sub_``, ``mul_``, ``div_``, ``fill_``, ``zero_``,
``copy_``, ``clamp_`` and ``t[index] = value``.

They are not recorded in the autograd graph. Like PyTorch, they refuse a tensor that takes part
in gradient recording (a tensor that requires grad, or a value that does, while grad mode is on);
inside ``eo.no_grad()`` they are allowed (that is how an optimizer or an initializer writes a
parameter). Every write bumps the tensor's version counter, so a backward pass through a graph
that saved the old values raises instead of computing a wrong gradient.
"""

from __future__ import annotations

import numpy as np

from everyo.errors import EveryOError, EveryOIndexError
from everyo.grad_mode import is_grad_enabled
from everyo.tensor import Tensor
from everyo.versioning import bump_version


def _value(other):
    return other.data if isinstance(other, Tensor) else other


def _check_recordable(t: Tensor, method: str, other=None) -> None:
    if not is_grad_enabled():
        return
    if t.requires_grad or (isinstance(other, Tensor) and other.requires_grad):
        raise EveryOError(
            f"{method} on a tensor of shape {t.shape} that takes part in gradient recording: "
            f"in-place operations are not recorded in the graph. Use the out-of-place form "
            f"(e.g. t = t + x), or wrap the update in `with eo.no_grad():`"
        )


def _write(t: Tensor, method: str, ufunc, other) -> Tensor:
    _check_recordable(t, method, other)
    value = _value(other)
    try:
        ufunc(t.data, value, out=t.data, casting="same_kind")
    except (ValueError, TypeError) as exc:  # NumPy's broadcast / casting / read-only errors
        shape = np.shape(value)
        raise EveryOError(f"{method}: cannot write a value of shape {shape} "
                          f"({np.asarray(value).dtype}) into a {t.dtype} tensor of shape "
                          f"{t.shape} in place ({exc})") from None
    bump_version(t)
    return t


def _scaled(t: Tensor, other, alpha, method: str):
    """``other * alpha`` (PyTorch's ``alpha=`` of ``add_``/``sub_``), ``other`` checked first."""
    _check_recordable(t, method, other)
    if isinstance(alpha, (bool, np.bool_)) or not isinstance(alpha, (int, float, np.number)):
        raise EveryOError(f"{method}: alpha must be a number, got {alpha!r}")
    return other if alpha == 1 else _value(other) * alpha


def add_(self: Tensor, other, alpha=1) -> Tensor:
    """``self += alpha * other`` in place (not recorded for autograd); returns ``self``.

    Example:
        >>> import everyo as eo
        >>> eo.ones(2).add_(1.0).data
        array([2., 2.], dtype=float32)
    """
    return _write(self, "add_", np.add, _scaled(self, other, alpha, "add_"))


def sub_(self: Tensor, other, alpha=1) -> Tensor:
    """``self -= alpha * other`` in place; returns ``self``."""
    return _write(self, "sub_", np.subtract, _scaled(self, other, alpha, "sub_"))


def mul_(self: Tensor, other) -> Tensor:
    """``self *= other`` in place; returns ``self``."""
    return _write(self, "mul_", np.multiply, other)


def div_(self: Tensor, other) -> Tensor:
    """``self /= other`` in place (a floating tensor); returns ``self``."""
    return _write(self, "div_", np.true_divide, other)


def copy_(self: Tensor, source) -> Tensor:
    """Copy ``source``'s values (broadcast, cast to this dtype) into ``self``; returns ``self``."""
    _check_recordable(self, "copy_", source)
    value = _value(source)
    try:
        np.copyto(self.data, value, casting="unsafe")
    except ValueError as exc:
        raise EveryOError(f"copy_: a value of shape {np.shape(value)} does not broadcast to "
                          f"the tensor's shape {self.shape} ({exc})") from None
    bump_version(self)
    return self


def fill_(self: Tensor, value) -> Tensor:
    """Set every element to ``value``; returns ``self``."""
    return copy_(self, value)


def zero_(self: Tensor) -> Tensor:
    """Set every element to 0; returns ``self``."""
    return copy_(self, 0)


def clamp_(self: Tensor, min=None, max=None) -> Tensor:
    """Limit the values to [min, max] in place; returns ``self``."""
    _check_recordable(self, "clamp_")
    try:
        np.clip(self.data, _value(min), _value(max), out=self.data, casting="same_kind")
    except (ValueError, TypeError) as exc:  # NumPy's broadcast / casting errors
        raise EveryOError(f"clamp_: cannot clamp a {self.dtype} tensor of shape {self.shape} "
                          f"in place to min={min!r}, max={max!r} ({exc})") from None
    bump_version(self)
    return self


def setitem(self: Tensor, index, value) -> None:
    """``t[index] = value``: writes in place and bumps the version."""
    from everyo.ops.shape import _plain_index

    _check_recordable(self, "t[index] = value", value)
    try:
        self.data[_plain_index(index)] = _value(value)
    except IndexError as exc:
        raise EveryOIndexError(f"t[{index!r}] = value: invalid index for shape {self.shape} "
                               f"({exc})") from None
    except ValueError as exc:
        raise EveryOError(f"t[{index!r}] = value: a value of shape {np.shape(_value(value))} "
                          f"does not fit the selection of a tensor of shape {self.shape} "
                          f"({exc})") from None
    bump_version(self)


METHODS = {"add_": add_, "sub_": sub_, "mul_": mul_, "div_": div_, "copy_": copy_,
           "fill_": fill_, "zero_": zero_, "clamp_": clamp_, "__setitem__": setitem}

for _name, _method in METHODS.items():
    setattr(Tensor, _name, _method)
del _name, _method
