"""#24.3 on every backend, in jobs a real ``mpiexec`` launches (``init()`` with no arguments):
collectives on infinities, NaN and overflowing sums give IEEE results with no RuntimeWarning
under warnings-as-errors (and the group keeps working), and ``average_gradients`` on a model
mixing float16/bfloat16 and float32 parameters rounds each mean once, as DDP does."""

from __future__ import annotations

import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
from dist_workers import ieee_data

from everyo_dist.reduction import reduce_rows_f64

HERE = Path(__file__).resolve().parent
MPIEXEC = shutil.which("mpiexec", path=str(Path(sys.executable).parent))
pytestmark = pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found (pip install "
                                                        "'everyo-dist[mpich]')")
RANKS = 3  # a mean over three ranks is not exact in float32: double rounding would show
BACKENDS = ("shm", "tcp", "tcp_hierarchical", "mpi")


def _free_port() -> int:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        return probe.getsockname()[1]


def launched_job(mode: str, backend: str, outdir: Path) -> list[dict]:
    """``mpiexec -n 3 python launched_harness.py MODE OUTDIR`` with ``EVERYO_BACKEND``."""
    if backend == "mpi":
        pytest.importorskip("mpi4py")
    from everyo_dist.backends.shm.segments import new_job_id, segment_name

    env = {k: v for k, v in os.environ.items()
           if not k.startswith(("EVERYO_", "PMI_", "OMPI_", "SLURM_"))}
    settings = {"EVERYO_BACKEND": backend, "MASTER_ADDR": "127.0.0.1",
                "MASTER_PORT": str(_free_port()), "PYTHONWARNINGS": "error",
                "EVERYO_SHM_SEGMENT": segment_name(new_job_id(), "ctl")}
    command = [MPIEXEC, "-n", str(RANKS)]
    for name, value in settings.items():
        command += ["-env", name, value]
    done = subprocess.run([*command, sys.executable, str(HERE / "launched_harness.py"), mode,
                           str(outdir)], env=env, capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stderr[-4000:]
    results = []
    for rank in range(RANKS):
        with np.load(outdir / f"rank{rank}.npz") as saved:
            results.append({key: saved[key] for key in saved.files})
    assert all(str(r["backend"]) == backend for r in results)
    return results


@pytest.mark.parametrize("backend", BACKENDS)
def test_infinities_nan_and_overflow_give_ieee_results_without_warnings(backend, tmp_path,
                                                                        clean_shm):
    results = launched_job("ieee_collectives", backend, tmp_path)
    rows = [ieee_data(rank) for rank in range(RANKS)]
    for key, value in rows[0].items():
        parts = [row[key] for row in rows]
        for mean in (False, True):
            expected = reduce_rows_f64(parts, mean, value.dtype)
            for result in results:
                np.testing.assert_array_equal(result[f"{'mean' if mean else 'sum'}-{key}"],
                                              expected)
    first = results[0]
    assert np.isnan(first["sum-signed32"][:3]).tolist() == [False, True, False]
    assert first["sum-signed32"][0] == np.inf and first["sum-signed32"][2] == -np.inf
    assert np.isposinf(first["sum-big32"]).all() and np.isposinf(first["sum-big16"]).all()
    # the mean is rounded once from the float64 sum: finite, where a float32 sum was inf
    assert (first["mean-big32"] == np.float32(3e38)).all()
    assert (first["mean-big16"] == np.float16(60000.0)).all()
    # float64 is the accumulator: its own overflow stays inf through the division
    assert np.isposinf(first["sum-huge64"]).all() and np.isposinf(first["mean-huge64"]).all()
    for result in results:
        np.testing.assert_array_equal(result["average16"], first["mean-signed16"])
        np.testing.assert_array_equal(result["average32"], first["mean-signed32"])
        np.testing.assert_array_equal(result["after"], np.float32([RANKS] * 3))


@pytest.mark.parametrize("backend", ["shm", "tcp"])
def test_average_gradients_rounds_16_bit_means_once_as_ddp_does(backend, tmp_path, clean_shm):
    import ml_dtypes

    results = launched_job("mixed_precision_gradients", backend, tmp_path)
    dtypes = {"float16": np.float16, "bfloat16": ml_dtypes.bfloat16, "float32": np.float32}
    seen, twice_differs, compared_with_ddp = set(), False, set()
    for index in range(len([k for k in results[0] if k.startswith("raw")])):
        dtype = np.dtype(dtypes[str(results[0][f"dtype{index}"])])
        seen.add(dtype.name)

        def value(array):
            return array.view(dtype) if dtype.itemsize == 2 else array

        raw = [value(r[f"raw{index}"]).reshape(-1) for r in results]
        expected = reduce_rows_f64(raw, True, dtype)  # float64 sum, one rounding to dtype
        if dtype.name == "float16" and raw[0].size > 1000:  # the test can tell: rounding
            twice = reduce_rows_f64(raw, True, np.float32).astype(dtype)  # via float32 differs
            twice_differs |= twice.tobytes() != expected.tobytes()
        for result in results:
            np.testing.assert_array_equal(value(result[f"average{index}"]).reshape(-1)
                                          .view(np.uint8), expected.view(np.uint8))
            if f"ddp{index}" in result:  # the model's (DDP has no bfloat16 buckets)
                compared_with_ddp.add(index)
                np.testing.assert_array_equal(value(result[f"ddp{index}"]).reshape(-1)
                                              .view(np.uint8), expected.view(np.uint8))
    assert seen == {"float16", "bfloat16", "float32"}
    assert compared_with_ddp == {0, 1, 2, 3}  # the float32 and float16 layers
    assert twice_differs, "no float16 element where rounding twice differs: the test is blind"

