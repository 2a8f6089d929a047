"""The public import path, lazy backend registration, ``init`` from environment variables and
the BLAS-thread rules."""

from __future__ import annotations

import os
import subprocess
import sys
import warnings

import dist_workers
import pytest

import everyo as eo
from everyo_dist import blas
from everyo_dist.errors import DistributedError
from everyo_dist.initialize import resolve_options


def test_public_import_path():
    import everyo.distributed as dist
    from everyo.distributed import (  # noqa: F401
        ProcessGroup,
        available_workers,
        average_gradients,
        init,
        shard_indices,
        spawn,
    )

    assert {"spawn", "average_gradients", "shard_indices", "available_workers", "init",
            "ProcessGroup"} <= set(dist.__all__)
    assert eo.distributed.init is init


def test_loading_the_plugin_imports_no_backend():
    code = ("import sys, everyo as eo; "
            "print(sorted(eo.registry('backends').items)); "
            "print([m for m in ('everyo_dist.backends.shm.group', 'mpi4py', 'everyo_dist.spawn') "
            "if m in sys.modules]); "
            "print(eo.distributed.init.__module__)")  # reachable as an attribute, imported lazily
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                         check=True).stdout.splitlines()
    assert "shm" in out[0]
    assert out[1] == "[]"
    assert out[2] == "everyo_dist.initialize"


def test_environment_fills_only_declared_parameters(tmp_path):
    def factory(rank, world_size, token=None, timeout=None):
        pass

    token_file = tmp_path / "token"
    token_file.write_text("s3cret\n")
    environ = {"EVERYO_RANK": "1", "EVERYO_WORLD_SIZE": "4", "EVERYO_MASTER_PORT": "29500",
               "EVERYO_MASTER_ADDR": "10.0.0.1",
               "EVERYO_TOKEN_FILE": str(token_file), "EVERYO_TIMEOUT": "7.5"}
    assert resolve_options(factory, {"rank": 3}, environ) == {
        "rank": 3, "world_size": 4, "token": "s3cret", "timeout": 7.5}
    with pytest.raises(DistributedError, match="EVERYO_RANK='one' is not a valid int"):
        resolve_options(factory, {}, {"EVERYO_RANK": "one", "EVERYO_WORLD_SIZE": "2"})


def test_init_reads_the_environment(monkeypatch):
    monkeypatch.setenv("EVERYO_BACKEND", "shm")
    monkeypatch.setenv("EVERYO_RANK", "0")
    monkeypatch.setenv("EVERYO_WORLD_SIZE", "1")
    monkeypatch.setenv("EVERYO_TIMEOUT", "12")
    with eo.distributed.init() as group:
        assert (group.backend, group.rank, group.world_size, group.timeout) == ("shm", 0, 1, 12.0)


def test_init_errors_name_the_problem(monkeypatch):
    monkeypatch.delenv("EVERYO_BACKEND", raising=False)
    with pytest.raises(DistributedError, match="EVERYO_BACKEND"):
        eo.distributed.init()
    with pytest.raises(DistributedError, match="unknown process-group backend 'nccl'.*shm"):
        eo.distributed.init(backend="nccl")
    with pytest.raises(DistributedError, match="needs the name of its shared segment"):
        eo.distributed.init(backend="shm", rank=0, world_size=2)


def test_worker_environment_keeps_user_settings():
    env = blas.worker_environment({"OMP_NUM_THREADS": "3", "PATH": "/bin"})
    assert env["OMP_NUM_THREADS"] == "3" and env["PATH"] == "/bin"
    assert all(env[v] == "1" for v in blas.BLAS_THREAD_VARIABLES if v != "OMP_NUM_THREADS")


def test_spawned_workers_get_one_blas_thread(monkeypatch):
    for variable in blas.BLAS_THREAD_VARIABLES:
        monkeypatch.delenv(variable, raising=False)
    pools = eo.distributed.spawn(dist_workers.report_blas_pools, 2)
    assert pools and all(threads == [1] * len(threads) for threads in pools)


def test_warns_when_several_workers_run_threaded_blas(monkeypatch):
    monkeypatch.setattr(blas, "blas_thread_pools", lambda: [("openblas", 4)])
    with pytest.warns(blas.BlasOversubscriptionWarning, match="2 workers on 2 cores.*4 threads"):
        assert blas.warn_if_oversubscribed(2, cores=2)
    assert not blas.warn_if_oversubscribed(1, cores=2)
    monkeypatch.setattr(blas, "blas_thread_pools", lambda: [("openblas", 1)])
    assert not blas.warn_if_oversubscribed(4, cores=2)


