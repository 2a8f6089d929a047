"""``mpiexec -n N python ddp_mpi_harness.py FUNCTION OUTDIR [ARGS...]``: each rank creates
its group with ``init(backend="mpi")``, calls ``ddp_workers.FUNCTION(group, *ARGS)`` and saves
the dict it returns to ``OUTDIR/rank<K>.npz``."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

HERE = Path(__file__).resolve().parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or \
    shutil.which("mpiexec")


def run_under_mpiexec(function: str, outdir: Path, *args, ranks: int = 2) -> list[dict]:
    """Run ``ddp_workers.FUNCTION`` on ``ranks`` MPI ranks; every rank's saved arrays."""
    env = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")
    done = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable,
                           str(HERE / "ddp_mpi_harness.py"), function, str(outdir),
                           *map(str, args)],
                          env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr
    results = []
    for rank in range(ranks):
        with np.load(Path(outdir) / f"rank{rank}.npz") as data:
            results.append({key: data[key] for key in data.files})
    return results


def main(function: str, outdir: Path, args: list) -> None:
    import ddp_workers

    import everyo.distributed as dist

    group = dist.init(backend="mpi", timeout=60)
    result = getattr(ddp_workers, function)(group, *args)
    np.savez(outdir / f"rank{group.rank}.npz", **result)
    group.close()


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]), sys.argv[3:])
