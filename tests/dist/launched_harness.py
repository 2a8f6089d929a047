"""Worker script of tests whose ranks a launcher starts (``mpiexec``, torchrun-style
variables): ``python launched_harness.py MODE OUTDIR``.

Each rank creates its group with ``eo.distributed.init()`` and no arguments (backend from
``EVERYO_BACKEND`` or the launcher, rank and world size from :func:`detect_environment`), runs
MODE (a function of ``dist_workers``) and saves what it returns to ``OUTDIR/rank<K>.npz``.
"""

from __future__ import annotations

import os
import sys
from pathlib import Path

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

sys.path.insert(0, str(Path(__file__).resolve().parent))

import numpy as np  # noqa: E402

MODES = ("ieee_collectives", "mixed_precision_gradients", "kernels_announced")


def main(mode: str, outdir: Path) -> None:
    import dist_workers

    import everyo.distributed as dist

    if mode not in MODES:
        raise SystemExit(f"unknown mode {mode!r}; one of {', '.join(MODES)}")
    if mode == "kernels_announced":  # (a group may refuse to form: init() raising is the result)
        from everyo_dist.environment import detect_environment

        result = dist_workers.kernels_announced(lambda: dist.init(timeout=60))
        result.setdefault("backend", np.array(os.environ.get("EVERYO_BACKEND", "")))
        np.savez(outdir / f"rank{detect_environment(os.environ).rank}.npz", **result)
        return
    with dist.init(timeout=60) as group:
        result = getattr(dist_workers, mode)(group)
        result["backend"] = np.array(group.backend)
        np.savez(outdir / f"rank{group.rank}.npz", **result)


if __name__ == "__main__":
    main(sys.argv[1], Path(sys.argv[2]))
