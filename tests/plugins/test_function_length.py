"""Functions fit on a screen: none in the distributions' source is longer than 60 lines."""

from __future__ import annotations

import ast
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = ("everyo_core", "everyo_layers", "everyo_amp", "everyo_onnx", "everyo_dist",
                 "everyo_numba")
LIMIT = 60

# Known debt in files other helpers own, listed so that it cannot grow unseen: (file, function).
# The test fails when an entry fits, so this list only shrinks.
KNOWN_LONG: set[tuple[str, str]] = set()


def function_lengths(source: str) -> list[tuple[str, int]]:
    """``(name, lines)`` of every function and method, from its ``def`` to its last line
    (docstring and comments included, decorators not)."""
    return [(node.name, node.end_lineno - node.lineno + 1) for node in ast.walk(ast.parse(source))
            if isinstance(node, (ast.FunctionDef, ast.AsyncFunctionDef))]


def test_the_length_counts_from_def_to_the_last_line():
    source = "@decorator\ndef f():\n    '''doc'''\n\n    # why\n    return 1\n"
    assert function_lengths(source) == [("f", 5)]


def test_no_function_is_longer_than_a_screen():
    long = set()
    for dist in DISTRIBUTIONS:
        for path in (ROOT / dist / "src").rglob("*.py"):
            relative = path.relative_to(ROOT).as_posix()
            long |= {(relative, name) for name, lines in function_lengths(path.read_text())
                     if lines > LIMIT}
    assert not long - KNOWN_LONG, f"longer than {LIMIT} lines: {sorted(long - KNOWN_LONG)}"
    assert not KNOWN_LONG - long, f"fits now, remove from KNOWN_LONG: {sorted(KNOWN_LONG - long)}"
