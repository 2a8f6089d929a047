"""``DistributedDataParallel(module, group, optimizer=opt)``: each bucket is stepped inside
backward as its averages land; the trajectory is bit for bit ``opt.step()`` after an
un-overlapped DDP backward (SGD, momentum, Nesterov, Adam, AdamW + AMSGrad, parameter groups,
an LR scheduler, no_sync accumulation, an input that requires grad) on shm, tcp,
tcp_hierarchical and mpi, with PowerSGD too; and the refusals."""

from __future__ import annotations

import numpy as np
import pytest
from ddp_mpi_harness import MPIEXEC, run_under_mpiexec

import everyo as eo
from everyo.distributed import DistributedDataParallel, DistributedError, init, spawn

OPTIMIZERS = ["sgd", "momentum", "nesterov", "adam", "adamw", "groups"]


def _same_bits(first, second):
    assert len(first) == len(second)
    for a, b in zip(first, second):
        assert a.dtype == b.dtype and a.tobytes() == b.tobytes()


@pytest.mark.parametrize("name", [pytest.param(name, marks=pytest.mark.kernel_provider)
                                  if name == "adam" else name for name in OPTIMIZERS])
def test_the_overlapped_step_is_the_optimizers_step_bit_for_bit_on_shm(name):
    from ddp_workers import train_overlapped

    overlapped = spawn(train_overlapped, 2, args=(name, True), timeout=60)
    reference = spawn(train_overlapped, 2, args=(name, False), timeout=60)
    for rank in range(2):
        _same_bits(overlapped[rank], reference[rank])
    _same_bits(overlapped[0], overlapped[1])


@pytest.mark.parametrize("name, backend", [("nesterov", "tcp"), ("adamw", "tcp"),
                                           ("groups", "tcp_hierarchical")])
def test_the_overlapped_step_is_the_optimizers_step_bit_for_bit_on_tcp(name, backend):
    from ddp_workers import train_overlapped

    overlapped = spawn(train_overlapped, 2, args=(name, True), backend=backend, timeout=60)
    reference = spawn(train_overlapped, 2, args=(name, False), backend=backend, timeout=60)
    for rank in range(2):
        _same_bits(overlapped[rank], reference[rank])


def test_an_input_that_requires_grad_gets_its_gradient_from_the_weights_before_the_step():
    # the first layer's weight is the step's last gradient, and its op still computes the
    # input's gradient from it: that bucket is stepped only once the op is done
    from ddp_workers import train_overlapped

    overlapped = spawn(train_overlapped, 2, args=("momentum", True, 3, 1, True), timeout=60)
    reference = spawn(train_overlapped, 2, args=("momentum", False, 3, 1, True), timeout=60)
    for rank in range(2):
        _same_bits(overlapped[rank], reference[rank])


def test_the_overlapped_step_with_powersgd_is_the_optimizers_step_after_it():
    from ddp_workers import train_overlapped

    overlapped = spawn(train_overlapped, 2, args=("momentum", True, 4, 2, False, 0.005, True),
                       timeout=60)
    reference = spawn(train_overlapped, 2, args=("momentum", False, 4, 2, False, 0.005, True),
                      timeout=60)
    for rank in range(2):
        _same_bits(overlapped[rank], reference[rank])
    _same_bits(overlapped[0], overlapped[1])


@pytest.mark.skipif(MPIEXEC is None, reason="mpiexec not found (pip install "
                                            "'everyo-dist[mpi]')")
