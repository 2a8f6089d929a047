"""Shared timing helpers for the benchmarks (not a test: nothing here asserts)."""

from __future__ import annotations

import statistics
import time


def best_of(fn, repeats: int = 7, warmup: int = 2) -> float:
    """Median of ``repeats`` timings of ``fn()`` in seconds, after ``warmup`` untimed calls."""
    for _ in range(warmup):
        fn()
    times = []
    for _ in range(repeats):
        start = time.perf_counter()
        fn()
        times.append(time.perf_counter() - start)
    return statistics.median(times)


def torch_or_none():
    """PyTorch if installed (the reference), else None."""
    try:
        import torch
    except ImportError:
        return None
    return torch


def ratio_line(label: str, ours: float, reference: float | None, unit: str = "µs",
               target: str = "") -> str:
    ref = f"{reference:10.2f} {unit}" if reference is not None else "   (no reference installed)"
    ratio = f"{ours / reference:6.2f}x" if reference else "     -"
    return f"{label:<28} {ours:10.2f} {unit}  {ref}  {ratio}  {target}"
