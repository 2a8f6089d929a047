"""``mpiexec -n N python ddp_mpi_harness.py FUNCTION OUTDIR [ARGS...]``: each rank creates
its group with ``init(backend="mpi")``, calls ``ddp_workers.FUNCTION(group, *ARGS)`` and saves
the dict it returns to ``OUTDIR/rank<K>.npz``."""

from __future__ import annotations

import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402


def main(function: str, outdir: Path, args: list) -> None:
    import ddp_workers

    import everyo.distributed as dist

    group = dist.init(backend="mpi", timeout=60)
    result = getattr(ddp_workers, function)(group, *args)
    np.savez(outdir / f"rank{group.rank}.npz", **result)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
