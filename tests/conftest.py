"""Shared test fixtures. PyTorch is an optional oracle: tests that need it take the ``torch``
fixture and are skipped cleanly where it is not installed."""

from __future__ import annotations

import os

# NOTE: must happen before NumPy loads its BLAS in any worker this test session starts.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402
import pytest  # noqa: E402


@pytest.fixture(scope="session")
def torch():
    """The PyTorch module, or a skip when it is not installed (it is a test-only oracle)."""
    return pytest.importorskip("torch", reason="PyTorch (test-only oracle) is not installed")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
