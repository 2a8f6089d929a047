"""NumPy's protocols on ``Tensor``: ``__array_ufunc__`` and ``__array_function__``.

The rules (docs/autograd.md, "NumPy functions on tensors"):

* A NumPy function with an EveryO op of the same meaning (``np.exp``, ``np.add``,
  ``np.matmul``, ``np.sum``, ``np.maximum``, ``np.where``, ...), called without arguments the
  op does not take (``out=``, ``where=``, ``dtype=``...), dispatches to that op and returns a
  Tensor, recorded as the op would be: ``np.exp(x) * w`` differentiates through the exp.
* Any other NumPy function runs on the arrays and returns what NumPy returns (ndarrays, as
  before these protocols existed), unless that would hand out floating values computed from a
  tensor that records gradients (it requires grad, grad mode is on): that raises an
  ``EveryOError`` naming the function, because the result would silently leave the graph.
  Results that carry no gradient (``np.isfinite``, ``np.argmax``, ``np.allclose``,
  ``np.shape``) are returned as usual.
"""

from __future__ import annotations

import functools
import inspect
from typing import Any

import numpy as np

from everyo import functional
from everyo.dispatch import dispatch
from everyo.errors import EveryOError
from everyo.grad_mode import _grad_enabled

#: ufunc -> registered op, for ``ufunc(*tensors)`` with no keyword arguments.
UFUNC_OPS = {
    np.add: "add", np.subtract: "sub", np.multiply: "mul", np.true_divide: "div",
    np.power: "pow", np.matmul: "matmul", np.negative: "neg", np.absolute: "abs",
    np.exp: "exp", np.log: "log", np.sqrt: "sqrt", np.tanh: "tanh", np.maximum: "maximum",
    np.minimum: "minimum", np.less: "lt", np.less_equal: "le", np.greater: "gt",
    np.greater_equal: "ge", np.equal: "eq", np.not_equal: "ne",
}


def _reduction(fn):
    def call(a, axis=None, keepdims=False):
        return fn(a, axis=axis, keepdims=keepdims)

    return call


#: NumPy function -> EveryO function taking the same arguments (a subset of NumPy's: a call
#: with any other keyword argument is not translated).
FUNCTION_OPS: dict[Any, Any] = {
    np.sum: _reduction(functional.sum), np.mean: _reduction(functional.mean),
    np.max: _reduction(functional.max), np.min: _reduction(functional.min),
    np.amax: _reduction(functional.max), np.amin: _reduction(functional.min),
    np.var: lambda a, axis=None, keepdims=False, ddof=0: functional.var(a, axis, keepdims, ddof),
    np.reshape: lambda a, shape: functional.reshape(a, shape),
    np.transpose: lambda a, axes=None: functional.transpose(a, axes),
    np.clip: lambda a, a_min=None, a_max=None: functional.clip(a, a_min, a_max),
    np.where: lambda condition, x, y: functional.where(condition, x, y),
    np.concatenate: lambda arrays, axis=0: functional.concatenate(list(arrays), axis),
    np.stack: lambda arrays, axis=0: functional.stack(list(arrays), axis),
}


def array_ufunc(tensor_class, ufunc, method: str, inputs: tuple, kwargs: dict):
    """``Tensor.__array_ufunc__``: the op of the same meaning, or NumPy on the arrays."""
    name = UFUNC_OPS.get(ufunc)
    if name is not None and method == "__call__" and not kwargs:
        return dispatch(name, *inputs)
    label = f"np.{ufunc.__name__}" + ("" if method == "__call__" else f".{method}")
    # NOTE: ufunc.at writes its first operand in place and (NumPy 2.4) ignores a read-only
    # flag, so it is refused here rather than by _without_writes.
    if (any(isinstance(o, tensor_class) for o in kwargs.get("out", ()))
            or (method == "at" and isinstance(inputs[0], tensor_class))):
        raise EveryOError(f"{label}(..., out=tensor): NumPy cannot write into a Tensor; use "
                          f"the in-place methods (t.copy_(...), t.add_(...)) instead")
    arrays = _unwrapped(tensor_class, inputs)
    result = _without_writes(label, getattr(ufunc, method), arrays, kwargs)
    _check_no_lost_gradient(tensor_class, label, (inputs, kwargs), result)
    return result


