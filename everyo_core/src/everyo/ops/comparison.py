"""Comparisons as dispatched ops: ``lt``, ``le``, ``gt``, ``ge``, ``eq``, ``ne``.

``x > 0`` goes through ``dispatch`` like ``x + 0``, so interceptors see it (the ONNX tracer
writes a Less/Greater/Equal node). The result is a boolean tensor that is never recorded: it
has no gradient (as in PyTorch). The operands are compared as NumPy compares them, without
first converting a Python number to the tensor's dtype (an int64 tensor against 0.5 is
compared exactly, not through float32).
"""

from __future__ import annotations

import numpy as np

from everyo.autograd import Op
from everyo.errors import EveryOError
from everyo.tensor import Tensor


def _array(value):
    return value.data if isinstance(value, Tensor) else value


class Comparison(Op):
    """Base of the six comparisons: an elementwise NumPy comparison, unrecorded."""

    __slots__ = ()
    ufunc = np.equal
    differentiable = False  # (never recorded: a boolean result has no gradient)

    @classmethod
    def apply(cls, a, b) -> Tensor:
        x, y = _array(a), _array(b)
        try:
            out = cls.ufunc(x, y)
        except (ValueError, TypeError) as exc:  # shapes that do not broadcast, odd types
            raise EveryOError(f"{cls.name}: cannot compare shapes {np.shape(x)} and "
                              f"{np.shape(y)} ({exc})") from None
        return Tensor._make(out if type(out) is np.ndarray else np.asarray(out), False, None)


def _comparison(ufunc):
    cls = type(f"Compare{ufunc.__name__.title().replace('_', '')}", (Comparison,),
               {"__slots__": (), "ufunc": ufunc, "__module__": __name__,
                "__doc__": f"``np.{ufunc.__name__}`` of two operands, unrecorded."})
    return cls


OPS = {"lt": _comparison(np.less), "le": _comparison(np.less_equal),
       "gt": _comparison(np.greater), "ge": _comparison(np.greater_equal),
       "eq": _comparison(np.equal), "ne": _comparison(np.not_equal)}
