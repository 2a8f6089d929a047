"""The public op surface in one table: which functions are ``eo.<name>`` and which are also
``Tensor`` methods.

Each function is defined once, in the module the table names (``functional``: the core ops;
``conveniences``: the PyTorch-porting functions; ``tensor``: those that build a tensor outside
the graph, such as ``argmax``). The two static listings type checkers need are generated from
this table: the ``from everyo.<module> import ...`` statements of ``everyo/__init__.py`` and the
method block of the ``Tensor`` class body (``exp = functional.exp``). After editing the table,
run ``python everyo_core/src/everyo/op_surface.py`` (or ``python -m everyo.op_surface``) to
rewrite them; ``tests/core/test_op_surface.py`` fails
while they disagree. This module imports nothing from EveryO (``tensor.py`` is generated from it).
"""

from __future__ import annotations

import ast
import os
import sys
from pathlib import Path

FUNCTION, METHOD = "function", "method"
BOTH = (FUNCTION, METHOD)

#: name -> (the module defining it, its forms: ``eo.<name>``, ``Tensor.<name>`` or both).
SURFACE: dict[str, tuple[str, tuple[str, ...]]] = {
    **{name: ("functional", BOTH) for name in (
        "neg", "abs", "exp", "log", "sqrt", "tanh", "sigmoid", "relu", "pow", "clip",
        "maximum", "minimum", "sum", "mean", "max", "min", "var", "softmax", "log_softmax",
        "matmul", "reshape", "transpose", "pad")},
    **{name: ("functional", (FUNCTION,)) for name in (
        "add", "sub", "mul", "div", "where", "concatenate", "stack")},
    **{name: ("conveniences", BOTH) for name in (
        "split", "chunk", "view", "masked_fill", "tril", "triu", "diag", "unsqueeze",
        "permute", "swapaxes", "expand", "gather", "cumsum")},
    "einsum": ("conveniences", (FUNCTION,)),
    **{name: ("tensor", BOTH) for name in ("argmax", "argmin", "multinomial")},
}

#: What ``everyo/__init__.py`` imports from ``everyo.tensor`` besides the table's functions.
TENSOR_MODULE_EXPORTS = ("Tensor", "arange", "full", "full_like", "ones", "ones_like", "rand",
                         "rand_like", "randn", "randn_like", "tensor", "zeros", "zeros_like")

HERE = Path(__file__).resolve().parent
BEGIN = "    # -- methods generated from everyo/op_surface.py (python -m everyo.op_surface) --\n"
END = "    # -- end of the generated methods --\n"


def names(module: str, form: str) -> list[str]:
    """The table's names defined in ``module`` that have ``form``, sorted."""
    return sorted(n for n, (where, forms) in SURFACE.items() if where == module and form in forms)


def method_block() -> str:
    """The ``Tensor`` class body's generated lines (``exp = functional.exp``)."""
    lines = [f"    {n} = {'' if SURFACE[n][0] == 'tensor' else SURFACE[n][0] + '.'}{n}\n"
             for n in sorted(n for n, (_, forms) in SURFACE.items() if METHOD in forms)]
    return BEGIN + "".join(lines) + END


def export_statement(module: str) -> str:
    """``from everyo.<module> import (...)`` as ``everyo/__init__.py`` holds it (isort style)."""
    exported = names(module, FUNCTION)
    if module == "tensor":
        exported = sorted(set(exported) | set(TENSOR_MODULE_EXPORTS), key=_isort_key)
    body = "".join(f"    {n},\n" for n in exported)
    return f"from everyo.{module} import (\n{body})\n"


def _isort_key(name: str) -> tuple:
    # ruff's isort: CONSTANTS, then Classes, then functions
    return (0 if name.isupper() else 1 if name[:1].isupper() else 2, name)


def generated_init(source: str) -> str:
    """``everyo/__init__.py``'s source with the table's import statements rewritten."""
    lines = source.splitlines(keepends=True)
    for node in sorted(ast.parse(source).body, key=lambda n: -n.lineno):
        module = getattr(node, "module", None) or ""
        if isinstance(node, ast.ImportFrom) and module.removeprefix("everyo.") in (
                "functional", "conveniences", "tensor"):
            text = export_statement(module.removeprefix("everyo."))
            lines[node.lineno - 1:node.end_lineno] = [text]
    return "".join(lines)


def generated_tensor(source: str) -> str:
    """``everyo/tensor.py``'s source with the generated method block rewritten."""
    start, stop = source.index(BEGIN), source.index(END) + len(END)
    return source[:start] + method_block() + source[stop:]


def main() -> int:
    """Rewrite the generated parts of ``__init__.py`` and ``tensor.py``; 1 if they changed."""
    changed = 0
    for name, generate in (("__init__.py", generated_init), ("tensor.py", generated_tensor)):
        path = HERE / name
        old = path.read_text()
        new = generate(old)
        if new != old:
            temporary = path.with_name(f".{name}.{os.getpid()}.tmp")
            temporary.write_text(new)
            os.replace(temporary, path)  # (atomic: an editor or import never sees half a file)
            changed = 1
            print(f"rewrote {path}")
    return changed


if __name__ == "__main__":
    sys.exit(main())