def array_function(tensor_class, func, args: tuple, kwargs: dict):
    """``Tensor.__array_function__``: the EveryO function of the same meaning, or NumPy on
    the arrays."""
    translated = FUNCTION_OPS.get(func)
    arguments = None if translated is None else _bound(func, translated, args, kwargs)
    if translated is not None and arguments is not None:
        try:
            return translated(**arguments)
        except TypeError:  # a value EveryO's function does not take
            pass
    module = getattr(func, "__module__", None) or "numpy"
    label = f"{module.replace('numpy', 'np', 1)}.{getattr(func, '__name__', func)}"
    result = _without_writes(label, func, _unwrapped(tensor_class, args),
                             _unwrapped(tensor_class, kwargs))
    _check_no_lost_gradient(tensor_class, label, (args, kwargs), result)
    return result


_signature = functools.cache(inspect.signature)


def _bound(func, translated, args: tuple, kwargs: dict) -> dict | None:
    """``func(*args, **kwargs)``'s arguments by NumPy's parameter names, or None when the call
    gives one ``translated`` does not take (``out=``, ``dtype=``..., by keyword or by
    position: ``np.max(t, 0, out)``'s third argument is ``out``, not ``keepdims``)."""
    try:
        signature = _signature(func)
        numpy_parameters = signature.parameters
        bound = signature.bind(*args, **kwargs).arguments
    except (TypeError, ValueError):  # NumPy itself will name the wrong call
        return None
    ours = _signature(translated).parameters
    for name, value in bound.items():
        if name not in ours and value is not numpy_parameters[name].default:
            return None
    return {name: value for name, value in bound.items() if name in ours}


def _without_writes(label: str, call, args, kwargs):
    """``call(*args, **kwargs)`` on read-only views of the tensors: a NumPy function that
    would write into one (np.copyto, np.put, ufunc.at, out=...) would bypass the version
    counter, so it is refused by name instead."""
    try:
        return call(*args, **kwargs)
    except ValueError as exc:
        if "read-only" not in str(exc):
            raise
        raise EveryOError(f"{label} would write into a Tensor: NumPy cannot write into a "
                          f"Tensor (its version counter would not see it); use the in-place "
                          f"methods (t.copy_(...), t[index] = value, t.add_(...)) "
                          f"instead") from None


def _unwrapped(tensor_class, value):
    """``value`` with every Tensor inside (lists, tuples, dicts) replaced by a read-only view
    of its array."""
    if isinstance(value, tensor_class):
        view = value.data.view()
        view.flags.writeable = False
        return view
    if isinstance(value, (list, tuple)):
        return type(value)(_unwrapped(tensor_class, v) for v in value)
    if isinstance(value, dict):
        return {k: _unwrapped(tensor_class, v) for k, v in value.items()}
    return value


def _records(tensor_class, value) -> bool:
    if isinstance(value, tensor_class):
        return value.requires_grad
    if isinstance(value, (list, tuple)):
        return any(_records(tensor_class, v) for v in value)
    if isinstance(value, dict):
        return any(_records(tensor_class, v) for v in value.values())
    return False


def _floating(result) -> bool:
    if isinstance(result, (tuple, list)):
        return any(_floating(r) for r in result)
    dtype = getattr(result, "dtype", None)
    return dtype is not None and np.dtype(dtype).kind in "fcV" or isinstance(result, float)


def _check_no_lost_gradient(tensor_class, label: str, arguments, result) -> None:
    if _grad_enabled.get() and _floating(result) and _records(tensor_class, arguments):
        raise EveryOError(
            f"{label} on a tensor that records gradients: EveryO has no op for it (or not "
            f"with these arguments), so its result would leave the graph and the gradient "
            f"through it would be silently lost. Use the EveryO op (eo.exp, eo.sum, ...), or "
            f".detach() the tensor (or work under eo.no_grad()) when no gradient is wanted")
