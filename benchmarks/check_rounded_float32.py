"""Check ``everyo.half_precision.rounded_float32`` against ``astype`` on every float32 pattern.

All 2**32 bit patterns, in chunks of consecutive patterns (so that whole chunks take the fast
path, and the chunks holding large values, infs and NaNs take the fallback), for float16 and
bfloat16: ``rounded_float32(x, half)`` must equal ``x.astype(half).astype(float32)`` bit for
bit. Too slow for the test suite (a few minutes); the suite checks the edge cases.

Run:  python benchmarks/check_rounded_float32.py [--dtype float16|bfloat16]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from everyo.dtypes import BFLOAT16, FLOAT16, FLOAT32
from everyo.half_precision import rounded_float32

CHUNK = 1 << 24


def check(dtype: np.dtype) -> int:
    """Number of patterns whose rounding differs from astype's (0 when all agree)."""
    wrong = 0
    pattern = np.arange(CHUNK, dtype=np.uint32)
    for start in range(0, 1 << 32, CHUNK):
        x = (pattern + np.uint32(start)).view(FLOAT32)
        with np.errstate(all="ignore"):
            expected = x.astype(dtype).astype(FLOAT32).view(np.uint32)
            got = rounded_float32(x, dtype).view(np.uint32)
        differ = np.count_nonzero(got != expected)
        if differ:
            first = x.view(np.uint32)[np.argmax(got != expected)]
            print(f"  {dtype.name}: {differ} patterns differ in chunk {start:#010x}, "
                  f"first {first:#010x}")
        wrong += differ
    return wrong


def main(argv=None) -> None:
    parser = argparse.ArgumentParser(description="rounded_float32 against astype, exhaustively")
    parser.add_argument("--dtype", choices=["float16", "bfloat16"], action="append")
    args = parser.parse_args(argv)
    for name in args.dtype or ["float16", "bfloat16"]:
        began = time.perf_counter()
        wrong = check({"float16": FLOAT16, "bfloat16": BFLOAT16}[name])
        print(f"{name}: all 2**32 float32 patterns, {wrong} differ from astype "
              f"({time.perf_counter() - began:.0f} s)")


if __name__ == "__main__":
    main()
