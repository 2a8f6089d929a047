"""Hierarchical against flat all-reduce, 2 "machines" x 2 ranks across a 1 Gbit/s link.

Two network namespaces joined by a veth pair shaped to 1 Gbit/s each way (``TwoHosts`` of
``bench_ddp``), one ``everyo-run --nproc-per-node 2 --backend tcp_hierarchical`` per namespace.
In the same job, alternating round by round, every rank times a 40 MB float32
``all_reduce_sum`` run hierarchically (``hierarchy="always"``: shared memory inside a machine,
raw rows to the slice owners between the two leaders), on the flat 4-rank tcp ring
(``hierarchy="never"``: the same group's ``tcp`` ring, which sums in rank order) and, for the
record, on the flat ring's previous all-reduce (rotated summation order, ``_rotated_ring.py``:
not bit-identical to the others at 4 ranks). Target: hierarchical <= 0.7 x flat. By bytes on
the busiest link the ideal is 6/9 = 0.67 (see docs/distributed.md); the previous ring sent 8.

Needs root and iproute2. Run: ``python benchmarks/bench_hierarchical.py [--megabytes 40]``.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from bench_ddp import ADDRESSES, ENV, RATE, TwoHosts

HERE = Path(__file__).resolve().parent
EVERYO_RUN = shutil.which("everyo-run", path=str(Path(sys.executable).parent)) or "everyo-run"
PORT = 29617


def worker(megabytes: float, rounds: int) -> None:
    """One rank: time both algorithms on the same vector, alternating; rank 0 prints JSON."""
    import _rotated_ring
    import numpy as np

    import everyo.distributed as dist

    group = dist.init(hierarchy="always")
    transport = group.transport  # the choice is per call; switch it between rounds
    flat_ring = transport._flat._ring
    vector = np.random.default_rng(group.rank).standard_normal(
        int(megabytes * 2 ** 20 // 4)).astype(np.float32)
    times = {"always": [], "never": [], "previous": []}
    results = {}
    for round_index in range(rounds + 1):  # round 0 warms all up (buffers, page faults)
        for choice in ("never", "always", "previous"):
            transport._hierarchy = "never" if choice == "previous" else choice
            if choice == "previous":
                _rotated_ring.install(flat_ring)
            group.barrier()
            start = time.perf_counter()
            results[choice] = group.all_reduce_sum(vector)
            if round_index:
                times[choice].append(time.perf_counter() - start)
            _rotated_ring.uninstall(flat_ring)
    same = results["always"].tobytes() == results["never"].tobytes()
    if group.rank == 0:
        print(json.dumps({"hierarchical": statistics.median(times["always"]),
                          "flat": statistics.median(times["never"]),
                          "previous_flat": statistics.median(times["previous"]),
                          "same_bits": same, "megabytes": vector.nbytes / 2 ** 20}))
    group.close()


def main() -> None:
    parser = argparse.ArgumentParser()
    parser.add_argument("--worker", action="store_true")
    parser.add_argument("--megabytes", type=float, default=40.0)
    parser.add_argument("--rounds", type=int, default=5)
    args = parser.parse_args()
    if args.worker:
        worker(args.megabytes, args.rounds)
        return
    if shutil.which("ip") is None or shutil.which("tc") is None or os.geteuid() != 0:
        raise SystemExit("bench_hierarchical needs root and iproute2 (ip netns, tc)")
    print(f"2 machines (network namespaces) x 2 ranks, link shaped to {RATE} each way; "
          f"one BLAS thread per rank (load average printed below)")
    load = f"{os.getloadavg()[0]:.2f}"
    with TwoHosts() as hosts, tempfile.TemporaryDirectory() as scratch:
        token_file = Path(scratch) / "job.token"
        token_file.write_text(os.urandom(16).hex())
        token_file.chmod(0o600)
        nodes = [subprocess.Popen(
            ["ip", "netns", "exec", hosts.names[node], EVERYO_RUN, "--nnodes", "2",
             "--node-rank", str(node), "--nproc-per-node", "2", "--backend", "tcp_hierarchical",
             "--master", f"{ADDRESSES[0]}:{PORT}", "--token-file", str(token_file),
             str(Path(__file__).resolve()), "--worker", "--megabytes", str(args.megabytes),
             "--rounds", str(args.rounds)],
            env=ENV, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for node in (1, 0)]
        outputs = [node.communicate(timeout=900) for node in nodes]
    for node, (out, err) in zip(nodes, outputs):
        if node.returncode != 0:
            raise SystemExit(f"benchmark job failed:\n{out}\n{err}")
    line = next(line for line in outputs[1][0].splitlines() if line.startswith("[rank 0] {"))
    figures = json.loads(line.split("] ", 1)[1])
    print(f"all_reduce_sum of {figures['megabytes']:.0f} MB float32 (median of {args.rounds} "
          f"alternating rounds; load before: {load}, after: {os.getloadavg()[0]:.2f}):\n"
          f"  hierarchical {figures['hierarchical'] * 1e3:.0f} ms, flat ring "
          f"{figures['flat'] * 1e3:.0f} ms, ratio {figures['hierarchical'] / figures['flat']:.2f}x"
          f" (target <= 0.70x); same bits: {figures['same_bits']}\n"
          f"  flat ring in rank order {figures['flat'] * 1e3:.0f} ms against the previous "
          f"rotated-order ring {figures['previous_flat'] * 1e3:.0f} ms: "
          f"{figures['flat'] / figures['previous_flat']:.2f}x (bytes: 9/8 = 1.12x)")


if __name__ == "__main__":
    main()
