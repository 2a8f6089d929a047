"""Worker script for the tcp_hierarchical tests: ``python hier_harness.py MODE RANK WORLD
LOCAL_RANK PORT FLAT_PORT OUTDIR [HIERARCHY]``.

``MODE`` ``reduce``: join the hierarchical group (rendezvous on ``PORT``), all-reduce every case
of :data:`CASES`, then (unless ``FLAT_PORT`` is 0) join a plain tcp group there and do the same; save both to
``OUTDIR/rank<K>.npz``. ``kill``: one all-reduce, then the last rank SIGKILLs itself while the
others start a second. ``die_before_segment``: every leader but rank 0 SIGKILLs itself where it
would create its machine's shared segment. ``HIERARCHY`` may list one choice per rank,
comma-separated. Errors go to ``OUTDIR/rank<K>.err``. ``run_ranks`` starts the workers.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import traceback
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
TOKEN = "hier-test-token"
LENGTHS = (1, 2, 7, 1001, 70001)  # odd, shorter than the machines, longer than a reduce block
CASES = [(dtype, length, mean) for dtype in ("float32", "float64") for length in LENGTHS
         for mean in (False, True)] + [("int32", length, False) for length in LENGTHS]


def rank_data(rank: int, dtype: str, length: int) -> np.ndarray:
    """What rank ``rank`` contributes: values spanning many magnitudes, so that the order of
    float64 additions changes the bits."""
    rng = np.random.default_rng(1000 * rank + length)
    if dtype == "int32":  # sums that overflow int32 wrap, the same on every backend
        return rng.integers(-2 ** 31, 2 ** 31, length, dtype=np.int32)
    return (rng.standard_normal(length) * 10.0 ** rng.integers(-8, 9, length)).astype(dtype)


def _reduce_all(group) -> dict:
    results = {}
    for dtype, length, mean in CASES:
        data = rank_data(group.rank, dtype, length)
        reduce = group.all_reduce_mean if mean else group.all_reduce_sum
        results[f"{dtype}_{length}_{'mean' if mean else 'sum'}"] = reduce(data)
    return results


def _die_before_creating_the_segment():
    """Make this leader SIGKILL itself where it would create its machine's shared segment."""
    from everyo_dist.backends.hierarchical import group as hierarchical

    def killed(*args, **kwargs):
        os.kill(os.getpid(), signal.SIGKILL)

    hierarchical.ShmTransport = killed


def main(mode, rank, world, local_rank, port, flat_port, outdir, hierarchy="auto"):
    import everyo.distributed as dist

    rank, world = int(rank), int(world)
    if "," in hierarchy:  # one choice per rank (a misconfigured job)
        hierarchy = hierarchy.split(",")[rank]
    if mode == "die_before_segment" and int(local_rank) == 0 and rank > 0:
        _die_before_creating_the_segment()
    try:
        group = dist.init(backend="tcp_hierarchical", rank=rank, world_size=world,
                          local_rank=int(local_rank), master_addr="127.0.0.1",
                          master_port=int(port), token=TOKEN, timeout=60, hierarchy=hierarchy)
        with group:
            if mode == "die_before_segment":
                group.all_reduce_sum(np.ones(10, np.float32))
                return
            if mode == "kill":
                group.all_reduce_sum(np.ones(300001, np.float32))
                if rank == world - 1:
                    os.kill(os.getpid(), signal.SIGKILL)
                group.all_reduce_sum(np.ones(300001, np.float32))
                return
            results = {f"hier_{key}": value for key, value in _reduce_all(group).items()}
        if int(flat_port):  # the flat ring too, for comparisons by hand (docs/distributed.md)
            with dist.init(backend="tcp", rank=rank, world_size=world, master_addr="127.0.0.1",
                           master_port=int(flat_port), token=TOKEN, timeout=60) as flat:
                results.update({f"flat_{k}": v for k, v in _reduce_all(flat).items()})
        np.savez(Path(outdir) / f"rank{rank}.npz", **results)
    except BaseException:
        (Path(outdir) / f"rank{rank}.err").write_text(traceback.format_exc())
        raise SystemExit(1) from None


def start_ranks(mode, local_ranks, port, flat_port, outdir, hierarchy="auto"):
    """One worker process per entry of ``local_ranks`` (every rank's local rank)."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    return [subprocess.Popen([sys.executable, str(HERE / "hier_harness.py"), mode, str(rank),
                              str(len(local_ranks)), str(local), str(port), str(flat_port),
                              str(outdir), hierarchy],
                             env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
            for rank, local in enumerate(local_ranks)]


if __name__ == "__main__":
    main(*sys.argv[1:])
