"""The seams between distributions: plugins use only the core's public modules and the public
modules of other plugins, and the core imports no plugin distribution (it names first-party
plugin modules only in its table)."""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

import everyo.kernels

ROOT = Path(__file__).resolve().parents[2]
PLUGIN_PACKAGES = ("everyo_layers", "everyo_amp", "everyo_onnx", "everyo_dist", "everyo_numba")
# The core's public modules: the package itself, the kernels and the interceptor API.
PUBLIC_CORE = {"everyo", "everyo.kernels", "everyo.dispatch", "everyo.errors", "everyo.validation",
               "everyo.atomic_files",
               "everyo.distributed", "everyo.distributed_tcp"}


# Other plugins' public modules: what one plugin may import from another (everything else in a
# plugin is reached through the registries, by registered name).
PUBLIC_PLUGIN_MODULES = {"everyo_layers.geometry"}


def imported_modules(path: Path) -> set[str]:
    found = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            found.update(alias.name for alias in node.names)
        elif isinstance(node, ast.ImportFrom) and node.module and node.level == 0:
            found.add(node.module)
    return found


# Known debt, listed so that it cannot grow unseen. The test fails when an entry is no longer
# needed, so this list only shrinks.
KNOWN_PRIVATE_IMPORTS: set[str] = set()


@pytest.mark.parametrize("package", PLUGIN_PACKAGES)
def test_plugins_import_only_public_core_modules(package):
    source = ROOT / package / "src" / package
    private = {f"{path.relative_to(ROOT)}: {module}"
               for path in source.rglob("*.py") for module in imported_modules(path)
               if module.split(".")[0] == "everyo" and module not in PUBLIC_CORE}
    known = {entry for entry in KNOWN_PRIVATE_IMPORTS if entry.startswith(f"{package}/")}
    assert private - known == set(), sorted(private - known)
    assert known - private == set(), f"no longer needed, remove: {sorted(known - private)}"


@pytest.mark.parametrize("package", PLUGIN_PACKAGES)
def test_plugins_import_only_public_modules_of_other_plugins(package):
    source = ROOT / package / "src" / package
    private = sorted(f"{path.relative_to(ROOT)}: {module}"
                     for path in source.rglob("*.py") for module in imported_modules(path)
                     if module.split(".")[0] in set(PLUGIN_PACKAGES) - {package}
                     and module not in PUBLIC_PLUGIN_MODULES)
    assert private == []


def test_every_public_plugin_module_lists_what_it_publishes():
    for name in sorted(PUBLIC_PLUGIN_MODULES):
        module = importlib.import_module(name)
        assert module.__all__ and module.__doc__, name
        for attribute in module.__all__:
            assert getattr(module, attribute).__doc__, f"{name}.{attribute} has no docstring"


def test_the_core_imports_no_plugin_distribution():
    core = ROOT / "everyo_core" / "src" / "everyo"
    imports = {f"{path.name}: {module}" for path in core.rglob("*.py")
               for module in imported_modules(path) if module.split(".")[0] in PLUGIN_PACKAGES}
    assert not imports, sorted(imports)


def test_the_kernel_module_publishes_what_it_lists():
    assert {"blas_matmul", "keep_where", "log_softmax_array", "stable_sigmoid"} <= set(
        everyo.kernels.__all__)
    for name in everyo.kernels.__all__:
        thing = getattr(everyo.kernels, name)
        assert not callable(thing) or thing.__doc__, f"everyo.kernels.{name} has no docstring"
