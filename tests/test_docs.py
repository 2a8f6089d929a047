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


SHELL_BLOCK = re.compile(r"^```bash\n(.*?)^```", re.S | re.M)
SCRIPTS = {"everyo", "everyo-run", "mpiexec"}


def shell_commands() -> list[tuple[str, str]]:
    commands = []
    for path in DOC_FILES:
        for block in SHELL_BLOCK.findall(path.read_text()):
            for line in block.splitlines():
                line = line.split("#", 1)[0].strip().rstrip("\\").strip()
                if line:
                    commands.append((path.name, line))
    return commands


@pytest.mark.parametrize("doc,command", shell_commands(), ids=lambda v: v[:40])
def test_shell_commands_name_things_that_exist(doc, command):
    """Shell blocks are not run (they install packages or need two machines; the tests that
    exercise them are the example, launcher and network-namespace tests), but every script,
    make target and console script they name must exist, so they cannot rot silently."""
    words = [w for w in command.split() if "=" not in w or w.startswith("-")]
    makefile = (ROOT / "Makefile").read_text()
    bin_dir = Path(sys.executable).parent
    for i, word in enumerate(words):
        if word.endswith(".py") and "/" in word:
            assert (ROOT / word).exists(), f"{doc}: `{command}` names a missing {word}"
        if word == "make" and i + 1 < len(words):
            assert re.search(rf"^{re.escape(words[i + 1])}:", makefile, re.M), \
                f"{doc}: `{command}` names a missing make target"
    if words and words[0] in SCRIPTS:
        assert (bin_dir / words[0]).exists(), f"{doc}: `{command}` needs {words[0]} installed"
