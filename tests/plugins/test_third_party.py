"""Plugins found through entry points, in fresh interpreters: a third-party layer and op, a
broken plugin, a conflicting plugin, autoload switched off, a missing first-party distribution."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

import everyo as eo

PLUGIN_SOURCE = '''
import everyo as eo
from everyo import hookimpl


class Triple(eo.Op):
    __slots__ = ()

    def forward(self, x):
        return x * 3

    def backward(self, grad):
        return (grad * 3,)


class Double(eo.Module):
    def forward(self, x):
        return x * 2


@hookimpl
def everyo_register_layers(register):
    register("Double", Double)


@hookimpl
def everyo_register_ops(register):
    register("triple", Triple)
'''


def make_distribution(root: Path, dist: str, module: str, source: str, version="1.2.3") -> None:
    """A minimal installed distribution: a module plus a dist-info with an entry point."""
    (root / f"{module}.py").write_text(textwrap.dedent(source))
    info = root / f"{dist.replace('-', '_')}-{version}.dist-info"
    info.mkdir()
    (info / "METADATA").write_text(f"Metadata-Version: 2.1\nName: {dist}\nVersion: {version}\n")
    (info / "entry_points.txt").write_text(f"[everyo]\n{module} = {module}\n")


def run_python(code: str, path: Path | None = None, **env) -> subprocess.CompletedProcess:
    environ = {**os.environ, **env}
    if path is not None:
        environ["PYTHONPATH"] = str(path) + os.pathsep + environ.get("PYTHONPATH", "")
    return subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True,
                          text=True, env=environ, timeout=60)


@pytest.fixture
def third_party(tmp_path):
    make_distribution(tmp_path, "everyo-double", "everyo_double", PLUGIN_SOURCE)
    return tmp_path


def test_a_fresh_interpreter_finds_the_third_party_layer_and_op(third_party):
    result = run_python("""
        import everyo as eo
        x = eo.tensor([1.0, 2.0], requires_grad=True)
        y = eo.Double()(eo.triple(x))
        y.sum().backward()
        print(y.data.tolist(), x.grad.tolist(), eo.registry("layers").owners["Double"])
    """, third_party)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split("\n")[0] == "[6.0, 12.0] [6.0, 6.0] everyo_double"


def test_cli_lists_every_plugin_with_distribution_and_version(third_party):
    result = run_python("from everyo.cli import main; raise SystemExit(main(['plugins']))",
                        third_party)
    assert result.returncode == 0, result.stderr
    out = result.stdout
    assert "everyo_double  [everyo-double 1.2.3]" in out
    assert "layers: Double" in out and "ops: triple" in out
    for first_party in ("everyo-core", "everyo-layers", "everyo-amp", "everyo-onnx", "everyo-dist"):
        assert f"[{first_party} {eo.__version__}]" in out
    module_form = subprocess.run([sys.executable, "-m", "everyo", "plugins"], capture_output=True,
                                 text=True, timeout=60)
    assert module_form.returncode == 0 and f"[everyo-core {eo.__version__}]" in module_form.stdout


def test_console_script_is_installed():
    script = Path(sys.executable).with_name("everyo")
    result = subprocess.run([str(script), "plugins"], capture_output=True, text=True, timeout=60)
    assert result.returncode == 0 and "ops: add" in result.stdout


def test_the_listing_stops_quietly_when_its_reader_goes_away():
    # `everyo plugins | head -2`, made deterministic: the reader has left before the first write
    read_end, write_end = os.pipe()
    os.close(read_end)
    try:
        result = subprocess.run([sys.executable, "-m", "everyo", "plugins"], stdout=write_end,
                                stderr=subprocess.PIPE, text=True, timeout=60)
    finally:
        os.close(write_end)
    assert result.stderr == ""
    assert result.returncode == 141  # 128 + SIGPIPE, as a shell reports a tool stopped by it


def test_a_broken_plugin_is_reported_and_does_not_break_import(tmp_path):
    make_distribution(tmp_path, "everyo-broken", "everyo_broken",
                      "raise RuntimeError('missing dependency frobnicate')")
    result = run_python("import everyo as eo; print(eo.tensor([1.0]).dtype)", tmp_path)
    assert result.returncode == 0 and result.stdout.strip() == "float32"
    assert "everyo_broken" in result.stderr and "everyo-broken" in result.stderr
    assert "missing dependency frobnicate" in result.stderr
    listing = run_python("from everyo.cli import main; raise SystemExit(main(['plugins']))",
                         tmp_path)
    assert listing.returncode == 1
    assert "everyo_broken  [everyo-broken]  FAILED TO LOAD: RuntimeError: missing dependency " \
           "frobnicate" in listing.stdout


def test_a_plugin_claiming_a_taken_name_is_refused_naming_both(tmp_path):
    make_distribution(tmp_path, "everyo-clash", "everyo_clash", '''
        import everyo as eo
        from everyo import hookimpl

        class NotAdd(eo.Op):
            __slots__ = ()

            def forward(self, a, b):
                return a - b

        @hookimpl
        def everyo_register_ops(register):
            register("add", NotAdd)
    ''')
    result = run_python("""
        import everyo as eo
        print((eo.tensor([1.0]) + eo.tensor([2.0])).data.tolist())
    """, tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout.strip() == "[3.0]"  # the core's add survived
    assert "op 'add' is registered twice: by plugin 'everyo' and again by plugin 'everyo_clash'" \
        in result.stderr


def test_autoload_can_be_disabled_and_plugins_registered_explicitly(third_party):
    result = run_python("""
        import everyo as eo
        try:
            eo.Double
        except AttributeError as exc:
            print("no Double:", exc)
        try:
            eo.Linear
        except AttributeError as exc:
            print("no Linear:", exc)
        import everyo_double
        eo.register_plugin(everyo_double)
        print(eo.Double()(eo.tensor([1.0])).data.tolist())
        print(eo.triple(eo.tensor([1.0])).data.tolist())
    """, third_party, EVERYO_DISABLE_PLUGIN_AUTOLOAD="1")
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].startswith("no Double: module 'everyo' has no attribute 'Double'")
    assert "EVERYO_DISABLE_PLUGIN_AUTOLOAD" in lines[1] and "everyo-layers" in lines[1]
    assert lines[2:] == ["[2.0]", "[3.0]"]


def test_a_missing_first_party_distribution_says_what_to_install():
    result = run_python("""
        import sys
        sys.modules["everyo_amp"] = None  # as if everyo-amp were not installed
        sys.modules["everyo_dist"] = None
        import warnings
        warnings.simplefilter("ignore")
        import everyo as eo
        for name in ("autocast", "GradScaler"):
            try:
                getattr(eo, name)
            except AttributeError as exc:
                print(exc)
        print(hasattr(eo, "autocast"))
        try:
            from everyo.distributed import spawn
        except ImportError as exc:
            print(exc)
    """)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    # Without everyo-amp the core cannot know which names it provides (the core keeps no list of
    # them), so the hint names every first-party distribution that is not installed.
    assert lines[0] == ("everyo.autocast is not provided by any installed plugin; it may come from "
                        "one of the first-party distributions that are not installed: everyo-amp "
                        "(pip install everyo-amp), everyo-dist (pip install everyo-dist)")
    assert "GradScaler" in lines[1] and "pip install everyo-amp" in lines[1]
    assert lines[2] == "False"
    assert "pip install everyo-dist" in lines[3]


def test_eo_distributed_is_reachable_as_an_attribute():
    result = run_python("""
        import everyo as eo
        print(eo.distributed.shard_indices(10, 0, 2).tolist())
        print(eo.distributed_tcp.TCPRendezvousServer.__name__)
    """)
    assert result.returncode == 0, result.stderr
    assert result.stdout.splitlines() == ["[0, 1, 2, 3, 4]", "TCPRendezvousServer"]


def test_a_plugin_package_imported_before_everyo_is_told_how_to_fix_it(tmp_path):
    # A plugin package whose __init__.py lacks the `import everyo` line: importing one of its
    # modules first makes `import everyo` load the plugin while that module is half-imported.
    package = tmp_path / "everyo_twopart"
    package.mkdir()
    (package / "__init__.py").write_text('"""A plugin without the guard."""\n')
    (package / "layer.py").write_text(textwrap.dedent("""
        import everyo as eo


        class Twice(eo.Module):
            def forward(self, x):
                return x * 2
    """))
    (package / "plugin.py").write_text(textwrap.dedent("""
        from everyo import hookimpl
        from everyo_twopart.layer import Twice


        @hookimpl
        def everyo_register_layers(register):
            register("Twice", Twice)
    """))
    info = tmp_path / "everyo_twopart-1.0.dist-info"
    info.mkdir()
    (info / "METADATA").write_text("Metadata-Version: 2.1\nName: everyo-twopart\nVersion: 1.0\n")
    (info / "entry_points.txt").write_text("[everyo]\neveryo_twopart = everyo_twopart.plugin\n")
    result = run_python("import everyo_twopart.layer", tmp_path)
    assert result.returncode == 0, result.stderr
    assert "'everyo_twopart' from distribution 'everyo-twopart' was not loaded" in result.stderr
    assert ("everyo_twopart.layer was still being imported when `import everyo` loaded the "
            "plugins: make `import everyo` the first statement of everyo_twopart/__init__.py"
            in " ".join(result.stderr.split()))
