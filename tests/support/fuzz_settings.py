"""Hypothesis settings shared by the differential fuzzers in tests/fuzz.

CI runs a fixed, bounded number of examples from a fixed seed (``derandomize``), so a failure
reproduces and the suite keeps its time budget. ``EVERYO_FUZZ_EXAMPLES=2000`` runs more, from
fresh random seeds, for a local bug hunt:

    EVERYO_FUZZ_EXAMPLES=2000 .venv/bin/python -m pytest -q tests/fuzz
"""

from __future__ import annotations

import os

from hypothesis import HealthCheck, settings

_HUNT = os.environ.get("EVERYO_FUZZ_EXAMPLES")

settings.register_profile(
    "everyo-fuzz",
    max_examples=int(_HUNT) if _HUNT else 60,
    derandomize=not _HUNT,
    deadline=None,
    print_blob=True,
    suppress_health_check=[HealthCheck.too_slow, HealthCheck.data_too_large,
                           HealthCheck.filter_too_much],
)
FUZZ = settings.get_profile("everyo-fuzz")
