"""Fixtures of the everyo-amp tests. Worker functions for ``spawn`` live in ``amp_workers.py``
(workers import it by name, so this directory goes on ``sys.path``, which spawn hands on)."""

from __future__ import annotations

import sys
from pathlib import Path

HERE = str(Path(__file__).resolve().parent)
if HERE not in sys.path:
    sys.path.insert(0, HERE)
