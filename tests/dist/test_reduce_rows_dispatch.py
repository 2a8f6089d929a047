"""``everyo_dist.reduction.reduce_rows`` runs the NumPy reference below ``COMPILED_FROM``
elements whatever the kernel selection (so a job of small collectives never pays the provider's
start-up), and the selected provider's loop from there on. The bits are the same either way:
the provider's loop is checked bit for bit against the reference on the kernel table
(``tests/numba/test_kernels_against_references.py``, ``reduce_rows`` in ``EXACT``)."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import everyo as eo
from everyo_dist.reduction import COMPILED_FROM, reduce_rows

PROVIDER = eo.registry("kernels").providers().get("numba")
needs_numba = pytest.mark.skipif(PROVIDER is None, reason="everyo-numba is not installed")


def _rows(length: int) -> list:
    rng = np.random.default_rng(0)
    return [rng.standard_normal(length).astype(np.float32) for _ in range(3)]


@pytest.fixture
def provider_calls(monkeypatch):
    """The lengths the numba provider's ``reduce_rows`` is called with, in this process."""
    calls = []
    compiled = PROVIDER.resolve("reduce_rows")

    def counting(rows, out, *args):
        calls.append(len(out))
        return compiled(rows, out, *args)

    monkeypatch.setitem(PROVIDER._resolved, "reduce_rows", counting)
    eo.kernels.kernel.invalidate()
    yield calls
    eo.kernels.kernel.invalidate()


@needs_numba
@pytest.mark.parametrize("length", [0, 1, COMPILED_FROM - 1, COMPILED_FROM, 3 * COMPILED_FROM])
def test_the_provider_runs_from_the_threshold_on_and_the_bits_are_the_reference(
        provider_calls, length):
    rows = _rows(length)
    expected = np.empty(length, np.float32)
    with eo.kernels.use("numpy"):
        reduce_rows(rows, expected, 3)
    got = np.empty(length, np.float32)
    with eo.kernels.use("numba"):
        reduce_rows(rows, got, 3)
    assert provider_calls == ([length] if length >= COMPILED_FROM else [])
    np.testing.assert_array_equal(got.view(np.uint32), expected.view(np.uint32))


@needs_numba
def test_a_process_of_small_reductions_never_imports_numba():
    # NOTE: a fresh interpreter with the default selection (everyo-numba installed): small
    # calls leave Numba unimported; the first call at the threshold imports it.
    script = (
        "import sys, numpy as np, everyo as eo\n"
        "from everyo_dist.reduction import COMPILED_FROM, reduce_rows\n"
        "assert eo.kernels.provider_name() == 'numba', eo.kernels.provider_name()\n"
        "for n in (1, 100, COMPILED_FROM - 1):\n"
        "    reduce_rows([np.ones(n, np.float32)] * 2, np.empty(n, np.float32), 2)\n"
        "print('numba' in sys.modules)\n"
        "n = COMPILED_FROM\n"
        "reduce_rows([np.ones(n, np.float32)] * 2, np.empty(n, np.float32), 2)\n"
        "print('numba' in sys.modules)\n")
    env = {k: v for k, v in os.environ.items() if not k.startswith("EVERYO_")}
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True,
                          env=env, timeout=120)
    assert done.returncode == 0, done.stderr[-3000:]
    assert done.stdout.split() == ["False", "True"]
