"""The core ops as ``eo.`` functions; each is one call to :func:`everyo.dispatch`.

Which of them are ``eo.<name>`` and which are also Tensor methods is decided in one table,
:mod:`everyo.op_surface`.
"""

from __future__ import annotations

from typing import Any, Callable, Protocol

import numpy as np

from everyo.axes import UNSET as _UNSET
from everyo.axes import pytorch_axis as _pytorch_axis
from everyo.dispatch import dispatch
from everyo.errors import EveryOError
from everyo.shape_args import axes as axes_of
from everyo.shape_args import sizes, unpacked


class Reduction(Protocol):
    """The signature of a reduction (``eo.sum(x, axis=None, keepdims=False)``, ``argmax``...),
    spelled out for type checkers; as a Tensor attribute it binds ``x`` (:class:`BoundReduction`)."""

    def __call__(self, x: Any, axis: Any = None, keepdims: bool = False, *, dim: Any = ...,
                 keepdim: Any = ...) -> Any: ...

    def __get__(self, instance: Any, owner: Any = None) -> BoundReduction: ...


class BoundReduction(Protocol):
    """A reduction as a Tensor method: ``x.sum(axis=None, keepdims=False)``."""

    def __call__(self, axis: Any = None, keepdims: bool = False, *, dim: Any = ...,
                 keepdim: Any = ...) -> Any: ...


def _unary(name: str, doc: str) -> Callable[[Any], Any]:
    def fn(x):
        return dispatch(name, x)

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    return fn


neg = _unary("neg", "Elementwise negation.")
abs = _unary("abs", "Elementwise absolute value (gradient sign(x), 0 at 0).")
exp = _unary("exp", "Elementwise e**x.")
log = _unary("log", "Elementwise natural logarithm.")
sqrt = _unary("sqrt", "Elementwise square root.")
tanh = _unary("tanh", "Elementwise hyperbolic tangent.")
sigmoid = _unary("sigmoid", "Elementwise logistic function, stable for large |x|.")
relu = _unary("relu", "Elementwise max(x, 0).")


def _reduction(name: str, doc: str) -> Reduction:
    def fn(x, axis=None, keepdims=False, *, dim=_UNSET, keepdim=_UNSET):
        if dim is not _UNSET or keepdim is not _UNSET:
            axis, keepdims = _pytorch_axis(name, axis, keepdims, dim, keepdim)
        return dispatch(name, x, axis=axis, keepdims=keepdims)

    fn.__name__, fn.__qualname__, fn.__doc__ = name, name, doc
    return fn


sum = _reduction("sum", "Sum over ``axis`` (all axes by default).")
mean = _reduction("mean", "Mean over ``axis`` (all axes by default).")
max = _reduction("max", "Maximum over ``axis``; ties share the gradient.")
min = _reduction("min", "Minimum over ``axis``; ties share the gradient.")


def var(x, axis=None, keepdims=False, ddof=0, *, dim=_UNSET, keepdim=_UNSET):
    """Variance over ``axis``; ``ddof=0`` (NumPy's default) is the population variance."""
    if dim is not _UNSET or keepdim is not _UNSET:
        axis, keepdims = _pytorch_axis("var", axis, keepdims, dim, keepdim)
    return dispatch("var", x, axis=axis, keepdims=keepdims, ddof=ddof)


def add(a, b):
    """``a + b`` with broadcasting."""
    return dispatch("add", a, b)


def sub(a, b):
    """``a - b`` with broadcasting."""
    return dispatch("sub", a, b)


def mul(a, b):
    """``a * b`` with broadcasting."""
    return dispatch("mul", a, b)


def div(a, b):
    """``a / b`` with broadcasting."""
    return dispatch("div", a, b)


def pow(a, b):
    """``a ** b`` with broadcasting."""
    return dispatch("pow", a, b)


def maximum(a, b):
    """Elementwise maximum; where a == b each side gets half the gradient."""
    return dispatch("maximum", a, b)


def minimum(a, b):
    """Elementwise minimum; where a == b each side gets half the gradient."""
    return dispatch("minimum", a, b)


def where(condition, a, b):
    """Elements of ``a`` where ``condition`` holds, else of ``b``."""
    return dispatch("where", condition, a, b)


def clip(x, min=None, max=None):
    """Limit values to [min, max]; the gradient flows where the value was not clipped."""
    return dispatch("clip", x, min=min, max=max)


def matmul(a, b, bias=None):
    """``a @ b``, batched over leading axes; ``bias`` is added in the same op.

    Example:
        >>> import everyo as eo
        >>> eo.matmul(eo.ones(2, 3), eo.ones(3, 4), bias=eo.zeros(4)).shape
        (2, 4)
    """
    if bias is None:
        return dispatch("matmul", a, b)
    return dispatch("matmul", a, b, bias)


