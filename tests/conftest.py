"""Shared test fixtures. PyTorch is an optional oracle: tests that need it take the ``torch``
fixture and are skipped cleanly where it is not installed."""

from __future__ import annotations

import os

import numpy as np
import pytest

# NOTE: the worker processes a test starts (several per test, on 2 cores) get one BLAS thread
# each, set here for them before they load NumPy. This process loaded NumPy above, first, so it
# runs with whatever the user exported: unpinned under a plain `make test`, pinned under CI's
# second run. Setting these before the import would pin every run and hide a test whose
# assertion holds for one thread count only.
for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")


@pytest.fixture(scope="session")
def torch():
    """The PyTorch module, or a skip when it is not installed (it is a test-only oracle)."""
    return pytest.importorskip("torch", reason="PyTorch (test-only oracle) is not installed")


@pytest.fixture
def rng():
    return np.random.default_rng(0)
