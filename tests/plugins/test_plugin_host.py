"""The plugin host against real installed distributions: tiny packages are built and installed
by pip into a directory of their own, and a fresh interpreter imports everyo with it on its path.

Every package below is installed once, together; each test turns off the ones it is not about
with ``EVERYO_DISABLE_PLUGINS``, which is itself under test.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import everyo as eo
from everyo.first_party import FIRST_PARTY
from everyo.install_hints import missing
from everyo.plugins import PluginHost, registrations

# entry-point name -> (distribution, module source). "aardvark" sorts before "everyo_layers":
# by name alone it would load first.
PACKAGES = {
    "aardvark": ("everyo-aardvark", '''
        import everyo as eo
        from everyo import hookimpl

        class Linear(eo.Module):
            """Not the Linear users expect."""

        class Aardvark(eo.Module):
            pass

        @hookimpl
        def everyo_register_layers(register):
            register("Aardvark", Aardvark)
            register("Linear", Linear)
    '''),
    "faster_linear": ("everyo-faster-linear", '''
        import everyo as eo
        from everyo import hookimpl

        class FasterLinear(eo.Module):
            pass

        @hookimpl
        def everyo_register_layers(register):
            register("Linear", FasterLinear, override=True)
    '''),
    "misspelled": ("everyo-misspelled", '''
        import everyo as eo
        from everyo import hookimpl

        class Misspelled(eo.Module):
            pass

        @hookimpl
        def everyo_register_layer(register):
            register("Misspelled", Misspelled)
    '''),
    "undecorated": ("everyo-undecorated", '''
        import everyo as eo

        class Undecorated(eo.Module):
            pass

        def everyo_register_layers(register):
            register("Undecorated", Undecorated)
    '''),
    "broken": ("everyo-broken-dep", '''
        import frobnicate_not_installed
    '''),
    "shadow": ("everyo-shadow", '''
        from everyo import hookimpl

        def attention_weights(query, key):
            return "not the op"

        @hookimpl
        def everyo_register_layers(register):
            register("attention_weights", attention_weights)
    '''),
}


def build(root: Path, entry_point: str, dist: str, source: str) -> Path:
    module = dist.replace("-", "_")
    package = root / dist
    (package / "src" / module).mkdir(parents=True)
    (package / "src" / module / "__init__.py").write_text(textwrap.dedent(source))
    (package / "pyproject.toml").write_text(textwrap.dedent(f"""
        [build-system]
        requires = ["setuptools>=68"]
        build-backend = "setuptools.build_meta"

        [project]
        name = "{dist}"
        version = "0.3.0"

        [project.entry-points.everyo]
        {entry_point} = "{module}"

        [tool.setuptools.packages.find]
        where = ["src"]
    """))
    return package


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    root = tmp_path_factory.mktemp("plugin_host")
    sources = [str(build(root, ep, dist, source)) for ep, (dist, source) in PACKAGES.items()]
    target = root / "site"
    # NOTE: as tests/plugins/test_plugins_doc.py: no network, this environment's setuptools.
    result = subprocess.run(
        [sys.executable, "-m", "pip", "install", "--quiet", "--no-deps", "--no-index",
         "--no-build-isolation", "--disable-pip-version-check", "--target", str(target),
         *sources], capture_output=True, text=True, timeout=600)
    assert result.returncode == 0, result.stderr
    return target


def run(site: Path, code: str, only=(), **env) -> subprocess.CompletedProcess:
    """``code`` in a fresh interpreter that sees the installed packages, all but ``only`` off."""
    others = [name for name in PACKAGES if name not in only]
    others += env.pop("EVERYO_DISABLE_PLUGINS", "").split(",")
    environ = {**os.environ, "PYTHONPATH": str(site), "OMP_NUM_THREADS": "1",
               "EVERYO_DISABLE_PLUGINS": ",".join(others), **env}
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environ, timeout=120)


def plugins_listing(site: Path, only=(), **env) -> subprocess.CompletedProcess:
    return run(site, "from everyo.cli import main; raise SystemExit(main(['plugins']))",
               only, **env)


def test_a_third_party_collision_refuses_only_the_third_party_plugin(site):
    result = run(site, """
        import everyo as eo
        import everyo_layers.linear
        print(eo.Linear is everyo_layers.linear.Linear, eo.Conv2D.__name__)
        print(hasattr(eo, "Aardvark"))
    """, only=["aardvark"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["True", "Conv2D", "False"]
    # the warning names both plugins and both distributions
    assert "'aardvark' from distribution 'everyo-aardvark' was not loaded" in result.stderr
    assert "layer 'Linear' is registered twice: by plugin 'everyo_layers' and again by plugin " \
           "'aardvark' (distributions everyo-layers and everyo-aardvark)" in result.stderr
    listing = plugins_listing(site, only=["aardvark"])
    assert listing.returncode == 1
    assert "everyo_layers  [everyo-layers" in listing.stdout
    assert "aardvark  [everyo-aardvark]  FAILED TO LOAD: everyo.errors.PluginError" in listing.stdout


def test_an_explicit_override_of_a_first_party_name_is_honoured(site):
    result = run(site, """
        import everyo as eo
        print(type(eo.Linear()).__name__, eo.registry("layers").owners["Linear"], eo.Conv2D.__name__)
    """, only=["faster_linear"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["FasterLinear", "faster_linear", "Conv2D"]


@pytest.mark.parametrize("plugin, message", [
    ("misspelled", "unknown hook 'everyo_register_layer'"),
    ("undecorated", "defines 'everyo_register_layers' without @everyo.hookimpl"),
])
def test_a_hook_that_would_never_be_called_is_an_error(site, plugin, message):
    result = run(site, "import everyo as eo; print(eo.Linear.__name__)", only=[plugin])
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "Linear"
    assert message in result.stderr and f"'{plugin}' from distribution" in result.stderr
    if plugin == "misspelled":
        assert "did you mean 'everyo_register_layers'?" in result.stderr


def test_a_plugin_that_fails_to_import_is_reported_with_its_distribution(site):
    result = run(site, "import everyo as eo; print(eo.Conv2D.__name__)", only=["broken"])
    assert result.returncode == 0 and result.stdout.strip() == "Conv2D", result.stderr
    assert "'broken' from distribution 'everyo-broken-dep' was not loaded: " \
           "ModuleNotFoundError: No module named 'frobnicate_not_installed'" in result.stderr
    listing = plugins_listing(site, only=["broken"])
    assert listing.returncode == 1 and "broken  [everyo-broken-dep]  FAILED TO LOAD" in listing.stdout


def test_a_layer_function_may_not_take_the_name_of_another_plugins_op(site):
    result = run(site, """
        import everyo as eo
        print(eo.attention_weights.__name__, "attention_weights" in eo.registry("layers"))
    """, only=["shadow"])
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["attention_weights", "False"]  # eo.<op> is the op's function
    assert "registers layer 'attention_weights', but 'attention_weights' is already the op of " \
           "plugin 'everyo_layers'" in result.stderr


def test_one_named_plugin_can_be_disabled(site):
    result = run(site, """
        import everyo as eo
        print(eo.Aardvark.__name__)
        try:
            eo.Conv2D
        except AttributeError as exc:
            print(exc)
    """, only=["aardvark"], EVERYO_DISABLE_PLUGINS="everyo_layers")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0] == "Aardvark"  # with everyo-layers off, its Linear no longer collides
    assert lines[1] == ("everyo.Conv2D is provided by everyo-layers, which is installed but not "
                        "loaded: its plugin is disabled by EVERYO_DISABLE_PLUGINS")
    listing = plugins_listing(site, only=["aardvark"], EVERYO_DISABLE_PLUGINS="everyo_layers")
    assert "everyo_layers  [everyo-layers]  disabled by EVERYO_DISABLE_PLUGINS" in listing.stdout
    assert listing.returncode == 0


@pytest.mark.parametrize("value, enabled", [
    ("1", False), ("true", False), ("TRUE", False), ("Yes", False), ("on", False),
    (" On ", False), ("0", True), ("", True), ("no", True), ("off", True),
])
def test_the_autoload_switch_accepts_the_usual_spellings(monkeypatch, value, enabled):
    monkeypatch.setenv("EVERYO_DISABLE_PLUGIN_AUTOLOAD", value)
    assert PluginHost.autoload_enabled() is enabled


def test_autoload_off_spelled_on_loads_no_entry_point(site):
    result = run(site, "import everyo as eo; print(eo.registry('layers').items == {})",
                 only=["aardvark"], EVERYO_DISABLE_PLUGIN_AUTOLOAD="On")
    assert result.returncode == 0 and result.stdout.strip() == "True", result.stderr


def test_a_disabled_name_that_is_no_entry_point_is_reported():
    """A distribution name (everyo-onnx) or a typo would otherwise silently disable nothing."""
    program = "import everyo as eo; print(eo.registry('api').owners['export_onnx'])"
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "EVERYO_DISABLE_PLUGINS": "everyo-onnx"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "everyo_onnx"
    assert "EVERYO_DISABLE_PLUGINS names no installed plugin: everyo-onnx; the entry-point " \
           "names are everyo_layers, everyo_amp, everyo_onnx, everyo_dist" in result.stderr


def test_import_everyo_with_autoload_off_imports_no_plugin_module():
    """Building the package must not compute install hints (which import every first-party
    plugin, and would be cached while no op is registered yet)."""
    program = ("import sys, everyo\n"
               "print(sorted(m for m in sys.modules if m.split('.')[0] in "
               "('everyo_layers', 'everyo_amp', 'everyo_onnx', 'everyo_dist')))")
    result = subprocess.run([sys.executable, "-c", program], capture_output=True, text=True,
                            timeout=120, env={**os.environ, "EVERYO_DISABLE_PLUGIN_AUTOLOAD": "1"})
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[]"


# -- install hints agree with what the first-party plugins register ---------------------------

def public_names(plugin_module: str) -> list[str]:
    import importlib

    found = registrations(importlib.import_module(plugin_module))
    return [name for kind in ("layers", "api", "modules") for name in found.get(kind, ())]


def test_every_first_party_name_has_a_hint_naming_its_distribution_when_not_loaded():
    program = """
        import everyo as eo
        for name in NAMES:
            try:
                getattr(eo, name)
                print(name, "FOUND")
            except AttributeError as exc:
                print(name, exc)
    """
    for dist, party in FIRST_PARTY.items():
        names = public_names(party.plugin)
        assert names, dist
        result = subprocess.run(
            [sys.executable, "-c", f"NAMES = {names!r}\n" + textwrap.dedent(program)],
            capture_output=True, text=True, timeout=120,
            env={**os.environ, "EVERYO_DISABLE_PLUGIN_AUTOLOAD": "1"})
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        assert len(lines) == len(names)
        for name, line in zip(names, lines):
            assert line.startswith(f"{name} everyo.{name} is provided by {dist}, which is "
                                   f"installed but not loaded: plugin autoloading is disabled"), line
            assert f"everyo.register_plugin({party.plugin})" in line


@pytest.mark.parametrize("dist", list(FIRST_PARTY))
def test_a_distribution_that_is_not_installed_is_named_with_its_install_command(dist):
    party = FIRST_PARTY[dist]
    names = public_names(party.plugin)
    package = party.plugin.partition(".")[0]
    program = f"""
        import sys, warnings
        sys.modules[{package!r}] = None  # as if {dist} were not installed
        warnings.simplefilter("ignore")
        import everyo as eo
        for name in {names!r}:
            try:
                getattr(eo, name)
                print("FOUND", name)
            except AttributeError as exc:
                print(exc)
    """
    result = subprocess.run([sys.executable, "-c", textwrap.dedent(program)],
                            capture_output=True, text=True, timeout=120)
    assert result.returncode == 0, result.stderr
    for name, line in zip(names, result.stdout.splitlines(), strict=True):
        assert line == (f"everyo.{name} is not provided by any installed plugin; it may come "
                        f"from {dist}, which is not installed: {party.install}")


def test_the_onnx_hint_names_the_runtime_extra():
    assert "run_onnx" in public_names(FIRST_PARTY["everyo-onnx"].plugin)
    assert "pip install 'everyo-onnx[runtime]'" in FIRST_PARTY["everyo-onnx"].install


def test_hints_never_fire_for_names_that_exist():
    assert missing("Linear") is None and eo.Linear.__name__ == "Linear"