def reshape(x, *shape):
    """``x`` with a new shape holding the same elements: ``reshape(x, 2, 3)`` or
    ``reshape(x, (2, 3))``; one size may be -1 (inferred)."""
    return dispatch("reshape", x, shape=sizes(shape, "reshape", minus_one="once"))


def transpose(x, *axes):
    """Permute the axes as NumPy does (reverse them by default): ``transpose(x, (2, 0, 1))``
    or ``x.transpose(2, 0, 1)``.

    Two axes given separately are where ported PyTorch code means ``transpose(dim0, dim1)``,
    a swap. Where NumPy's meaning differs from that swap — ``x.transpose(0, 1)`` on a 2-D
    tensor is NumPy's identity permutation, and two axes of a 3-D tensor are no permutation at
    all — it raises ``EveryOError`` pointing at ``swapaxes`` instead of silently doing
    nothing; ``x.transpose(1, 0)`` on a 2-D tensor is the swap in both meanings and works, and
    ``x.transpose((0, 1))``, a tuple, is the identity on purpose.
    """
    if not axes or axes == (None,):
        return dispatch("transpose", x, axes=None)
    if len(axes) == 2 and not isinstance(axes[0], (tuple, list, np.ndarray)):
        ndim = x.ndim if hasattr(x, "ndim") else np.ndim(x)
        _refuse_a_two_axis_swap(axes_of(axes, ndim, "transpose"), ndim)
    return dispatch("transpose", x, axes=unpacked(axes))  # (the op checks the permutation)


def _refuse_a_two_axis_swap(order: tuple, ndim: int) -> None:
    """``x.transpose(a, b)`` is a permutation only on a 2-D tensor, and there (0, 1) is the
    identity: both are where PyTorch code means a swap of two axes."""
    a, b = (axis % (ndim or 1) for axis in order)  # (`max` here is eo.max)
    if ndim == 2 and (a, b) == (1, 0):
        return  # the swap in both meanings
    what = ("is the identity permutation of a 2-D tensor (NumPy's meaning)" if ndim == 2 else
            f"names 2 of the tensor's {ndim} axes, not a permutation of all of them")
    identity = f"; for the identity on purpose, pass a tuple: x.transpose({order})"
    raise EveryOError(f"transpose{order}: EveryO's transpose permutes the axes as NumPy's does, "
                      f"and this {what}; to swap two axes as PyTorch's transpose(dim0, dim1) "
                      f"does, use x.swapaxes{order}{identity if ndim == 2 else ''}")


def concatenate(tensors, axis=0):
    """Join tensors along an existing axis."""
    return dispatch("concatenate", *tensors, axis=axis)


def stack(tensors, axis=0):
    """Join same-shaped tensors along a new axis."""
    return dispatch("stack", *tensors, axis=axis)


def pad(x, pad_width, value=0.0, mode="constant"):
    """Pad ``x``; a negative width crops instead (as PyTorch's ``F.pad``).

    Args:
        pad_width: as in ``np.pad``: an int, one ``(before, after)`` pair for every axis, or
            one pair per axis (first axis first).
        value: the fill of ``"constant"`` mode.
        mode: ``"constant"``, ``"reflect"`` (mirror without repeating the edge),
            ``"replicate"`` (repeat the edge) or ``"circular"`` (wrap around).

    Example:
        >>> import everyo as eo
        >>> eo.pad(eo.tensor([1.0, 2.0, 3.0, 4.0]), (2, -1), mode="reflect").data
        array([3., 2., 1., 2., 3.], dtype=float32)
    """
    if mode == "constant" and _all_non_negative(pad_width):
        return dispatch("pad", x, pad_width=pad_width, value=value)
    return dispatch("pad_mode", x, pad_width=pad_width, mode=mode, value=value)


def _all_non_negative(pad_width) -> bool:
    try:
        return bool(np.all(np.asarray(pad_width) >= 0))
    except (TypeError, ValueError):  # not widths at all: the op's validation names the problem
        return False


def softmax(x, axis=-1, *, dim=_UNSET):
    """Numerically stable softmax along ``axis`` (PyTorch's ``dim=`` too)."""
    if dim is not _UNSET:
        axis, _ = _pytorch_axis("softmax", axis, False, dim, default_axis=-1)
    return dispatch("softmax", x, axis=axis)


def log_softmax(x, axis=-1, *, dim=_UNSET):
    """Numerically stable log-softmax along ``axis`` (PyTorch's ``dim=`` too)."""
    if dim is not _UNSET:
        axis, _ = _pytorch_axis("log_softmax", axis, False, dim, default_axis=-1)
    return dispatch("log_softmax", x, axis=axis)
