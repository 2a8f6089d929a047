"""everyo-core ships ``py.typed``: its public API must type-check, operators included."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

pytest.importorskip("mypy")
ROOT = Path(__file__).resolve().parents[2]

USER_CODE = '''
import numpy as np
import everyo as eo

x = eo.tensor([1.0, 2.0], requires_grad=True)
w = eo.Parameter(np.ones((2, 2), np.float32))
y: eo.Tensor = (2.0 - x) * 3 / x ** 2 + abs(-x)
z: eo.Tensor = (y @ w).exp().sum()
mask: eo.Tensor = x > 1.0
z.backward()
grads: tuple = eo.grad((x * x).sum(), [x])
optimizer = eo.SGD([w], lr=0.1)
optimizer.step()
# the op surface's generated methods and functions (everyo/op_surface.py), PyTorch's forms
rows: int = x.size(0) + x.size + x.numel() + x.dim()
shape: tuple = x.size()
pieces: tuple = x.pow(2).view(2, 1).split(1)
d = eo.diag(x).transpose(1, 0).permute((0, 1)).argmax(axis=0)
total = x.sum(axis=0, keepdims=True).exp().max() + eo.mean(x, axis=0) + eo.argmin(x, 0)
drawn = eo.multinomial(eo.full((3,), 1.0), 2).to("cpu")
'''

WRONG_CODE = USER_CODE + '''
n: int = x + 1
'''


MISSPELLED_CODE = USER_CODE + '''
x.sum(axes=0)
eo.exp(x, 2)
'''


def mypy(tmp_path: Path, code: str) -> subprocess.CompletedProcess:
    script = tmp_path / "user_code.py"
    script.write_text(code)
    return subprocess.run([sys.executable, "-m", "mypy", "--no-incremental", "--strict-optional",
                           "--cache-dir", str(tmp_path / "cache"), str(script)],
                          capture_output=True, text=True, timeout=300)


def test_user_code_type_checks(tmp_path):
    result = mypy(tmp_path, USER_CODE)
    assert result.returncode == 0, result.stdout + result.stderr


def test_type_checker_sees_what_operators_return(tmp_path):
    # The same code with one wrong annotation must fail: the operators are typed, not Any.
    result = mypy(tmp_path, WRONG_CODE)
    assert result.returncode == 1 and 'has type "Tensor"' in result.stdout, result.stdout


def test_type_checker_sees_the_op_surfaces_signatures(tmp_path):
    # The generated methods and functions (everyo/op_surface.py) carry their signatures.
    result = mypy(tmp_path, MISSPELLED_CODE)
    assert result.returncode == 1, result.stdout
    assert 'Unexpected keyword argument "axes"' in result.stdout, result.stdout
    assert "Too many arguments" in result.stdout, result.stdout


def test_the_core_type_checks():
    result = subprocess.run([sys.executable, "-m", "mypy", "--no-incremental",
                             str(ROOT / "everyo_core" / "src" / "everyo")],
                            capture_output=True, text=True, timeout=300)
    assert result.returncode == 0, result.stdout + result.stderr
