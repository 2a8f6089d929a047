"""DistributedDataParallel's constructor gives every rank rank 0's parameters and buffers (as
PyTorch's ``_sync_module_states``): ranks that built their models from different seeds start
from the same state, bit for bit, and train identically (shm, tcp, tcp_hierarchical, mpi)."""

from __future__ import annotations

import numpy as np
import pytest
from ddp_mpi_harness import MPIEXEC, run_under_mpiexec

import everyo as eo
from everyo.distributed import DistributedDataParallel, init, spawn


def _check_rank_0s_state_everywhere(results):
    first, second = results
    names = [key.split(":", 1)[1] for key in first if key.startswith("before:")]
    assert {"norm.running_mean", "norm.running_var", "norm.num_batches_tracked", "table",
            "mask", "frozen.weight", "offset"} <= set(names)
    for name in names:
        rank0 = first[f"before:{name}"]
        # (the test's premise: every state differs between the ranks before wrapping)
        assert rank0.tobytes() != second[f"before:{name}"].tobytes(), name
        for result in results:
            after = result[f"after:{name}"]
            assert after.dtype == rank0.dtype and after.shape == rank0.shape, name
            assert after.tobytes() == rank0.tobytes(), name
    # a parameter written in place has its version bumped (a graph that saved it must see it)
    assert not first["versions"].any() and (second["versions"] == 1).all()
    trained = [key for key in first if key.startswith("trained:")]
    assert len(trained) == 9
    for key in trained:
        assert first[key].tobytes() == second[key].tobytes(), key
    assert first["trained:first.weight"].tobytes() != first["after:first.weight"].tobytes()


@pytest.mark.parametrize("backend", ["shm", "tcp", "tcp_hierarchical"])
def test_ranks_built_from_different_seeds_start_from_rank_0s_state(backend):
    from ddp_workers import different_seeds

    _check_rank_0s_state_everywhere(spawn(different_seeds, 2, backend=backend, timeout=60))


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found (pip install "
                                            "'everyo-dist[mpi]')")
def test_ranks_built_from_different_seeds_start_from_rank_0s_state_on_mpi(tmp_path):
    pytest.importorskip("mpi4py")
    _check_rank_0s_state_everywhere(run_under_mpiexec("different_seeds", tmp_path))


def test_modules_that_differ_between_ranks_are_refused_when_wrapped():
    from ddp_workers import different_modules

    for message in spawn(different_modules, 2, timeout=60):
        assert "DistributedDataParallel" in message and "differ" in message
        assert "float32[15]" in message and "float32[20]" in message


def test_a_single_rank_wrapper_runs_no_collective():
    with init(backend="shm", rank=0, world_size=1) as group:
        def refuse(*args, **kwargs):
            raise AssertionError("a collective on a group of one")

        group.broadcast = refuse
        model = eo.Linear(2, 1, seed=0)
        before = model.weight.data
        ddp = DistributedDataParallel(model, group)
        assert model.weight.data is before and model.weight._version == 0
        ddp.close()
