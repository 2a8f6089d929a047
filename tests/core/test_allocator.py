"""everyo/allocator.py: freed large arrays stay mapped, so a repeated step faults no pages.

Each case runs in a fresh interpreter: the settings are per process and applied at import.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest

from everyo import allocator

pytestmark = pytest.mark.skipif(not allocator._glibc(), reason="glibc's malloc only")

# A step's activations: ten 2 MB arrays held together, then all freed; the last of four
# rounds reports the page faults it took.
PROBE = """
import resource
import numpy as np
import everyo
from everyo import allocator

def step():
    arrays = [np.ones(500_000, np.float32) for _ in range(10)]
    del arrays

for _ in range(3):
    step()
before = resource.getrusage(resource.RUSAGE_SELF).ru_minflt
step()
print(allocator.tuned, resource.getrusage(resource.RUSAGE_SELF).ru_minflt - before,
      allocator.why_untouched())
"""


def _probe(**env) -> tuple[bool, int, str]:
    clean = {k: v for k, v in os.environ.items()
             if not k.startswith("MALLOC_") and k not in ("GLIBC_TUNABLES", allocator.ENV)}
    out = subprocess.run([sys.executable, "-c", PROBE], env={**clean, **env},
                         capture_output=True, text=True, timeout=60, check=True).stdout
    tuned, faults, reason = out.strip().split(" ", 2)
    return tuned == "True", int(faults), reason


def test_import_keeps_freed_arrays_mapped():
    tuned, faults, reason = _probe()
    assert tuned and reason == "None"
    assert faults < 100  # 20 MB of fresh pages would be ~4,900 faults


def test_switched_off_the_step_faults_every_page_again():
    tuned, faults, reason = _probe(EVERYO_MALLOC_TUNING="0")
    assert not tuned and "EVERYO_MALLOC_TUNING" in reason
    assert faults > 4000  # the cost the tuning removes (and proof that the probe can see it)


@pytest.mark.parametrize("env, named", [
    ({"MALLOC_TRIM_THRESHOLD_": "131072"}, "MALLOC_TRIM_THRESHOLD_"),
    ({"GLIBC_TUNABLES": "glibc.malloc.mmap_threshold=65536"}, "GLIBC_TUNABLES"),
])
def test_a_users_own_malloc_settings_are_left_alone(env, named):
    tuned, _, reason = _probe(**env)
    assert not tuned and named in reason


def test_tuning_twice_changes_nothing():
    import everyo  # noqa: F401  (its import tuned this process, unless the environment says no)

    assert allocator.tune_malloc() is allocator.tuned
    assert allocator.tuned == (allocator.why_untouched() is None)
