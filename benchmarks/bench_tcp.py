"""All-reduce over the tcp backend vs PyTorch gloo and vs MPI, 2 ranks on loopback, same run.

Times ``group.all_reduce_mean`` of 40 KB and 40 MB float32 vectors on the tcp backend, then
``torch.distributed.all_reduce`` with the gloo backend (the reference; PyTorch is a benchmark-
only dependency), then mpi4py's ``Allreduce`` under ``mpiexec -n 2`` and EveryO's mpi backend.
Prints the median per size (best of three alternating rounds) and the ratios.
Run: ``python benchmarks/bench_tcp.py``.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
import time
from pathlib import Path

SIZES = {"40 KB": 10_000, "40 MB": 10_000_000}
REPEATS = {"40 KB": 200, "40 MB": 15}
ROUNDS = 3
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def _median_ms(samples):
    samples = sorted(samples)
    return samples[len(samples) // 2] * 1e3


def _time(run, barrier, label):
    timings = []
    for _ in range(3):
        run()  # warm-up: first-touch pages, connection buffers
    for _ in range(REPEATS[label]):
        barrier()
        start = time.perf_counter()
        run()
        timings.append(time.perf_counter() - start)
    return _median_ms(timings)


def worker_tcp(rank, port):
    import numpy as np

    from everyo.distributed_tcp import init_tcp_process_group

    group = init_tcp_process_group("127.0.0.1", port, rank=rank, world_size=2, token="bench",
                                   timeout=120)
    result = {}
    for label, count in SIZES.items():
        vector = np.random.default_rng(rank).standard_normal(count).astype(np.float32)
        result[label] = _time(lambda v=vector: group.all_reduce_mean(v), group.barrier, label)
    group.close()
    return result


def worker_gloo(rank, port):
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank,
                            world_size=2)
    result = {}
    for label, count in SIZES.items():
        vector = torch.randn(count, dtype=torch.float32)
        result[label] = _time(lambda v=vector: dist.all_reduce(v), dist.barrier, label)
    dist.destroy_process_group()
    return result


def worker_mpi():
    import numpy as np
    from mpi4py import MPI

    import everyo as eo

    comm = MPI.COMM_WORLD
    group = eo.distributed.init(backend="mpi")
    result = {}
    for label, count in SIZES.items():
        vector = np.random.default_rng(comm.rank).standard_normal(count).astype(np.float32)
        out = np.empty_like(vector)
        result[f"raw {label}"] = _time(lambda v=vector, o=out: comm.Allreduce(v, o, op=MPI.SUM),
                                       comm.Barrier, label)
        result[f"everyo {label}"] = _time(lambda v=vector: group.all_reduce_mean(v), comm.Barrier,
                                          label)
    group.close()
    return result


def _free_port():
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _run_pair(kind, port):
    procs = [subprocess.Popen([sys.executable, __file__, kind, str(rank), str(port)],
                              env=ENV, stdout=subprocess.PIPE, text=True) for rank in range(2)]
    outputs = [proc.communicate(timeout=600)[0] for proc in procs]
    if any(proc.returncode for proc in procs):
        raise SystemExit(f"{kind} workers failed: {[p.returncode for p in procs]}")
    return json.loads(outputs[0].strip().splitlines()[-1])


def main():
    from everyo.distributed_tcp import TCPRendezvousServer

    # Alternate the two a few times and keep each one's best round: the machine is shared,
    # and a burst of someone else's load should not decide the ratio.
    tcp_rounds, gloo_rounds = [], []
    for _ in range(ROUNDS):
        with TCPRendezvousServer(world_size=2, token="bench") as server:
            tcp_rounds.append(_run_pair("tcp", server.port))
        gloo_rounds.append(_run_pair("gloo", _free_port()))
    tcp = {label: min(r[label] for r in tcp_rounds) for label in SIZES}
    gloo = {label: min(r[label] for r in gloo_rounds) for label in SIZES}
    mpiexec = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) \
        or shutil.which("mpiexec")
    mpi = None
    if mpiexec:
        done = subprocess.run([mpiexec, "-n", "2", sys.executable, __file__, "mpi"], env=ENV,
                              capture_output=True, text=True, timeout=600)
        if done.returncode == 0:
            mpi = json.loads(done.stdout.strip().splitlines()[-1])
        else:
            print(f"mpi run failed:\n{done.stderr[-2000:]}")
    print("all_reduce, 2 ranks on loopback, float32, median ms")
    header = f"{'size':>6} {'tcp':>9} {'gloo':>9} {'tcp/gloo':>9}"
    if mpi:
        header += f" {'mpi(eo)':>9} {'Allreduce':>9} {'eo/MPI':>7}"
    print(header)
    for label in SIZES:
        line = f"{label:>6} {tcp[label]:9.3f} {gloo[label]:9.3f} {tcp[label] / gloo[label]:9.2f}"
        if mpi:
            ours, raw = mpi[f"everyo {label}"], mpi[f"raw {label}"]
            line += f" {ours:9.3f} {raw:9.3f} {ours / raw:7.2f}"
        print(line)


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] in ("tcp", "gloo"):
        worker = worker_tcp if sys.argv[1] == "tcp" else worker_gloo
        print(json.dumps(worker(int(sys.argv[2]), int(sys.argv[3]))), flush=True)
    elif len(sys.argv) > 1 and sys.argv[1] == "mpi":
        result = worker_mpi()
        from mpi4py import MPI
        if MPI.COMM_WORLD.rank == 0:
            print(json.dumps(result), flush=True)
    else:
        main()
