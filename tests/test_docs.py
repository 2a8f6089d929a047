"""The docs cannot rot: every ```python block in README.md and docs/*.md runs, and every
docstring example (>>>) in the five distributions passes doctest."""

from __future__ import annotations

import doctest
import importlib
import os
import pkgutil
import re
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]
DOC_FILES = [ROOT / "README.md", *sorted((ROOT / "docs").glob("*.md"))]
PYTHON_BLOCK = re.compile(r"^```python\n(.*?)^```", re.S | re.M)
PACKAGES = ("everyo", "everyo_layers", "everyo_amp", "everyo_onnx", "everyo_dist")


def python_blocks(path: Path) -> list[str]:
    return PYTHON_BLOCK.findall(path.read_text())


@pytest.mark.parametrize("path", [p for p in DOC_FILES if python_blocks(p)], ids=lambda p: p.name)
def test_python_blocks_run(path, tmp_path):
    blocks = python_blocks(path)
    # NOTE: one fresh interpreter per file; its blocks share a namespace, in order, as a reader
    # pasting them one after another would.
    program = "\n".join(f"# --- block {i}\n{block}" for i, block in enumerate(blocks))
    (tmp_path / "doc_program.py").write_text(program)
    env = {**os.environ, "OMP_NUM_THREADS": "1", "MPLBACKEND": "Agg"}
    result = subprocess.run([sys.executable, "doc_program.py"], cwd=tmp_path, env=env,
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, f"{path.name}:\n{result.stderr[-3000:]}"


def _modules(package: str) -> list[str]:
    root = importlib.import_module(package)
    names = [package]
    for info in pkgutil.walk_packages(root.__path__, prefix=f"{package}."):
        if not info.name.endswith("__main__"):
            names.append(info.name)
    return names


@pytest.mark.parametrize("package", PACKAGES)
def test_docstring_examples(package):
    finder = doctest.DocTestFinder(exclude_empty=True)
    failures = []
    for name in _modules(package):
        module = importlib.import_module(name)
        runner = doctest.DocTestRunner(optionflags=doctest.ELLIPSIS | doctest.NORMALIZE_WHITESPACE)
        for test in finder.find(module, name):
            if test.examples and test.name.startswith(name):
                runner.run(test, out=failures.append)
    assert not failures, "".join(failures)
