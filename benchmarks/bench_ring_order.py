"""The flat tcp ring's all-reduce on loopback at 3+ ranks: rank order (both schedules) against
the previous rotated-order ring, interleaved in the same job.

    OMP_NUM_THREADS=1 python benchmarks/bench_ring_order.py [--ranks 3 4 6] [--megabytes 16]

Every rank times ``all_reduce_sum`` of a float32 and a float64 vector, round by round in turn:
the schedule the ring picks (``allreduce.plan``), each schedule forced (``ring``, ``chain``),
and the previous rotated-order ring (``_rotated_ring.py``, not bit-identical at 3+ ranks).
Medians per call on rank 0, and each figure as a ratio to the previous ring. Loopback has no
bandwidth limit, so this measures the CPU cost of the schedules (copies, float64 additions,
system calls) on a shared 2-core machine, not their bytes on a link; ``bench_hierarchical``
times a 1 Gbit/s link. The load average is printed with the figures.
"""

from __future__ import annotations

import argparse
import os
import statistics
import time
import types

import numpy as np

from everyo.distributed import spawn

VARIANTS = ("chosen", "ring", "chain", "previous")


def time_variants(group, megabytes: float, rounds: int) -> dict:
    """One rank: every variant on the same vectors, alternating; medians in seconds."""
    import _rotated_ring

    from everyo_dist.backends.tcp import allreduce

    ring = group.transport._ring
    forced = {"ring": allreduce._ring, "chain": allreduce._chain,
              "previous": _rotated_ring.rotated_all_reduce}
    times = {}
    for dtype in ("float32", "float64"):
        vector = np.random.default_rng(group.rank).standard_normal(
            int(megabytes * 2 ** 20) // np.dtype(dtype).itemsize).astype(dtype)
        chosen = allreduce.plan(vector.size, group.world_size, vector.itemsize)
        for round_index in range(rounds + 1):  # round 0 warms up buffers and page faults
            for variant in VARIANTS:
                if variant == "chain" and group.world_size < 3:
                    continue  # two ranks have only the ring
                if variant in forced:
                    ring.all_reduce = types.MethodType(forced[variant], ring)
                group.barrier()
                start = time.perf_counter()
                group.all_reduce_sum(vector)
                if round_index:
                    times.setdefault(f"{dtype} {variant}", []).append(
                        time.perf_counter() - start)
                ring.__dict__.pop("all_reduce", None)
        times[f"{dtype} plan"] = chosen
    return {key: value if isinstance(value, str) else statistics.median(value)
            for key, value in times.items()}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ranks", type=int, nargs="+", default=[3, 4, 6])
    parser.add_argument("--megabytes", type=float, default=16.0)
    parser.add_argument("--rounds", type=int, default=5)
    parser.add_argument("--quick", action="store_true", help="3 and 4 ranks, 4 MB, 2 rounds")
    args = parser.parse_args()
    if args.quick:
        args.ranks, args.megabytes, args.rounds = [3, 4], 4.0, 2
    for world_size in args.ranks:
        load = os.getloadavg()[0]
        figures = spawn(time_variants, world_size, args=(args.megabytes, args.rounds),
                        backend="tcp", timeout=300)[0]
        print(f"{world_size} ranks on loopback, {args.megabytes:g} MB all_reduce_sum, median "
              f"of {args.rounds} alternating rounds (load {load:.2f} -> "
              f"{os.getloadavg()[0]:.2f})")
        for dtype in ("float32", "float64"):
            previous = figures[f"{dtype} previous"]
            cells = [f"{variant} {figures[f'{dtype} {variant}'] * 1e3:6.0f} ms "
                     f"({figures[f'{dtype} {variant}'] / previous:.2f}x)"
                     for variant in VARIANTS[:-1] if f"{dtype} {variant}" in figures]
            print(f"  {dtype}: picks {figures[f'{dtype} plan']}; " + ", ".join(cells) +
                  f"; previous {previous * 1e3:.0f} ms")


if __name__ == "__main__":
    main()
