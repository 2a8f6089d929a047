"""In-place writes as dispatched ops: ``add_``, ``sub_``, ``mul_``, ``div_``, ``copy_``
(``fill_``, ``zero_``), ``clamp_`` and ``t[index] = value`` (``setitem``).

Each one goes through ``dispatch`` like every other op, so interceptors see it (the ONNX
tracer exports it or refuses it by name), and each bumps the written tensor's version counter,
so a backward pass through a graph that saved the old values raises instead of computing a
wrong gradient. They are not recorded in the autograd graph (PyTorch records them; EveryO
refuses instead): a write into a tensor that takes part in gradient recording (the written
tensor requires grad, or the written value does, while grad mode is on) raises; inside
``eo.no_grad()`` they are allowed (how an optimizer or an initializer writes a parameter).

An in-place op's ``apply`` returns the written tensor itself, never a new one; operand 0 is
that tensor, the other operands are the values written (Tensors, arrays or numbers, used as
they are: a Python float added to a float16 tensor is not widened first).
"""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.errors import EveryOError, EveryOIndexError
from everyo.grad_mode import _grad_enabled
from everyo.ops.shape import _plain_index
from everyo.tensor import Tensor
from everyo.versioning import bump_version


def _refusal(target: Tensor, method: str) -> str:
    return (f"{method} on a tensor of shape {target.data.shape} that takes part in gradient "
            f"recording: in-place operations are not recorded in the graph. Use the "
            f"out-of-place form (e.g. t = t + x), or wrap the update in `with eo.no_grad():`")


class InPlaceOp(Op):
    """Base of the in-place writes: ``apply`` checks, writes ``operands[0].data`` in place
    (``write``), bumps its version and returns that same tensor."""

    __slots__ = ()
    #: How the user called it, for messages: ``"add_"``, ``"t[index] = value"``.
    method = ""
    differentiable = False  # (never recorded: see the module's docstring)
    in_place = True

    @classmethod
    def apply(cls, target, *values, **attrs) -> Tensor:
        if not isinstance(target, Tensor):
            raise EveryOError(f"{cls.method}: writes into a Tensor, got "
                              f"{type(target).__name__}")
        arrays = []
        for value in values:
            if isinstance(value, Tensor):
                if value.requires_grad and _grad_enabled.get():
                    raise EveryOError(_refusal(target, cls.method))
                value = value.data
            arrays.append(value)
        if target.requires_grad and _grad_enabled.get():
            raise EveryOError(_refusal(target, cls.method))
        if not isinstance(target.data, np.ndarray):
            # a 0-d result NumPy gave as a scalar (a sum): immutable, so nothing shares it,
            # and a 0-d array of its value takes the write
            target.data = np.array(target.data)
        cls.write(target, *arrays, **attrs)
        bump_version(target)
        return target

    @classmethod
    def write(cls, target: Tensor, *values, **attrs) -> None:  # pragma: no cover - interface
        raise NotImplementedError


def _arithmetic(ufunc, method: str):
    class Arithmetic(InPlaceOp):
        __slots__ = ()

        @classmethod
        def write(cls, target: Tensor, value) -> None:
            try:
                ufunc(target.data, value, out=target.data, casting="same_kind")
            except (ValueError, TypeError) as exc:  # NumPy's broadcast / casting / read-only
                raise EveryOError(f"{method}: cannot write a value of shape {np.shape(value)} "
                                  f"({np.asarray(value).dtype}) into a {target.dtype} tensor "
                                  f"of shape {target.data.shape} in place ({exc})") from None

    Arithmetic.method = method
    Arithmetic.__name__ = Arithmetic.__qualname__ = f"InPlace{ufunc.__name__.title()}"
    return Arithmetic


AddInPlace = _arithmetic(np.add, "add_")
SubInPlace = _arithmetic(np.subtract, "sub_")
MulInPlace = _arithmetic(np.multiply, "mul_")
DivInPlace = _arithmetic(np.true_divide, "div_")


class CopyInPlace(InPlaceOp):
    """``copy_``: the source broadcast to the tensor's shape and cast to its dtype."""

    __slots__ = ()
    method = "copy_"

    @classmethod
    def write(cls, target: Tensor, value) -> None:
        try:
            np.copyto(target.data, value, casting="unsafe")
        except ValueError as exc:
            raise EveryOError(f"copy_: a value of shape {np.shape(value)} does not broadcast to "
                              f"the tensor's shape {target.data.shape} ({exc})") from None


class ClampInPlace(InPlaceOp):
    """``clamp_``: operands ``(tensor, *bounds)``; ``bounds`` says which are given:
    ``("min",)``, ``("max",)`` or ``("min", "max")``."""

    __slots__ = ()
    method = "clamp_"

    @classmethod
    def write(cls, target: Tensor, *values, bounds=("min", "max")) -> None:
        given = dict(zip(bounds, values))
        low, high = given.get("min"), given.get("max")
        try:
            np.clip(target.data, low, high, out=target.data, casting="same_kind")
        except (ValueError, TypeError) as exc:  # NumPy's broadcast / casting errors
            raise EveryOError(f"clamp_: cannot clamp a {target.dtype} tensor of shape "
                              f"{target.data.shape} in place to min={low!r}, max={high!r} "
                              f"({exc})") from None


class SetItem(InPlaceOp):
    """``t[index] = value``."""

    __slots__ = ()
    method = "t[index] = value"

    @classmethod
    def write(cls, target: Tensor, value, index=None) -> None:
        try:
            target.data[_plain_index(index)] = value
        except IndexError as exc:
            raise EveryOIndexError(f"t[{index!r}] = value: invalid index for shape "
                                   f"{target.data.shape} ({exc})") from None
        except ValueError as exc:
            raise EveryOError(f"t[{index!r}] = value: a value of shape {np.shape(value)} does "
                              f"not fit the selection of a tensor of shape {target.data.shape} "
                              f"({exc})") from None


OPS = {"add_": AddInPlace, "sub_": SubInPlace, "mul_": MulInPlace, "div_": DivInPlace,
       "copy_": CopyInPlace, "clamp_": ClampInPlace, "setitem": SetItem}
