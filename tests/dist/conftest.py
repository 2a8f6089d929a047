"""Fixtures of the everyo-dist tests: worker functions live in ``dist_workers.py`` (workers
import it by name, so its directory goes on ``sys.path``, which spawn hands to the workers),
every test checks that it left no shared-memory segment behind, and the worker processes a
test starts compute with the NumPy reference kernels unless the test is marked
``kernel_provider`` (see ``_reference_kernels_in_workers``)."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

import everyo as eo

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)


def _ours_or_orphaned(names: set[str]) -> set[str]:
    """Segments this test process owns or whose owner is dead: a concurrent test run's live
    jobs (other pytest processes share /dev/shm) are not this test's leaks."""
    from everyo_dist.backends.shm.segments import parse_name, process_alive

    return {name for name in names
            if parse_name(name)[0] == os.getpid() or not process_alive(parse_name(name)[0])}


def everyo_segments() -> set[str]:
    from everyo_dist.backends.shm.segments import our_segments

    return set(our_segments())


@pytest.fixture
def clean_shm():
    """Fails the test if it leaves an EveryO segment in /dev/shm."""
    before = everyo_segments()
    yield
    deadline = time.monotonic() + 2.0  # a concurrent job's parent may still be cleaning up
    while True:
        leaked = _ours_or_orphaned(everyo_segments() - before)
        if not leaked or time.monotonic() > deadline:
            break
        time.sleep(0.1)
    assert not leaked, f"shared-memory segments leaked: {sorted(leaked)}"


@pytest.fixture(autouse=True)
def _reference_kernels_in_workers(request):
    """Worker processes started by this test (``spawn``, ``mpiexec``, ``subprocess`` with this
    environment) run ``EVERYO_KERNELS=numpy``, unless the test is marked ``kernel_provider`` or
    the run already names a selection (CI's second run: ``EVERYO_KERNELS=numpy``).

    Why: a worker's first provider kernel (an optimizer's step, a large reduction) imports
    Numba and loads its cache, ~1 s of CPU per process; a two-rank job of a few tiny steps
    costs 2.8 s of CPU with it and 0.9 s without, and these tests start hundreds of them. What
    the tests prove of the provider holds apart from them: every provider kernel is checked
    against its reference on the kernel table (tests/numba), bit for bit where the reference's
    bits are the contract, and the tests marked ``kernel_provider`` run their workers with the
    default provider (the fingerprint refusal, the collectives' compiled reduction, DDP's and
    ZeRO's bit-for-bit trajectories with compiled optimizer steps on the gradient thread).

    This process decides its own selection from the real environment first, and decides again
    after the test if it changed meanwhile, so that the tests after this one see the run's own
    selection.
    """
    if request.node.get_closest_marker("kernel_provider") or eo.kernels.KERNELS_ENV in os.environ:
        yield
        return
    own = eo.kernels.provider_name()
    os.environ[eo.kernels.KERNELS_ENV] = "numpy"
    try:
        yield
    finally:
        del os.environ[eo.kernels.KERNELS_ENV]
        if eo.kernels.provider_name() != own:
            eo.kernels.kernel.select(None)  # (decided under the pin: decide again, unpinned)
