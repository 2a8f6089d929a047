"""``ZeroRedundancyOptimizer`` (ZeRO-1): bit-identical trajectories to the unsharded optimizer
on shm, tcp, tcp_hierarchical and mpi at 2, 3 and 4 ranks; per-rank state ≈ 1/world_size; one consolidated
checkpoint resumes sharded and unsharded runs at another world size; refusals."""

from __future__ import annotations

import numpy as np
import pytest
from ddp_mpi_harness import MPIEXEC, run_under_mpiexec

import everyo as eo
from everyo.distributed import DistributedError, ZeroRedundancyOptimizer, init, spawn


def _same_bits(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name, world, backend", [
    pytest.param("groups", 2, "shm", marks=pytest.mark.kernel_provider), ("momentum", 3, "shm"),
    ("adamw", 4, "shm"), ("groups", 2, "tcp"), ("momentum", 2, "tcp_hierarchical")])
def test_sharded_training_is_the_unsharded_trajectory_bit_for_bit(name, world, backend):
    from ddp_workers import train_zero

    sharded = spawn(train_zero, world, args=(name, True), backend=backend, timeout=90)
    plain = spawn(train_zero, world, args=(name, False), backend=backend, timeout=90)
    for rank in range(world):
        _same_bits(sharded[rank], plain[rank])


@pytest.mark.parametrize("name, world", [("groups", 2), ("momentum", 3)])
def test_sharded_and_stepped_inside_backward_is_the_unsharded_trajectory(name, world):
    # DistributedDataParallel(optimizer=zero): each rank steps its partition of each bucket
    # as the bucket lands, then the parameters are all-gathered
    from ddp_workers import train_zero

    overlapped = spawn(train_zero, world, args=(name, True, 4, "", "", True, True), timeout=90)
    plain = spawn(train_zero, world, args=(name, False), timeout=90)
    for rank in range(world):
        _same_bits(overlapped[rank], plain[rank])


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found (pip install "
                                            "'everyo-dist[mpi]')")
def test_sharded_training_is_the_unsharded_trajectory_bit_for_bit_on_mpi(tmp_path):
    pytest.importorskip("mpi4py")
    for result in run_under_mpiexec("zero_against_plain", tmp_path, "groups"):
        for i in range(len(result) // 2):
            assert result[f"sharded{i}"].tobytes() == result[f"plain{i}"].tobytes()


@pytest.mark.parametrize("world, bound", [(2, 0.55), (4, 0.30)])
def test_each_rank_keeps_about_one_world_sizeth_of_the_state(world, bound):
    from ddp_workers import zero_state_bytes

    for sharded, plain in spawn(zero_state_bytes, world, timeout=60):
        assert sharded / plain <= bound, (sharded, plain)


@pytest.mark.parametrize("resume_sharded", [True, False])
def test_a_consolidated_checkpoint_resumes_bit_identically_sharded_or_not(tmp_path,
                                                                          resume_sharded):
    from ddp_workers import train_zero

    path = str(tmp_path / "checkpoint.eo")
    uninterrupted = spawn(train_zero, 2, args=("groups", True, 4, path), timeout=90)
    resumed = spawn(train_zero, 2, args=("groups", True, 4, "", path, resume_sharded),
                    timeout=90)
    for rank in range(2):
        _same_bits(resumed[rank], uninterrupted[rank])


@pytest.mark.parametrize("saved_world, resumed_world", [(2, 3), (4, 2)])
def test_a_consolidated_checkpoint_loads_at_another_world_size(tmp_path, saved_world,
                                                               resumed_world):
    # (the data per rank change with the world size: the reference is the unsharded optimizer
    # resumed from the same file at the new world size)
    from ddp_workers import train_zero

    path = str(tmp_path / "checkpoint.eo")
    spawn(train_zero, saved_world, args=("groups", True, 4, path), timeout=90)
    resumed = spawn(train_zero, resumed_world, args=("groups", True, 4, "", path, True),
                    timeout=90)
    reference = spawn(train_zero, resumed_world, args=("groups", False, 4, "", path, False),
                      timeout=90)
    for rank in range(resumed_world):
        _same_bits(resumed[rank], reference[rank])


def test_the_consolidated_state_is_the_unsharded_optimizers():
    from ddp_workers import SmallNet

    with init(backend="shm", rank=0, world_size=1) as group:
        model = SmallNet()
        zero = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=eo.Adam,
                                       group=group, lr=1e-2)
        plain_model = SmallNet()
        plain = eo.Adam(plain_model.parameters(), lr=1e-2)
        for p, q in zip(model.parameters(), plain_model.parameters()):
            p.grad = q.grad = np.ones_like(p.data)
        zero.step()
        plain.step()
        with pytest.raises(DistributedError, match="consolidate_state_dict"):
            zero.state_dict()
        zero.consolidate_state_dict(to=0)
        ours, theirs = zero.state_dict(), plain.state_dict()
    assert ours["type"] == "Adam" and ours["param_groups"] == theirs["param_groups"]
    assert ours["state"].keys() == theirs["state"].keys()
    for index, buffers in theirs["state"].items():
        for key, value in buffers.items():
            assert np.array_equal(ours["state"][index][key], value), (index, key)


def test_ranks_with_different_parameters_are_refused_on_every_rank():
    from ddp_workers import zero_with_different_parameters

    for message in spawn(zero_with_different_parameters, 2, timeout=60):
        assert "rank(s) [1] have other parameters" in message, message


def test_bad_arguments_are_refused_by_name():
    with init(backend="shm", rank=0, world_size=1) as group:
        w = [eo.Parameter(np.zeros(3, np.float32))]
        with pytest.raises(DistributedError, match="optimizer_class"):
            ZeroRedundancyOptimizer(w, optimizer_class="adam", group=group)
        with pytest.raises(DistributedError, match="process group"):
            ZeroRedundancyOptimizer(w, optimizer_class=eo.Adam, group=None)
        zero = ZeroRedundancyOptimizer(w, optimizer_class=eo.Adam, group=group)
        with pytest.raises(DistributedError, match="to must be a rank"):
            zero.consolidate_state_dict(to=1)


def test_pytorchs_keywords_are_understood_or_refused_by_name():
    # ZeroRedundancyOptimizer(params, optimizer_class, process_group=None,
    # parameters_as_bucket_view=False, overlap_with_ddp=False, **defaults) in PyTorch
    with init(backend="shm", rank=0, world_size=1) as group:
        w = [eo.Parameter(np.ones(3, np.float32))]
        zero = ZeroRedundancyOptimizer(w, eo.SGD, process_group=group, lr=0.5,
                                       parameters_as_bucket_view=False, overlap_with_ddp=False)
        w[0].grad = np.ones(3, np.float32)
        zero.step()
        assert zero.group is group and np.array_equal(w[0].data, np.full(3, 0.5, np.float32))
        with pytest.raises(DistributedError, match="overlap_with_ddp.*optimizer="):
            ZeroRedundancyOptimizer(w, eo.SGD, group=group, lr=1, overlap_with_ddp=True)
        with pytest.raises(DistributedError, match="parameters_as_bucket_view"):
            ZeroRedundancyOptimizer(w, eo.SGD, group=group, lr=1,
                                    parameters_as_bucket_view=True)
        with pytest.raises(DistributedError, match="group= and process_group="):
            ZeroRedundancyOptimizer(w, eo.SGD, group=group, process_group=group, lr=1)
