"""The public op surface comes from one table (everyo/op_surface.py): the ``eo.<name>``
functions, everyo/__init__.py's imports of them and the Tensor methods."""

from __future__ import annotations

import ast
import importlib
import inspect
from pathlib import Path

import everyo as eo
from everyo import conveniences, functional, op_surface
from everyo.op_surface import FUNCTION, METHOD, SURFACE

tensor = importlib.import_module("everyo.tensor")  # (eo.tensor is the function)

SOURCE = Path(op_surface.__file__).resolve().parent
MODULES = {"functional": functional, "conveniences": conveniences, "tensor": tensor}
HINT = "run `python everyo_core/src/everyo/op_surface.py` to regenerate it"


def test_the_generated_imports_and_methods_are_the_tables():
    init, body = (SOURCE / "__init__.py").read_text(), (SOURCE / "tensor.py").read_text()
    assert op_surface.generated_init(init) == init, f"everyo/__init__.py: {HINT}"
    assert op_surface.generated_tensor(body) == body, f"everyo/tensor.py: {HINT}"


def test_every_entry_is_the_one_function_it_names():
    for name, (module, forms) in SURFACE.items():
        function = getattr(MODULES[module], name)
        assert (getattr(eo, name) is function) == (FUNCTION in forms), name
        assert (vars(eo.Tensor).get(name) is function) == (METHOD in forms), name


def test_every_public_function_of_the_op_modules_is_in_the_table():
    for module_name in ("functional", "conveniences"):
        module = MODULES[module_name]
        public = {name for name, value in vars(module).items()
                  if inspect.isfunction(value) and not name.startswith("_")
                  and value.__module__ == module.__name__}
        assert public == set(op_surface.names(module_name, FUNCTION)), module_name


def test_no_tensor_method_is_silently_overwritten():
    """A name bound twice in the class body (as ``argmax`` was, by a later ``setattr``) would
    make type checkers see the wrong one."""
    tree = ast.parse((SOURCE / "tensor.py").read_text())
    body = next(n for n in tree.body if isinstance(n, ast.ClassDef) and n.name == "Tensor").body
    bound = [n.name for n in body if isinstance(n, ast.FunctionDef)]
    bound += [t.id for n in body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name)]
    assert sorted(n for n in set(bound) if bound.count(n) > 1) == []


def _tensor_patches(source: str) -> list[int]:
    """Lines that set an attribute of the class ``Tensor`` from outside its body:
    ``setattr(Tensor, ...)``, ``Tensor.x = ...`` (``eo.Tensor`` too)."""
    def is_tensor(node) -> bool:
        return (isinstance(node, ast.Name) and node.id == "Tensor"
                or isinstance(node, ast.Attribute) and node.attr == "Tensor")

    lines = []
    for node in ast.walk(ast.parse(source)):
        if (isinstance(node, ast.Call) and isinstance(node.func, ast.Name)
                and node.func.id in ("setattr", "delattr") and node.args
                and is_tensor(node.args[0])):
            lines.append(node.lineno)
        targets = (node.targets if isinstance(node, ast.Assign) else [node.target]
                   if isinstance(node, (ast.AugAssign, ast.AnnAssign)) else
                   node.targets if isinstance(node, ast.Delete) else [])
        lines += [t.lineno for t in targets
                  if isinstance(t, ast.Attribute) and is_tensor(t.value)]
    return sorted(lines)


def test_the_patch_finder_sees_every_form():
    source = ("setattr(Tensor, 'f', g)\nTensor.shape = p\neo.Tensor.__eq__ = q\n"
              "delattr(everyo.Tensor, 'f')\nx.Tensor = 1\nsetattr(t, 'grad', None)\n")
    assert _tensor_patches(source) == [1, 2, 3, 4]


def test_no_module_of_any_distribution_attaches_to_tensor():
    """Only tensor.py defines ``Tensor``'s attributes: no module attaches methods with
    ``setattr`` and no plugin swaps ``Tensor.shape`` or an operator (the ONNX tracer answers
    ``shape`` through the core's ``shape_hook``)."""
    root = SOURCE.parents[2]
    offenders = [f"{path.relative_to(root)}:{line}"
                 for path in root.glob("everyo_*/src/**/*.py")
                 for line in _tensor_patches(path.read_text())]
    assert offenders == []


def test_a_new_row_reaches_the_exports_and_the_methods(monkeypatch):
    monkeypatch.setitem(SURFACE, "hypot", ("functional", (FUNCTION, METHOD)))
    monkeypatch.setitem(SURFACE, "outer", ("conveniences", (FUNCTION,)))
    init = op_surface.generated_init((SOURCE / "__init__.py").read_text())
    body = op_surface.generated_tensor((SOURCE / "tensor.py").read_text())
    assert "    hypot,\n" in init and "    outer,\n" in init
    assert "    hypot = functional.hypot\n" in body and "outer =" not in body
    compile(init, "__init__.py", "exec")
    compile(body, "tensor.py", "exec")
