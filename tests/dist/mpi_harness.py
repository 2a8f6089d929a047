"""Worker script of the mpi-backend tests: ``mpiexec -n N python mpi_harness.py MODE OUTDIR``.

Each rank creates its group with ``eo.distributed.init(backend="mpi")``, runs MODE and saves
the result to ``OUTDIR/rank<K>.npz``.
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402


def main(mode: str, outdir: Path) -> None:
    import dist_workers

    import everyo.distributed as dist

    assert "mpi4py.MPI" not in sys.modules, "mpi4py.MPI was imported before init()"
    group = dist.init(backend="mpi", timeout=30)
    if mode == "primitives":
        result = dist_workers.primitives(group, [(5, 7), (1,), (0,), (1001,)])
    elif mode == "wide":
        result = dist_workers.wide_reductions(group)
    elif mode == "train":
        inputs, targets = dist_workers.make_data()
        weights = dist_workers.train_worker(group, inputs, targets)
        result = {f"w{index}": w for index, w in enumerate(weights)}
    elif mode == "ddp":
        inputs, targets = dist_workers.make_data(rows=64)
        with_ddp = dist_workers.ddp_or_average(group, inputs, targets, True)
        reference = dist_workers.ddp_or_average(group, inputs, targets, False)
        result = {**{f"ddp{i}": w for i, w in enumerate(with_ddp)},
                  **{f"ref{i}": w for i, w in enumerate(reference)}}
    elif mode == "ddp_rows":  # (a weight whose gradient's rows leave as they are computed)
        inputs, targets = dist_workers.make_data(rows=64)
        with_ddp = dist_workers.wide_ddp_or_average(group, inputs, targets, False, None, True)
        reference = dist_workers.wide_ddp_or_average(group, inputs, targets, False, None, False)
        result = {**{f"ddp{i}": w for i, w in enumerate(with_ddp)},
                  **{f"ref{i}": w for i, w in enumerate(reference)}}
    elif mode == "mismatch":
        try:
            group.all_reduce_mean(np.zeros(4 + group.rank, np.float32))
        except dist.CollectiveMismatchError as exc:
            result = {"message": np.array(str(exc))}
    elif mode == "raise":
        group.barrier()
        if group.rank == 1:
            raise RuntimeError("rank 1 fails on purpose")
        group.all_reduce_mean(np.ones(10, np.float32))  # rank 0 would wait here forever
        time.sleep(60)
        result = {}
    np.savez(outdir / f"rank{group.rank}.npz", **result)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
