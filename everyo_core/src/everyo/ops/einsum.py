"""``einsum``: Einstein summation over any number of operands.

The gradient for operand ``i`` is itself an einsum: the output gradient contracted with the
other operands, written back to operand ``i``'s subscripts. Letters only operand ``i`` has
(summed away in the forward pass) are broadcast back; a letter repeated within one operand (a
diagonal, ``"ii->i"``) puts its gradient on that diagonal.
"""

from __future__ import annotations

import string

import numpy as np

from everyo.autograd import Op
from everyo.dispatch import dispatch
from everyo.dtypes import HALF_DTYPES, result_dtype
from everyo.errors import EveryOError
from everyo.half_precision import narrow, widen


def parse_equation(equation: str, shapes: list) -> tuple[list[str], str]:
    """Subscripts of every operand and of the output, with ``...`` spelled out as letters."""
    equation = equation.replace(" ", "")
    inputs, arrow, output = equation.partition("->")
    terms = inputs.split(",")
    if len(terms) != len(shapes):
        raise EveryOError(f"einsum: {equation!r} names {len(terms)} operands, got "
                          f"{len(shapes)}")
    free = [c for c in string.ascii_letters if c not in equation]
    widest = 0
    for term, shape in zip(terms, shapes):
        named = len(term.replace("...", ""))
        if "..." in term:
            widest = max(widest, len(shape) - named)
        elif named != len(shape):
            raise EveryOError(f"einsum: subscripts {term!r} name {named} axes, the operand "
                              f"has shape {shape}")
    ellipsis = "".join(free[:widest])
    spelled = []
    for term, shape in zip(terms, shapes):
        if "..." in term:
            count = len(shape) - len(term.replace("...", ""))
            term = term.replace("...", ellipsis[widest - count:])
        spelled.append(term)
    if arrow:
        output = output.replace("...", ellipsis)
    else:
        counts = {c: "".join(spelled).count(c) for c in set("".join(spelled))}
        output = ellipsis + "".join(sorted(c for c, n in counts.items()
                                           if n == 1 and c not in ellipsis))
    return spelled, output


def operand_grad_plan(i: int, terms: list[str], output: str, shapes: list) -> tuple:
    """How to build operand ``i``'s gradient: (equation, the letters it yields, the letters
    to broadcast back, the operand's distinct letters in order)."""
    term = terms[i]
    unique = "".join(dict.fromkeys(term))
    others = [t for j, t in enumerate(terms) if j != i]
    elsewhere = set(output).union(*others)
    produced = "".join(c for c in unique if c in elsewhere)
    equation = ",".join([output] + others) + "->" + produced
    missing = [c for c in unique if c not in elsewhere]
    return equation, produced, missing, unique


class Einsum(Op):
    """``np.einsum(equation, *operands)`` with a gradient for every operand."""

    __slots__ = ("terms", "output", "shapes", "equation")
    saves_output = False
    gradient_reads = "others"  # each operand's gradient contracts the others

    def forward(self, *xs, equation):
        self.shapes = [x.shape for x in xs]
        self.terms, self.output = parse_equation(equation, self.shapes)
        self.equation = ",".join(self.terms) + "->" + self.output
        self.saved = xs
        half = any(x.dtype in HALF_DTYPES for x in xs)
        try:
            # NOTE: np.einsum has no bfloat16 loop (TypeError) and sums float16 in float16:
            # 16-bit operands are contracted in float32 and rounded once, like matmul.
            out = np.asarray(np.einsum(self.equation, *[widen(x) for x in xs],
                                       optimize=len(xs) > 2))
        except ValueError as exc:
            raise EveryOError(f"einsum {equation!r} on shapes {self.shapes}: {exc}") from None
        return narrow(out, result_dtype(*xs)) if half else out

    def _plans(self):
        """``(i, plan)`` for each operand, ``plan`` None where no gradient is wanted."""
        for i, needed in enumerate(self.needs_input_grad):
            yield i, (operand_grad_plan(i, self.terms, self.output, self.shapes)
                      if needed else None)

    def backward(self, g):
        xs = self.saved
        grads = []
        for i, plan in self._plans():
            if plan is None:
                grads.append(None)
                continue
            equation, produced, missing, unique = plan
            others = [widen(x) for j, x in enumerate(xs) if j != i]
            # (a 16-bit gradient comes back in float32; the engine rounds it to the operand's)
            grad = np.einsum(equation, widen(g), *others, optimize=len(others) > 1)
            own = dict(zip(self.terms[i], self.shapes[i]))
            if missing:
                grad = np.expand_dims(grad, tuple(unique.index(c) for c in missing))
                grad = np.broadcast_to(grad, tuple(n if c in produced else own[c]
                                                   for c, n in zip(unique, grad.shape)))
            grad = _fit(grad, unique, self.terms[i], self.shapes[i])
            grads.append(grad)
        return tuple(grads)

    def backward_graph(self, g, out):
        grads = []
        for i, plan in self._plans():
            if plan is None:
                grads.append(None)
                continue
            equation, produced, missing, unique = plan
            others = [x for j, x in enumerate(self.parents) if j != i]
            grad = dispatch("einsum", g, *others, equation=equation)
            own = dict(zip(self.terms[i], self.shapes[i]))
            if missing:
                sizes = iter(grad.shape)
                shape = tuple(next(sizes) if c in produced else 1 for c in unique)
                grad = dispatch("reshape", grad, shape=shape)
                grad = dispatch("expand", grad, shape=tuple(
                    n if c in produced else own[c] for c, n in zip(unique, shape)))
            summed = tuple(a for a, (c, n) in enumerate(zip(unique, grad.shape)) if own[c] != n)
            if summed:
                grad = dispatch("sum", grad, axis=summed, keepdims=True)
            if len(unique) != len(self.terms[i]):
                equation, eyes = diagonal_plan(self.terms[i], unique, own, grad.data.dtype)
                grad = dispatch("einsum", grad, *eyes, equation=equation)
            grads.append(grad)
        return tuple(grads)


def diagonal_plan(term: str, unique: str, sizes: dict, dtype) -> tuple:
    """An einsum equation and identity matrices that put a gradient over ``unique`` letters
    back onto the diagonals of an operand whose subscripts ``term`` repeat a letter."""
    free = iter(c for c in string.ascii_letters if c not in term)
    spread, deltas, eyes, seen = [], [], [], set()
    for c in term:
        if c in seen:
            fresh = next(free)
            spread.append(fresh)
            deltas.append(c + fresh)
            eyes.append(np.eye(sizes[c], dtype=dtype))
        else:
            seen.add(c)
            spread.append(c)
    return ",".join([unique] + deltas) + "->" + "".join(spread), eyes


def _fit(grad: np.ndarray, unique: str, term: str, shape: tuple) -> np.ndarray:
    """Sum axes the operand broadcast (size 1 there) and put repeated letters on diagonals."""
    own = dict(zip(term, shape))
    summed = tuple(a for a, c in enumerate(unique) if own[c] != grad.shape[a])
    if summed:
        grad = grad.sum(axis=summed, keepdims=True)
    if len(unique) == len(term):
        # NOTE: a copy of a broadcast view (np.ascontiguousarray would turn a 0-d grad 1-d)
        return grad if grad.flags.c_contiguous and grad.flags.writeable else grad.copy()
    equation, eyes = diagonal_plan(term, unique, own, grad.dtype)
    return np.einsum(equation, grad, *eyes)


OPS = {"einsum": Einsum}
