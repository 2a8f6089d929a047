"""Hierarchical against flat all-reduce, 2 "machines" x 2 ranks across a 1 Gbit/s link.

Two network namespaces joined by a veth pair shaped to 1 Gbit/s each way (``TwoHosts`` of
``bench_ddp``), one ``everyo-run --nproc-per-node 2 --backend tcp_hierarchical`` per namespace.
In the same job, alternating round by round, every rank times a 40 MB float32
``all_reduce_sum`` run hierarchically (``hierarchy="always"``: shared memory inside a machine,
raw rows to the slice owners between the two leaders) and on the flat 4-rank tcp ring
(``hierarchy="never"``: the same group's ``tcp`` ring). Target: hierarchical <= 0.7 x flat.
By bytes on the link the ideal is 6/8 = 0.75 (see docs/distributed.md).

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
    import numpy as np

    import everyo.distributed as dist

    group = dist.init(hierarchy="always")
    transport = group.transport  # the choice is per call; switch it between rounds
    vector = np.random.default_rng(group.rank).standard_normal(
        int(megabytes * 2 ** 20 // 4)).astype(np.float32)
    times = {"always": [], "never": []}
    results = {}
    for round_index in range(rounds + 1):  # round 0 warms both up (buffers, page faults)
        for choice in ("never", "always"):
            transport._hierarchy = choice
            group.barrier()
            start = time.perf_counter()
            results[choice] = group.all_reduce_sum(vector)
            if round_index:
                times[choice].append(time.perf_counter() - start)
    same = results["always"].tobytes() == results["never"].tobytes()
    if group.rank == 0:
        print(json.dumps({"hierarchical": statistics.median(times["always"]),
                          "flat": statistics.median(times["never"]),
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
          f"one BLAS thread per rank; machine shared with other jobs (loaded)")
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
    print(f"all_reduce_sum of {figures['megabytes']:.0f} MB float32: hierarchical "
          f"{figures['hierarchical'] * 1e3:.0f} ms, flat ring {figures['flat'] * 1e3:.0f} ms, "
          f"ratio {figures['hierarchical'] / figures['flat']:.2f}x (target <= 0.70x); "
          f"same bits: {figures['same_bits']}")


if __name__ == "__main__":
    main()
