"""The mpi backend in real ``mpiexec -n 2`` jobs: primitives, the documented MLP, a
mismatch, and an exception on one rank ending the job instead of hanging it."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pytest
from dist_workers import make_data, rank_data, train_single_process

from everyo_dist.reduction import reduce_rows_f64

HERE = Path(__file__).resolve().parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent)) or shutil.which("mpiexec")
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found (pip install "
                                                        "'everyo-dist[mpi]')")
pytest.importorskip("mpi4py", reason="mpi4py not installed (pip install 'everyo-dist[mpi]')")
ENV = dict(os.environ, OMP_NUM_THREADS="1", OPENBLAS_NUM_THREADS="1", MKL_NUM_THREADS="1")


def mpi_job(mode, outdir, ranks=2, timeout=60):
    started = time.monotonic()
    done = subprocess.run([MPIEXEC, "-n", str(ranks), sys.executable,
                           str(HERE / "mpi_harness.py"), mode, str(outdir)],
                          env=ENV, capture_output=True, text=True, timeout=timeout)
    return done, time.monotonic() - started


def load(outdir, ranks=2):
    results = []
    for rank in range(ranks):
        with np.load(Path(outdir) / f"rank{rank}.npz") as data:
            results.append({key: data[key] for key in data.files})
    return results


def test_importing_everyo_distributed_does_not_initialise_mpi():
    code = ("import sys, everyo, everyo.distributed, everyo.distributed_tcp; "
            "print('mpi4py.MPI' in sys.modules)")
    done = subprocess.run([sys.executable, "-c", code], env=ENV, capture_output=True,
                          text=True, timeout=60)
    assert done.stdout.strip() == "False", done.stderr


def test_primitives_match_the_reference_and_ranks_agree(tmp_path):
    done, _ = mpi_job("primitives", tmp_path)
    assert done.returncode == 0, done.stderr
    results = load(tmp_path)
    for dtype in ("float32", "float64"):
        for index, shape in enumerate([(5, 7), (1,), (0,), (1001,)]):
            rows = [rank_data(r, shape, dtype, seed=index).reshape(-1) for r in range(2)]
            key = f"{dtype}-{index}"
            for result in results:
                np.testing.assert_array_equal(result[f"sum-{key}"],
                                              reduce_rows_f64(rows, False, dtype).reshape(shape))
                np.testing.assert_array_equal(result[f"mean-{key}"],
                                              reduce_rows_f64(rows, True, dtype).reshape(shape))
                np.testing.assert_array_equal(result[f"gather-{key}"],
                                              np.stack([r.reshape(shape) for r in rows]))
                np.testing.assert_array_equal(result[f"bcast-{key}"], rows[1].reshape(shape))
    assert [int(r["rank"]) for r in results] == [0, 1]
    for key in results[0]:
        if key not in ("rank", "is_main"):
            assert results[0][key].tobytes() == results[1][key].tobytes(), key
    np.testing.assert_array_equal(results[0]["int-sum"], np.arange(5) * 3)


def test_spec_mlp_matches_single_process_training(tmp_path):
    done, _ = mpi_job("train", tmp_path)
    assert done.returncode == 0, done.stderr
    results = load(tmp_path)
    for index, expected in enumerate(train_single_process(*make_data())):
        for result in results:
            np.testing.assert_allclose(result[f"w{index}"], expected, atol=1e-5, rtol=0)
        assert results[0][f"w{index}"].tobytes() == results[1][f"w{index}"].tobytes()


@pytest.mark.parametrize("mode", ["ddp", "ddp_rows"])
def test_distributed_data_parallel_matches_average_gradients_bit_for_bit(tmp_path, mode):
    done, _ = mpi_job(mode, tmp_path)
    assert done.returncode == 0, done.stderr
    for result in load(tmp_path):
        count = sum(key.startswith("ddp") for key in result)
        assert count == 8
        for index in range(count):
            assert result[f"ddp{index}"].tobytes() == result[f"ref{index}"].tobytes()


def test_mismatched_shapes_raise_on_every_rank_naming_both(tmp_path):
    done, _ = mpi_job("mismatch", tmp_path)
    assert done.returncode == 0, done.stderr
    for result in load(tmp_path):
        message = str(result["message"])
        assert "float32[4]" in message and "float32[5]" in message


def _mpich_segments() -> set[str]:
    return {p.name for p in Path("/dev/shm").glob("mpich_shm_*")} if Path("/dev/shm").is_dir() \
        else set()


def _mapped_anywhere(name: str) -> bool:
    for maps in Path("/proc").glob("[0-9]*/maps"):
        try:
            if name in maps.read_text():
                return True
        except OSError:
            continue
    return False


@pytest.fixture
def sweep_aborted_mpich_segments():
    """MPI_Abort kills the ranks before MPICH unlinks its shared-memory segment; remove the
    ones this test's job created (new, and mapped by no live process)."""
    before = _mpich_segments()
    yield
    for name in _mpich_segments() - before:
        if not _mapped_anywhere(name):
            (Path("/dev/shm") / name).unlink(missing_ok=True)


def test_an_exception_on_one_rank_aborts_the_job_instead_of_hanging(
        tmp_path, sweep_aborted_mpich_segments):
    done, elapsed = mpi_job("raise", tmp_path, timeout=60)
    assert done.returncode != 0
    assert "rank 1 fails on purpose" in done.stderr
    assert "aborting the MPI job" in done.stderr
    assert elapsed < 25  # the collective timeout is 30 s: the abort, not the timeout, ended it
