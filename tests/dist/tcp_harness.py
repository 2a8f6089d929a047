"""Runs tcp-backend ranks as real processes for the tests, and is the worker script itself.

``run_ranks(mode, world_size, ...)`` starts a ``TCPRendezvousServer`` in the test process and
``python tcp_harness.py MODE RANK WORLD HOST PORT TOKEN OUTDIR`` once per rank; each worker
joins the group, runs MODE and saves what it returns to ``OUTDIR/rank<K>.npz`` (no pickle) or
its error to ``OUTDIR/rank<K>.err``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
WORKER_ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1",
                  MKL_NUM_THREADS="1")


def start_ranks(mode, world_size, port, outdir, host="127.0.0.1", token="test-token",
                extra=(), ranks=None, netns=None):
    """Start the worker processes (``netns``: optional list, per rank, of namespace names)."""
    procs = []
    for rank in (range(world_size) if ranks is None else ranks):
        command = [sys.executable, str(HERE / "tcp_harness.py"), mode, str(rank),
                   str(world_size), host, str(port), token, str(outdir), *map(str, extra)]
        if netns is not None:
            command = ["ip", "netns", "exec", netns[rank], *command]
        procs.append(subprocess.Popen(command, env=WORKER_ENV, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    return procs


def finish(procs, timeout=60):
    """Wait for the workers (killing them at ``timeout``); returns their outputs."""
    deadline = time.monotonic() + timeout
    outputs = []
    for proc in procs:
        try:
            outputs.append(proc.communicate(timeout=max(deadline - time.monotonic(), 0.1))[0])
        except subprocess.TimeoutExpired:
            for other in procs:
                other.kill()
            raise AssertionError(f"tcp workers did not finish within {timeout}s") from None
    return outputs


def load_results(outdir, world_size):
    results = []
    for rank in range(world_size):
        error = Path(outdir) / f"rank{rank}.err"
        if error.exists():
            raise AssertionError(f"rank {rank} failed: {error.read_text()}")
        with np.load(Path(outdir) / f"rank{rank}.npz") as data:
            results.append({key: data[key] for key in data.files})
    return results


def run_ranks(mode, world_size, outdir, token="test-token", extra=(), timeout=60):
    """Server in this process, one worker process per rank; every rank's saved results."""
    from everyo.distributed_tcp import TCPRendezvousServer

    with TCPRendezvousServer(world_size=world_size, token=token) as server:
        procs = start_ranks(mode, world_size, server.port, outdir, token=token, extra=extra)
        outputs = finish(procs, timeout)
    for proc, output in zip(procs, outputs):
        assert proc.returncode == 0, f"worker exited with {proc.returncode}:\n{output}"
    return load_results(outdir, world_size)


def run_threads(target, count):
    """Run ``target(rank)`` in ``count`` threads; return results or raise the first error."""
    results, errors = [None] * count, []

    def run(rank):
        try:
            results[rank] = target(rank)
        except BaseException as exc:
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(rank,)) for rank in range(count)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    if errors:
        raise errors[0]
    return results


def make_test_certificates(directory):
    """A throw-away cluster CA and one node certificate signed by it (openssl CLI); skips
    the calling test where the CLI is missing."""
    import pytest

    def openssl(*args):
        subprocess.run(["openssl", *args], cwd=directory, check=True, capture_output=True)

    try:
        openssl("req", "-x509", "-newkey", "rsa:2048", "-nodes", "-keyout", "ca.key",
                "-out", "ca.pem", "-days", "1", "-subj", "/CN=everyo-test-ca")
        openssl("req", "-newkey", "rsa:2048", "-nodes", "-keyout", "node.key", "-out",
                "node.csr", "-subj", "/CN=everyo-node")
        openssl("x509", "-req", "-in", "node.csr", "-CA", "ca.pem", "-CAkey", "ca.key",
                "-CAcreateserial", "-out", "node.pem", "-days", "1")
    except (OSError, subprocess.CalledProcessError) as exc:
        pytest.skip(f"cannot create test certificates with the openssl CLI: {exc}")
    return {name: str(Path(directory) / name) for name in ("node.pem", "node.key", "ca.pem")}


def mean_over_threads(port, world_size=2, **kwargs):
    """Ranks as threads of this process: each returns the mean of ``[rank] * 3``."""
    from everyo.distributed_tcp import init_tcp_process_group

    def rank_job(rank):
        with init_tcp_process_group("127.0.0.1", port, rank=rank, world_size=world_size,
                                    timeout=20, **kwargs) as group:
            return group.all_reduce_mean(np.full(3, rank, np.float32))

    return run_threads(rank_job, world_size)



TRAIN_SCRIPT = f"""
import os, sys
sys.path.insert(0, {str(HERE)!r})
import numpy as np
import everyo.distributed as dist
from dist_workers import make_data, train_worker

group = dist.init()
print("threads", os.environ["OMP_NUM_THREADS"], "backend", group.backend,
      "world", group.world_size, "args", sys.argv[1:])
weights = train_worker(group, *make_data())
np.savez(os.path.join(sys.argv[1], f"rank{{group.rank}}.npz"), *weights)
print("done")
group.close()
"""

def launcher_environment():
    """The environment of an everyo-run test: no BLAS or EVERYO_* settings inherited."""
    env = dict(os.environ)
    for variable in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS",
                     "EVERYO_TOKEN", "EVERYO_TOKEN_FILE", "EVERYO_BACKEND"):
        env.pop(variable, None)
    return env



# -- worker side ---------------------------------------------------------------------------------
def _primitives(group, args):
    import dist_workers

    return dist_workers.primitives(group, [(5, 7), (1,), (0,), (1001,)])


def _train(group, args):
    import dist_workers

    inputs, targets = dist_workers.make_data()
    weights = dist_workers.train_worker(group, inputs, targets)
    return {f"w{index}": w for index, w in enumerate(weights)}


def _hammer(group, args):
    """All-reduce until something breaks; rank ``args[0]`` announces readiness and waits to
    be killed. Saves the error the survivors get."""
    victim = int(args[0])
    vector = np.ones(1_000_000, np.float32)
    group.all_reduce_mean(vector)
    if group.rank == victim:
        (Path(args[1]) / "ready").write_text(str(os.getpid()))
    while True:
        group.all_reduce_mean(vector)


def _skip(group, args):
    """Rank ``args[0]`` never calls the collective the others wait in."""
    if group.rank == int(args[0]):
        time.sleep(30)
    group.all_reduce_sum(np.ones(3, np.float32))
    return {}


def _mismatch(group, args):
    group.all_reduce_mean(np.zeros(4 + group.rank, np.float32))
    return {}


MODES = {"primitives": _primitives, "train": _train, "hammer": _hammer, "skip": _skip,
         "mismatch": _mismatch}


def worker_main(argv):
    mode, rank, world_size, host, port, token, outdir, *args = argv
    sys.path.insert(0, str(HERE))
    from everyo.distributed_tcp import init_tcp_process_group

    rank, outdir = int(rank), Path(outdir)
    try:
        timeout = float(os.environ.get("EVERYO_TIMEOUT", "30"))
        with init_tcp_process_group(host, int(port), rank=rank, world_size=int(world_size),
                                    token=token or None, timeout=timeout) as group:
            result = MODES[mode](group, args)
        np.savez(outdir / f"rank{rank}.npz", **result)
    except Exception as exc:  # the test reads what each rank saw
        (outdir / f"rank{rank}.err").write_text(f"{type(exc).__name__}|{time.time():.3f}|{exc}")
        sys.exit(1)


if __name__ == "__main__":
    worker_main(sys.argv[1:])
