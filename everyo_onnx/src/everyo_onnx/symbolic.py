"""Sizes that stay symbolic in the exported graph: ``SymInt``.

While the exporter traces a forward pass, reading ``x.shape`` on a traced tensor returns a
``SymInt`` for every axis whose size depends on the input's size (the batch axis, a sequence
axis declared in ``dynamic_axes``). A ``SymInt`` *is* an ``int`` holding the size of the traced
sample, so NumPy and Python code keep working, and it remembers where the size came from
(``Gather(Shape(x), axis)``) and the arithmetic applied to it (``+ - * //``). An op attribute
holding one (``reshape(b, t, -1)``, ``mask[:t, :t]``) becomes a computed tensor in the graph,
so the exported model runs at any size. Anything else done with it (``/``, ``%``, ``float()``,
a comparison in an ``if``) gives a plain number, baked into the graph; the exporter catches the
difference by tracing at two sizes and comparing the two graphs.
"""

from __future__ import annotations

import operator

#: Operations that keep a SymInt symbolic, with the ONNX node that computes them.
ONNX_ARITHMETIC = {"add": "Add", "sub": "Sub", "mul": "Mul", "floordiv": "Div"}
_PYTHON = {"add": operator.add, "sub": operator.sub, "mul": operator.mul,
           "floordiv": operator.floordiv}


class SymInt(int):
    """An int whose value is the traced sample's size and whose ``expr`` says how to compute
    it in the graph: ``("dim", value_name, axis)`` or ``(operation, left, right)``.

    Example:
        >>> t = SymInt(5, ("dim", "tokens", 1))
        >>> int(t + 1), (t + 1).expr
        (6, ('add', ('dim', 'tokens', 1), 1))
    """

    # NOTE: no __slots__: CPython allows no non-empty slots on an int subclass.

    def __new__(cls, value: int, expr: tuple):
        self = super().__new__(cls, value)
        self.expr = expr
        return self

    def __repr__(self) -> str:
        return f"SymInt({int(self)})"

    def __reduce__(self):  # a SymInt copied or pickled is just its value
        return int, (int(self),)


def _symbolic(name: str, reflected: bool = False):
    compute = _PYTHON[name]

    def method(self, other):
        if not isinstance(other, int) or isinstance(other, bool):
            return compute(other, int(self)) if reflected else compute(int(self), other)
        left, right = (other, self) if reflected else (self, other)
        # NOTE: // rounds toward -inf in Python and toward zero in ONNX's integer Div; the
        # graph floors explicitly (GraphContext._dim), so ``-t // 2`` exports right.
        value = compute(int(left), int(right))
        return SymInt(value, (name, expression(left), expression(right)))

    return method


for _name in ONNX_ARITHMETIC:
    setattr(SymInt, f"__{_name}__", _symbolic(_name))
    setattr(SymInt, f"__r{_name}__", _symbolic(_name, reflected=True))
SymInt.__neg__ = lambda self: SymInt(-int(self), ("sub", 0, self.expr))
SymInt.__pos__ = lambda self: self
del _name


def expression(value):
    """``value.expr`` for a SymInt, the plain int otherwise."""
    return value.expr if isinstance(value, SymInt) else int(value)
