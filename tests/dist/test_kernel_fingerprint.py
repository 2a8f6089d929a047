"""#25 "the seam", distributed runs: the kernel provider is part of every collective's
fingerprint, so ranks that would compute different bits (one with ``EVERYO_KERNELS=numpy``, one
with the default provider) refuse to work together, on every backend, naming the difference.

Ranks are real processes a real ``mpiexec`` launches (one ``-env`` per rank: MPMD), each
creating its group with ``init()`` from the environment. The refusal comes at the first
collective: the group's first one (shm, tcp, mpi create a group without one), or inside
``init()`` where forming the group runs one (tcp_hierarchical); at once, never at the timeout.
"""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

HERE = Path(__file__).resolve().parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found (pip install "
                                                        "'everyo-dist[mpich]')")
TIMEOUT = 60  # the group's collective timeout: a refusal must come long before it


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def two_ranks_with(kernels: list[str | None], backend: str, outdir: Path) -> list[dict]:
    """Run ``kernels_announced`` on two ranks, rank ``r`` with ``EVERYO_KERNELS=kernels[r]``
    (None: unset, the default provider)."""
    from everyo_dist.backends.shm.segments import new_job_id, segment_name

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVERYO_", "PMI_", "OMPI_", "SLURM_"))}
    shared = {"EVERYO_BACKEND": backend, "MASTER_ADDR": "127.0.0.1",
              "MASTER_PORT": str(_free_port()), "EVERYO_TIMEOUT": str(TIMEOUT),
              "EVERYO_SHM_SEGMENT": segment_name(new_job_id(), "ctl")}
    command = [MPIEXEC]
    for name, value in shared.items():
        command += ["-genv", name, value]
    for rank, choice in enumerate(kernels):
        command += [":"] if rank else []
        command += ["-n", "1"] + (["-env", "EVERYO_KERNELS", choice] if choice else [])
        command += [sys.executable, str(HERE / "launched_harness.py"), "kernels_announced",
                    str(outdir)]
    done = subprocess.run(command, env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    results = []
    for rank in range(len(kernels)):
        with np.load(outdir / f"rank{rank}.npz") as saved:
            results.append({key: saved[key].item() for key in saved.files})
    assert all(r["backend"] == backend for r in results)
    return results


@pytest.mark.parametrize("backend", ["shm", "tcp", "tcp_hierarchical", "mpi"])
def test_ranks_with_different_kernels_refuse_each_other_naming_both(backend, tmp_path,
                                                                    clean_shm):
    pytest.importorskip("everyo_numba", reason="needs a second kernel provider")
    if backend == "mpi":
        pytest.importorskip("mpi4py")
    results = two_ranks_with(["numpy", None], backend, tmp_path)
    announced = [r["kernels"] for r in results]
    assert announced[0] == "numpy" and announced[1].startswith("numba "), announced
    for rank, result in enumerate(results):
        assert result["error"] == "CollectiveMismatchError", result
        # tcp_hierarchical's init() runs a collective (the machines' records): it refuses there
        assert result["stage"] == ("init" if backend == "tcp_hierarchical" else "collective")
        assert result["seconds"] < TIMEOUT / 4, result  # at once, not at the timeout
        # each rank names both providers (a tcp rank may relay its peer's view of it)
        views = [f"rank {a} computes with kernels '{announced[a]}' but rank {b} with "
                 f"'{announced[b]}'; set EVERYO_KERNELS the same on every rank"
                 for a, b in ((rank, 1 - rank), (1 - rank, rank))]
        assert any(view in result["message"] for view in views), result["message"]


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_ranks_with_the_same_kernels_work_together(backend, tmp_path, clean_shm):
    """The control: the same selection on both ranks (explicitly or by default) is no error."""
    results = two_ranks_with([None, None], backend, tmp_path)
    assert results[0]["kernels"] == results[1]["kernels"]
    assert [r["error"] for r in results] == ["", ""], [r["message"] for r in results]
    assert [r["stage"] for r in results] == ["", ""]
