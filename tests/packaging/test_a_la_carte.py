"""The seven distributions as a user gets them: wheels built from this tree, installed à la carte
into fresh virtual environments, each checked for imports, install hints, ``everyo plugins``
and a smoke use of what it holds.

The wheels are built once (``pip wheel --no-build-isolation``, so no network is needed for
building); third-party dependencies come from the package index (or pip's cache), as they do
for a user.
"""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
import venv
from pathlib import Path

import pytest

import everyo as eo

ROOT = Path(__file__).resolve().parents[2]
DISTRIBUTIONS = {"everyo-core": "everyo_core", "everyo-layers": "everyo_layers",
                 "everyo-amp": "everyo_amp", "everyo-onnx": "everyo_onnx",
                 "everyo-dist": "everyo_dist", "everyo-numba": "everyo_numba", "everyo": "."}
FIRST_PARTY = ("everyo-core", "everyo-layers", "everyo-amp", "everyo-onnx", "everyo-dist",
               "everyo-numba")
VERSION = (ROOT / "VERSION").read_text().strip()

pytestmark = pytest.mark.slow


def run(args, **kwargs) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1",
           "MKL_NUM_THREADS": "1", "PIP_DISABLE_PIP_VERSION_CHECK": "1"}
    env.pop("PYTHONPATH", None)
    env.pop("EVERYO_DISABLE_PLUGIN_AUTOLOAD", None)
    env.pop("EVERYO_KERNELS", None)  # (a fresh install: the default kernel provider)
    return subprocess.run(args, capture_output=True, text=True, timeout=600, env=env, **kwargs)


@pytest.fixture(scope="module")
def wheelhouse(tmp_path_factory) -> Path:
    house = tmp_path_factory.mktemp("wheelhouse")
    sources = [str(ROOT / path) for path in DISTRIBUTIONS.values()]
    result = run([sys.executable, "-m", "pip", "wheel", "--quiet", "--no-deps",
                  "--no-build-isolation", "--wheel-dir", str(house), *sources])
    assert result.returncode == 0, result.stderr
    return house


def test_every_distribution_builds_a_wheel_with_license_readme_and_types(wheelhouse):
    import zipfile

    wheels = sorted(p.name for p in wheelhouse.glob("*.whl"))
    expected = sorted(f"{name.replace('-', '_')}-{VERSION}-py3-none-any.whl"
                      for name in DISTRIBUTIONS)
    assert wheels == expected
    for wheel in wheelhouse.glob("*.whl"):
        names = zipfile.ZipFile(wheel).namelist()
        assert any(n.endswith(".dist-info/licenses/LICENSE") for n in names), wheel.name
        metadata = zipfile.ZipFile(wheel).read(
            next(n for n in names if n.endswith(".dist-info/METADATA"))).decode()
        assert "License-Expression: MIT" in metadata, wheel.name
        assert "Requires-Python: >=3.10" in metadata, wheel.name
        assert "Project-URL: Source" in metadata, wheel.name
        assert "Classifier: Programming Language :: Python :: 3.13" in metadata, wheel.name
        assert metadata.count("\n\n") >= 1 and "pip install" in metadata, wheel.name  # readme
        assert not any(n.startswith("tests/") for n in names), wheel.name
        if not wheel.name.startswith(f"everyo-{VERSION}"):
            assert any(n.endswith("/py.typed") for n in names), wheel.name


def make_env(tmp_path: Path, wheelhouse: Path, *requirements: str) -> Path:
    """A fresh virtual environment holding ``requirements`` from the wheelhouse; its python."""
    home = tmp_path / "venv"
    venv.EnvBuilder(with_pip=False, clear=True).create(home)
    python = home / "bin" / "python"
    result = run([sys.executable, "-m", "pip", "--python", str(python), "install", "--quiet",
                  "--find-links", str(wheelhouse), *requirements])
    assert result.returncode == 0, result.stderr
    return python


def check(python: Path, code: str) -> str:
    # NOTE: a script file, not -c: spawn's workers re-import the script that started them.
    script = python.parent.parent / "check_script.py"
    script.write_text(textwrap.dedent(code))
    result = run([str(python), str(script)])
    assert result.returncode == 0, f"{result.stdout}\n{result.stderr}"
    return result.stdout


def plugins_listed(python: Path) -> set[str]:
    """The distributions ``everyo plugins`` lists as loaded (it exits 1 if one failed)."""
    result = run([str(python.parent / "everyo"), "plugins"])
    assert result.returncode == 0, result.stdout + result.stderr
    return {line.split("[")[1].split()[0] for line in result.stdout.splitlines()
            if line and not line.startswith(" ") and "[" in line}


HINT = """
import everyo as eo
def hint(name):
    try:
        getattr(eo, name)
    except AttributeError as exc:
        return str(exc)
    raise SystemExit(f"eo.{name} exists")
"""