def test_the_overlapped_step_is_the_optimizers_step_bit_for_bit_on_mpi(tmp_path):
    pytest.importorskip("mpi4py")
    for result in run_under_mpiexec("overlapped_against_reference", tmp_path, "adam"):
        for i in range(len(result) // 2):
            assert result[f"overlapped{i}"].tobytes() == result[f"reference{i}"].tobytes()


def _model():
    return eo.Sequential(eo.Linear(3, 4, seed=0), eo.Tanh(), eo.Linear(4, 2, seed=1))


def test_a_later_optimizer_step_is_refused_by_name_and_close_gives_it_back():
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _model()
        optimizer = eo.SGD(model.parameters(), lr=0.1)
        ddp = DistributedDataParallel(model, group, optimizer=optimizer)
        before = model[0].weight.data.copy()
        ddp(eo.ones((2, 3))).sum().backward()
        assert not np.array_equal(before, model[0].weight.data) and optimizer.step_count == 1
        with pytest.raises(DistributedError, match=r"SGD\.step\(\).*already stepped"):
            optimizer.step()
        ddp.close()
        optimizer.step()  # a plain optimizer again


def test_an_optimizer_of_other_parameters_is_refused_by_name():
    with init(backend="shm", rank=0, world_size=1) as group:
        stranger = eo.Parameter(np.zeros((5, 5), np.float32))
        model = _model()
        optimizer = eo.SGD([*model.parameters(), stranger], lr=0.1)
        with pytest.raises(DistributedError, match=r"\[4\] \(shapes \(5, 5\)\) are not "
                                                   r"parameters of the wrapped module"):
            DistributedDataParallel(model, group, optimizer=optimizer)
        with pytest.raises(DistributedError, match="everyo optimizer"):
            DistributedDataParallel(model, group, optimizer="sgd")


def test_an_optimizer_with_its_own_step_is_refused_by_name():
    class Stepper(eo.SGD):
        def step(self, closure=None):  # a closure, a global decision: not per bucket
            return super().step()

    with init(backend="shm", rank=0, world_size=1) as group:
        model = _model()
        with pytest.raises(DistributedError, match="Stepper has its own step"):
            DistributedDataParallel(model, group, optimizer=Stepper(model.parameters(), lr=1))


def test_no_sync_micro_batches_do_not_step():
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _model()
        optimizer = eo.SGD(model.parameters(), lr=0.1)
        ddp = DistributedDataParallel(model, group, optimizer=optimizer)
        before = model[0].weight.data.copy()
        with ddp.no_sync():
            ddp(eo.ones((2, 3))).sum().backward()
        assert np.array_equal(before, model[0].weight.data) and optimizer.step_count == 0
        ddp(eo.ones((2, 3))).sum().backward()
        assert optimizer.step_count == 1
        ddp.close()


def test_a_grad_scaler_step_after_an_overlapped_backward_is_refused_by_name():
    # (its skip-on-overflow needs every bucket before the step: it takes the un-overlapped
    # path, without optimizer=)
    pytest.importorskip("everyo_amp")
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _model()
        optimizer = eo.SGD(model.parameters(), lr=0.1)
        ddp = DistributedDataParallel(model, group, optimizer=optimizer)
        scaler = eo.GradScaler(init_scale=4.0)
        try:
            scaler.scale(ddp(eo.ones((2, 3))).sum()).backward()
            with pytest.raises(DistributedError, match=r"SGD\.step\(\).*GradScaler"):
                scaler.step(optimizer)
        finally:
            ddp.close()


def test_a_step_left_waiting_by_a_failed_backward_is_named_at_the_next_forward():
    # the first layer's bucket waits for the input's gradient (its op still needs the weight);
    # a hook of the user's on the input fails first, so that step never runs
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _model()
        optimizer = eo.SGD(model.parameters(), lr=0.1)
        ddp = DistributedDataParallel(model, group, optimizer=optimizer)
        x = eo.tensor(np.ones((2, 3), np.float32), requires_grad=True)

        def failing(grad):
            raise ValueError("the user's hook fails")

        x.register_hook(failing)
        try:
            with pytest.raises(ValueError, match="user's hook"):
                ddp(x).sum().backward()
            with pytest.raises(DistributedError, match=r"never finished.*0\.(weight|bias)"):
                ddp(eo.ones((2, 3)))
        finally:
            ddp.close()


def test_clipping_gradients_an_overlapped_backward_already_applied_is_refused_by_name():
    # clip_grad_norm_ after backward would scale gradients the step has already used: the
    # clipped result the loop asks for would silently not happen
    with init(backend="shm", rank=0, world_size=1) as group:
        model = _model()
        optimizer = eo.SGD(model.parameters(), lr=0.1)
        ddp = DistributedDataParallel(model, group, optimizer=optimizer)
        try:
            ddp(eo.ones((2, 3))).sum().backward()
            with pytest.raises(eo.EveryOError, match=r"clip_grad_norm_.*already applied.*"
                                                     r"optimizer="):
                eo.clip_grad_norm_(model.parameters(), max_norm=0.01)
            optimizer.zero_grad()
            model[0].weight.grad = np.ones_like(model[0].weight.data)  # a fresh gradient
            assert eo.clip_grad_norm_(model.parameters(), max_norm=100.0) > 0
        finally:
            ddp.close()
        # without optimizer= (the un-overlapped path) clipping works as always
        ddp = DistributedDataParallel(model, group)
        try:
            ddp(eo.ones((2, 3))).sum().backward()
            assert eo.clip_grad_norm_(model.parameters(), max_norm=0.01) > 0.01
        finally:
            ddp.close()
