"""Fixtures of the everyo-dist tests: worker functions live in ``dist_workers.py`` (workers
import it by name, so its directory goes on ``sys.path``, which spawn hands to the workers),
and every test checks that it left no shared-memory segment behind."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

import pytest

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
