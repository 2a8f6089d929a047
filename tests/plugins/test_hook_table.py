"""The hooks are described once, in ``everyo.hookspecs.HOOKS``: the pluggy specs, the host's
registries, ``everyo plugins`` and the table in docs/plugins.md all follow it."""

from __future__ import annotations

import io
from pathlib import Path

from everyo import hookspecs
from everyo.cli import _plugins
from everyo.plugins import host

DOCS = Path(__file__).resolve().parents[2] / "docs"


def test_every_hook_kind_has_a_spec_and_a_registry():
    specs = {name for name in dir(hookspecs) if name.startswith("everyo_register_")}
    assert specs == {h.hook for h in hookspecs.HOOKS}
    assert set(host.registries) == {h.kind for h in hookspecs.HOOKS}


def test_the_plugins_page_shows_the_generated_table():
    assert hookspecs.markdown_table() in (DOCS / "plugins.md").read_text()


def test_no_other_page_keeps_a_hook_table_of_its_own():
    for page in DOCS.glob("*.md"):
        if page.name != "plugins.md":
            rows = [line for line in page.read_text().splitlines()
                    if line.startswith("| `everyo_register_")]
            assert not rows, f"{page.name} repeats the hook table; link to plugins.md instead"


def test_everyo_plugins_labels_every_kind_from_the_table():
    out = io.StringIO()
    _plugins(out)
    text = out.getvalue()
    for plural in ("layers", "ops", "api", "modules", "ONNX converters", "backends",
                   "autocast policies"):
        assert f"    {plural}: " in text