def test_core_alone(tmp_path, wheelhouse):
    python = make_env(tmp_path, wheelhouse, "everyo-core")
    out = check(python, HINT + """
x = eo.tensor([1.0, 2.0], requires_grad=True)
(x * x).sum().backward()
print(x.grad.tolist())
for name, dist in [("Linear", "everyo-layers"), ("autocast", "everyo-amp"),
                   ("export_onnx", "everyo-onnx"), ("distributed", "everyo-dist")]:
    assert f"pip install {dist}" in hint(name), (name, hint(name))
try:
    import everyo.distributed
except ImportError as exc:
    assert "everyo-dist" in str(exc), exc
else:
    raise SystemExit("everyo.distributed imported without everyo-dist")
""")
    assert out.splitlines()[0] == "[2.0, 4.0]"
    assert plugins_listed(python) == {"everyo-core"}
    version = run([str(python.parent / "everyo"), "--version"])
    assert version.stdout.strip() == f"everyo {VERSION}"
    assert run([str(python), "-m", "everyo"]).returncode == 0


def test_core_and_amp(tmp_path, wheelhouse):
    python = make_env(tmp_path, wheelhouse, "everyo-core", "everyo-amp")
    out = check(python, """
import everyo as eo
w = eo.ones(3, 4, requires_grad=True)
with eo.autocast():
    y = eo.ones(2, 3) @ w
scaler = eo.GradScaler()
scaler.backward(y.sum())
print(y.dtype, w.grad.dtype)
""")
    assert out.split() == ["float16", "float32"]
    assert plugins_listed(python) == {"everyo-core", "everyo-amp"}


def test_core_layers_onnx_without_runtime(tmp_path, wheelhouse):
    python = make_env(tmp_path, wheelhouse, "everyo-core", "everyo-layers", "everyo-onnx")
    check(python, """
import os, tempfile
import everyo as eo
model = eo.Sequential(eo.Linear(4, 3, seed=0), eo.ReLU())
path = os.path.join(tempfile.mkdtemp(), "m.onnx")
eo.export_onnx(model, path, input_shape=(1, 4))
assert os.path.getsize(path) > 0
for call in (lambda: eo.run_onnx(path, [[0.0] * 4]),
             lambda: eo.export_onnx(model, path + "2", input_shape=(1, 4), verify=True)):
    try:
        call()
    except ImportError as exc:
        assert "pip install 'everyo-onnx[runtime]'" in str(exc), exc
    else:
        raise SystemExit("onnxruntime is not installed, yet the call ran")
assert not os.path.exists(path + "2")
""")
    assert plugins_listed(python) == {"everyo-core", "everyo-layers", "everyo-onnx"}


def test_core_and_onnx_export_models_of_core_ops(tmp_path, wheelhouse):
    python = make_env(tmp_path, wheelhouse, "everyo-core", "everyo-onnx[runtime]")
    check(python, HINT + """
import os, tempfile
import numpy as np

class Affine(eo.Module):
    def __init__(self):
        super().__init__()
        self.w = eo.Parameter(np.eye(4, 3, dtype=np.float32))

    def forward(self, x):
        return eo.relu(x @ self.w)

path = os.path.join(tempfile.mkdtemp(), "m.onnx")
eo.export_onnx(Affine(), path, input_shape=(1, 4), verify=True)
x = np.ones((2, 4), np.float32)
assert np.allclose(eo.run_onnx(path, x), Affine()(eo.tensor(x)).data)
assert "pip install everyo-layers" in hint("Linear"), hint("Linear")
""")
    assert plugins_listed(python) == {"everyo-core", "everyo-onnx"}


def test_core_and_dist(tmp_path, wheelhouse):
    python = make_env(tmp_path, wheelhouse, "everyo-core", "everyo-dist")
    out = check(python, """
import numpy as np
from everyo.distributed import spawn

def work(group):
    return group.all_reduce_sum(np.full(3, group.rank + 1.0)).tolist()

if __name__ == "__main__":
    print(spawn(work, world_size=2))
""")
    assert out.strip() == "[[3.0, 3.0, 3.0], [3.0, 3.0, 3.0]]"
    assert plugins_listed(python) == {"everyo-core", "everyo-dist"}
    launcher = run([str(python.parent / "everyo-run"), "--help"])
    assert launcher.returncode == 0 and "usage" in launcher.stdout


def test_everything(tmp_path, wheelhouse):
    python = make_env(tmp_path, wheelhouse, "everyo[all]")
    check(python, """
import os, tempfile
import numpy as np
import everyo as eo
model = eo.Sequential(eo.Linear(4, 3, seed=0), eo.ReLU())
path = os.path.join(tempfile.mkdtemp(), "m.onnx")
eo.export_onnx(model, path, input_shape=(1, 4), verify=True)
x = np.ones((2, 4), np.float32)
assert np.allclose(eo.run_onnx(path, x), model(eo.tensor(x)).data, atol=1e-6)
with eo.autocast():
    assert model(eo.tensor(x)).dtype == "float16"
import mpi4py  # the [mpi] extra of everyo-dist
st_path = os.path.join(tempfile.mkdtemp(), "m.safetensors")  # everyo-core[safetensors]
eo.save(model, st_path)
assert sorted(eo.load(st_path)) == sorted(model.state_dict())
assert eo.kernels.provider_name() == "numba"  # everyo-numba's kernels, the default provider
pooled = eo.MaxPool2D(2)(eo.tensor(np.arange(16.0, dtype=np.float32).reshape(1, 4, 4, 1)))
assert pooled.data.ravel().tolist() == [5.0, 7.0, 13.0, 15.0]
""")
    assert plugins_listed(python) == set(FIRST_PARTY)
    assert eo.__version__ == VERSION  # the developer install agrees with the one version file
