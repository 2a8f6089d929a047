"""docs/plugins.md is enough to publish a layer plugin: the example package's files are taken
from the page as written, built and installed by pip into a temporary directory, and a fresh
interpreter finds the layer after a plain ``import everyo``."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap
from pathlib import Path

import numpy as np
import pytest

ROOT = Path(__file__).resolve().parents[2]
DOC = ROOT / "docs" / "plugins.md"
PACKAGE = "everyo-swish"
# A fenced block whose first line is a comment naming a file of the example package.
FILE_BLOCK = re.compile(r"^```(?:python|toml)\n# (" + PACKAGE + r"/\S+)\n(.*?)^```", re.S | re.M)


def package_files() -> dict[str, str]:
    """The example package's files, by path relative to the package root, as the doc shows them."""
    files = {}
    for path, body in FILE_BLOCK.findall(DOC.read_text()):
        relative = path.split("/", 1)[1]
        assert relative not in files, f"docs/plugins.md shows {path} twice"
        files[relative] = f"# {path}\n{body}"
    return files


def run(args, **kwargs) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=240, **kwargs)


@pytest.fixture(scope="module")
def installed_plugin(tmp_path_factory):
    """The doc's package, installed with pip into a directory of its own (``--target``)."""
    root = tmp_path_factory.mktemp("from_the_doc")
    source = root / PACKAGE
    for relative, text in package_files().items():
        (source / relative).parent.mkdir(parents=True, exist_ok=True)
        (source / relative).write_text(text)
    site = root / "site"
    # NOTE: --no-build-isolation uses the setuptools of this environment: the test must not
    # need the network, and --no-deps keeps pip from reinstalling everyo-core into the target.
    result = run([sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
                  "--no-build-isolation", "--disable-pip-version-check", "--target", str(site),
                  str(source)])
    assert result.returncode == 0, f"pip could not install the doc's package:\n{result.stderr}"
    return site


def python_with(site: Path, code: str, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, "PYTHONPATH": str(site), **env}
    return run([sys.executable, "-c", textwrap.dedent(code)], env=environ)


def test_the_doc_shows_every_file_of_the_package_it_describes():
    assert set(package_files()) == {"pyproject.toml", "src/everyo_swish/__init__.py"}
    pyproject = package_files()["pyproject.toml"]
    assert "[project.entry-points.everyo]" in pyproject
    assert 'everyo_swish = "everyo_swish"' in pyproject


def test_the_installed_wheel_carries_the_entry_point(installed_plugin):
    entry_points = list(installed_plugin.glob("everyo_swish-0.1.0.dist-info/entry_points.txt"))
    assert entry_points, sorted(p.name for p in installed_plugin.iterdir())
    assert "[everyo]" in entry_points[0].read_text()


def test_a_fresh_interpreter_finds_the_layer_after_import_everyo(installed_plugin):
    result = python_with(installed_plugin, """
        import numpy as np
        import everyo as eo

        x = eo.tensor([-2.0, 0.0, 3.0], requires_grad=True)
        y = eo.Swish(beta=2.0)(x)
        y.sum().backward()
        print(eo.Swish.__module__)
        print(eo.registry("layers").owners["Swish"])
        print(y.data.tolist())
        print(x.grad.tolist())
    """)
    assert result.returncode == 0, result.stderr
    module, owner, values, grads = result.stdout.strip().splitlines()
    assert module == "everyo_swish" and owner == "everyo_swish"
    x = np.array([-2.0, 0.0, 3.0])
    sigmoid = 1 / (1 + np.exp(-2.0 * x))
    np.testing.assert_allclose(json.loads(values), x * sigmoid, rtol=1e-6)
    np.testing.assert_allclose(json.loads(grads), sigmoid + 2.0 * x * sigmoid * (1 - sigmoid),
                               rtol=1e-5)


def test_everyo_plugins_lists_it_as_the_doc_says(installed_plugin):
    result = python_with(installed_plugin,
                         "from everyo.cli import main; raise SystemExit(main(['plugins']))")
    assert result.returncode == 0, result.stdout + result.stderr
    listing = result.stdout.splitlines()
    header = listing.index("everyo_swish  [everyo-swish 0.1.0]")
    assert listing[header + 1] == "    layers: Swish"
    # the doc quotes exactly these two lines
    assert "everyo_swish  [everyo-swish 0.1.0]\n    layers: Swish\n" in DOC.read_text()


def test_without_autoload_the_layer_is_absent_until_registered(installed_plugin):
    result = python_with(installed_plugin, """
        import everyo as eo
        print(hasattr(eo, "Swish"))
        import everyo_swish
        eo.register_plugin(everyo_swish)
        print(eo.Swish()(eo.tensor([0.0])).data.tolist())
    """, EVERYO_DISABLE_PLUGIN_AUTOLOAD="1")
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "[0.0]"]
