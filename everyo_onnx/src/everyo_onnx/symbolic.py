"""Sizes that stay symbolic in the exported graph: ``SymInt``.

While the exporter traces a forward pass, reading ``x.shape`` on a traced tensor returns a
``SymInt`` for every axis whose size depends on the input's size (the batch axis, a sequence
axis declared in ``dynamic_axes``). A ``SymInt`` *is* an ``int`` holding the size of the traced
sample, so NumPy and Python code keep working, and it remembers where the size came from
(``Gather(Shape(x), axis)``) and the arithmetic applied to it (``+ - * //``). An op attribute
holding one (``reshape(b, t, -1)``, ``mask[:t, :t]``) becomes a computed tensor in the graph,
so the exported model runs at any size. A Python decision on one (a comparison, ``min()``,
``max()``, ``bool()``: ``if x.shape[0] > 4:``, ``x[:, :min(x.shape[1], 8)]``) would bake the
traced answer into the graph, so it is refused, naming the comparison (the answer is still
given, so the trace goes on and finds every refusal), unless its answer is the same at every
size (a size compared with itself; an axis's size, never negative, with ``-1`` or ``>= 0``).
Arithmetic giving a plain number (``/``, ``%``, ``**``, ``float()``, ``round()``, bit
operations) is refused the same way: its result would be baked into the graph, and the two
traced sizes can agree on it (``int(n / 2)`` at 2 and 3). What still escapes (``range(n)``, a
NumPy array of that size) is caught by tracing at two sizes and comparing the two graphs.
"""

from __future__ import annotations

import numbers
import operator

from everyo_onnx.traced_tensor import active_tracer

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

    def __str__(self) -> str:  # the number's text, as an int's (the traces compare it)
        return str(int(self))

    def __format__(self, spec: str) -> str:
        return format(int(self), spec)

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

#: Arithmetic that gives a plain number (not a size the graph can compute): its result would
#: be baked into the graph, and it can be the same at both traced sizes (``int(n / 2)`` is 1
#: at 2 and 3), so it is refused by name (the answer is still given).
_PLAIN_BINARY = {"truediv": "/", "mod": "%", "pow": "**", "divmod": "divmod", "and": "&",
                 "or": "|", "xor": "^", "lshift": "<<", "rshift": ">>"}


def _plain_binary(name: str, reflected: bool = False):
    compute = getattr(int, f"__{'r' if reflected else ''}{name}__")
    symbol = _PLAIN_BINARY[name]

    def method(self, other):
        if not isinstance(other, numbers.Number):
            return NotImplemented
        left, right = (other, self) if reflected else (self, other)
        text = (f"divmod({describe(left)}, {describe(right)})" if name == "divmod"
                else f"{describe(left)} {symbol} {describe(right)}")
        refuse_decision(text)
        return compute(int(self), other if not isinstance(other, SymInt) else int(other))

    return method


def _plain_unary(name: str):
    compute = getattr(int, f"__{name}__")

    def method(self, *args):
        refuse_decision(f"{name.strip('_')}({describe(self)})")
        return compute(int(self), *args)

    return method


for _name in _PLAIN_BINARY:
    setattr(SymInt, f"__{_name}__", _plain_binary(_name))
    setattr(SymInt, f"__r{_name}__", _plain_binary(_name, reflected=True))
for _name in ("float", "complex", "round", "trunc", "floor", "ceil", "invert"):
    if hasattr(int, f"__{_name}__"):
        setattr(SymInt, f"__{_name}__", _plain_unary(_name))
del _name
# NOTE: an axis's size is never negative: abs() keeps it (and its expression)
SymInt.__abs__ = lambda self: (self if self.expr[0] == "dim"
                               else _plain_unary("abs")(self))

#: Comparisons a SymInt refuses to decide, with how they read in a message.
DECISIONS = {"lt": "<", "le": "<=", "gt": ">", "ge": ">=", "eq": "==", "ne": "!="}
_ALWAYS_WHEN_SAME = {"lt": False, "le": True, "gt": False, "ge": True, "eq": True, "ne": False}


def _decision(name: str):
    compute = getattr(operator, name)

    def method(self, other):
        if not isinstance(other, numbers.Real):
            return NotImplemented
        if not _decided(self, name, other):
            refuse_decision(f"{describe(self)} {DECISIONS[name]} {describe(other)}")
        return compute(int(self), other if not isinstance(other, SymInt) else int(other))

    method.__name__ = f"__{name}__"
    return method


def _decided(size: SymInt, name: str, other) -> bool:
    """Whether ``size <name> other`` has the same answer at every size: a size compared with
    itself, or an axis's size (never negative) with a negative number or ``>= 0``/``< 0``."""
    if isinstance(other, int) and expression(other) == size.expr:
        return True
    if size.expr[0] != "dim" or isinstance(other, SymInt):
        return False
    return other < 0 or (other == 0 and name in ("ge", "lt"))


for _name in DECISIONS:
    setattr(SymInt, f"__{_name}__", _decision(_name))
del _name
SymInt.__hash__ = int.__hash__  # (defining __eq__ would otherwise make it unhashable)


def _truth(self) -> bool:
    refuse_decision(f"bool({describe(self)})")
    return int(self) != 0


SymInt.__bool__ = _truth


def refuse_decision(comparison: str) -> None:
    """Tell the active trace that Python decided ``comparison`` on a symbolic size."""
    tracer = active_tracer.get()
    if tracer is not None:
        tracer.refuse_decision(comparison)


def describe(value) -> str:
    """How a size reads in a message: ``input.shape[1]``, ``(input.shape[1] - 1)``, ``8``."""
    expr = expression(value) if isinstance(value, int) else value
    if not isinstance(expr, tuple):
        return repr(expr)
    if expr[0] == "dim":
        return f"{expr[1]}.shape[{expr[2]}]"
    symbol = {"add": "+", "sub": "-", "mul": "*", "floordiv": "//"}[expr[0]]
    return f"({describe(expr[1])} {symbol} {describe(expr[2])})"


def expression(value):
    """``value.expr`` for a SymInt, the plain int otherwise."""
    return value.expr if isinstance(value, SymInt) else int(value)