def test_a_user_override_is_reported_from_the_workers(monkeypatch, capfd):
    monkeypatch.setenv("OPENBLAS_NUM_THREADS", "2")
    monkeypatch.setenv("OMP_NUM_THREADS", "2")
    pools = eo.distributed.spawn(dist_workers.report_blas_pools, 2)
    if not any(threads > 1 for rank_pools in pools for threads in rank_pools):
        pytest.skip("this NumPy's BLAS ignores the thread variables")
    assert "BlasOversubscriptionWarning" in capfd.readouterr().err


def test_init_warns_once_per_machine_about_threaded_blas(monkeypatch):
    monkeypatch.setattr(blas, "blas_thread_pools", lambda: [("openblas", 2)])
    monkeypatch.setenv("EVERYO_LOCAL_WORLD_SIZE", "2")
    monkeypatch.setenv("EVERYO_LOCAL_RANK", "0")
    with pytest.warns(blas.BlasOversubscriptionWarning):
        eo.distributed.init(backend="shm", rank=0, world_size=1).close()
    monkeypatch.setenv("EVERYO_LOCAL_RANK", "1")  # not the first rank of this machine: quiet
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eo.distributed.init(backend="shm", rank=0, world_size=1).close()


RANK_SCRIPT = """
import numpy as np, everyo as eo
with eo.distributed.init() as group:
    total = group.all_reduce_sum(np.float64([group.rank + 1.0]))
    print(group.backend, group.rank, group.world_size, total[0])
"""


def test_shm_processes_started_elsewhere_meet_through_init(clean_shm):
    """What a launcher does: start processes itself, describe the group in EVERYO_* variables."""
    from everyo_dist.backends.shm.segments import new_job_id, segment_name

    segment = segment_name(new_job_id(), "ctl")
    env = dict(os.environ, EVERYO_BACKEND="shm", EVERYO_WORLD_SIZE="2", EVERYO_TIMEOUT="60",
               EVERYO_SHM_SEGMENT=segment)
    ranks = [subprocess.Popen([sys.executable, "-c", RANK_SCRIPT], stdout=subprocess.PIPE,
                              text=True, env=dict(env, EVERYO_RANK=str(rank)))
             for rank in (1, 0)]  # rank 1 first: it must wait for rank 0 to create the segment
    outputs = [process.communicate(timeout=60)[0].split() for process in ranks]
    assert all(process.returncode == 0 for process in ranks)
    assert sorted(outputs) == [["shm", "0", "2", "3.0"], ["shm", "1", "2", "3.0"]]


def test_shm_refuses_cpus_whose_store_ordering_it_does_not_cover():
    from everyo_dist.backends.shm.group import check_store_ordering
    from everyo_dist.errors import DistributedError

    check_store_ordering(4, machine="x86_64")
    check_store_ordering(1, machine="aarch64")  # one rank shares nothing
    with pytest.raises(DistributedError, match="'aarch64'.*backend='tcp'"):
        check_store_ordering(2, machine="aarch64")


def test_shm_ranks_wait_for_rank_0_whatever_pid_the_segment_name_carries(clean_shm):
    """A launcher may build the name in a helper process that has exited since: rank 0 creates
    the segment, so the others wait for it even when the pid in its name is dead."""
    from everyo_dist.backends.shm.segments import new_job_id, segment_name

    helper = subprocess.Popen([sys.executable, "-c", "pass"])
    helper.wait()
    segment = segment_name(new_job_id(), "ctl", owner_pid=helper.pid)
    env = dict(os.environ, EVERYO_BACKEND="shm", EVERYO_WORLD_SIZE="2", EVERYO_TIMEOUT="20",
               EVERYO_SHM_SEGMENT=segment)
    late = "import time; time.sleep(1.5)\n" + RANK_SCRIPT  # rank 0 creates it a while later
    ranks = [subprocess.Popen([sys.executable, "-c", script], stdout=subprocess.PIPE,
                              stderr=subprocess.PIPE, text=True,
                              env=dict(env, EVERYO_RANK=str(rank)))
             for rank, script in ((1, RANK_SCRIPT), (0, late))]
    outputs = [process.communicate(timeout=60) for process in ranks]
    assert all(process.returncode == 0 for process in ranks), [err for _, err in outputs]
    assert sorted(out.split() for out, _ in outputs) == [["shm", "0", "2", "3.0"],
                                                         ["shm", "1", "2", "3.0"]]
