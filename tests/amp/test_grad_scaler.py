"""eo.GradScaler: scaling, skipped steps, the dynamic scale, checkpoints and misuse."""

from __future__ import annotations

import threading
import warnings

import numpy as np
import pytest
from amp_workers import amp_loss, batch, lockstep_rank, lockstep_worker, mlp

import everyo as eo


def snapshot(model, optimizer):
    weights = {k: v.copy() for k, v in model.state_dict().items()}
    state = optimizer.state_dict()
    return weights, state


def assert_same_snapshot(a, b):
    (wa, sa), (wb, sb) = a, b
    assert wa.keys() == wb.keys()
    for k in wa:
        np.testing.assert_array_equal(wa[k], wb[k])
    assert sa["step_count"] == sb["step_count"]
    assert sa["state"].keys() == sb["state"].keys()
    for index in sa["state"]:
        da, db = sa["state"][index], sb["state"][index]
        assert da.keys() == db.keys()
        for k in da:
            np.testing.assert_array_equal(da[k], db[k])


def test_pytorch_defaults():
    scaler = eo.GradScaler()
    assert scaler.get_scale() == 2.0**16
    assert scaler.get_growth_factor() == 2.0
    assert scaler.get_backoff_factor() == 0.5
    assert scaler.get_growth_interval() == 2000
    assert scaler.is_enabled()


def test_scaled_then_unscaled_gradients_equal_plain_ones():
    x, y = batch()
    plain, scaled = mlp(), mlp()
    loss = ((plain(x) - y) ** 2).mean()
    loss.backward()
    optimizer = eo.SGD(list(scaled.parameters()), lr=0.1)
    scaler = eo.GradScaler(init_scale=1024.0)
    scaler.backward(((scaled(x) - y) ** 2).mean())
    first = next(scaled.parameters())
    np.testing.assert_allclose(first.grad, 1024.0 * next(plain.parameters()).grad, rtol=1e-5)
    scaler.unscale_(optimizer)
    for p, q in zip(scaled.parameters(), plain.parameters()):
        np.testing.assert_allclose(p.grad, q.grad, rtol=1e-5, atol=1e-8)
    assert scaler.step(optimizer) is True  # no second unscale inside step
    for p, q in zip(scaled.parameters(), plain.parameters()):
        np.testing.assert_allclose(p.data, q.data - 0.1 * q.grad, rtol=1e-5, atol=1e-7)


def test_overflow_skips_the_step_and_halves_the_scale():
    model, (x, y) = mlp(), batch()
    optimizer = eo.Adam(list(model.parameters()), lr=1e-2)
    scaler = eo.GradScaler(init_scale=2.0**10)
    scaler.backward(amp_loss(model, x, y))  # one clean step so Adam has state to protect
    assert scaler.step(optimizer) is True
    scaler.update()
    assert scaler.get_scale() == 2.0**10

    before = snapshot(model, optimizer)
    optimizer.zero_grad()
    scaler.update(new_scale=2.0**40)  # float16 gradients overflow at 65504
    scaler.backward(amp_loss(model, x, y))
    assert any(not np.all(np.isfinite(p.grad)) for p in model.parameters())
    assert scaler.step(optimizer) is False
    scaler.update()
    assert scaler.get_scale() == 2.0**39
    assert_same_snapshot(before, snapshot(model, optimizer))


@pytest.mark.parametrize("bad", [np.inf, -np.inf, np.nan])
def test_one_bad_element_in_any_gradient_skips(bad):
    model = mlp()
    params = list(model.parameters())
    optimizer = eo.SGD(params, lr=0.1, momentum=0.9)
    scaler = eo.GradScaler(init_scale=8.0)
    for p in params:
        p.grad = np.ones_like(p.data)
    params[-1].grad[0] = bad  # only the last gradient of the last parameter
    before = snapshot(model, optimizer)
    assert scaler.step(optimizer) is False
    scaler.update()
    assert scaler.get_scale() == 4.0
    assert_same_snapshot(before, snapshot(model, optimizer))


def test_scale_grows_after_growth_interval_clean_steps():
    model, (x, y) = mlp(), batch()
    optimizer = eo.SGD(list(model.parameters()), lr=1e-3)
    scaler = eo.GradScaler(init_scale=4.0, growth_interval=3)
    scales = []
    for _ in range(7):
        optimizer.zero_grad()
        scaler.backward(amp_loss(model, x, y))
        assert scaler.step(optimizer)
        scaler.update()
        scales.append(scaler.get_scale())
    assert scales == [4.0, 4.0, 8.0, 8.0, 8.0, 16.0, 16.0]


def test_an_overflow_resets_the_growth_tracker():
    param = eo.Parameter([1.0])
    optimizer = eo.SGD([param], lr=0.1)
    scaler = eo.GradScaler(init_scale=4.0, growth_interval=2)
    for grad in (1.0, np.inf, 1.0, 1.0):
        param.grad = np.array([grad], np.float32)
        scaler.step(optimizer)
        scaler.update()
    # clean (tracker 1), overflow (scale 2, tracker 0), clean, clean (scale 4)
    assert scaler.get_scale() == 4.0


def test_unscale_twice_is_a_clear_error():
    model, (x, y) = mlp(), batch()
    optimizer = eo.SGD(list(model.parameters()), lr=0.1)
    scaler = eo.GradScaler()
    scaler.backward(amp_loss(model, x, y))
    scaler.unscale_(optimizer)
    with pytest.raises(eo.EveryOError, match="unscale_\\(\\) has already been called"):
        scaler.unscale_(optimizer)
    scaler.step(optimizer)
    with pytest.raises(eo.EveryOError, match="step\\(\\) has already been called"):
        scaler.step(optimizer)
    scaler.update()
    optimizer.zero_grad()
    scaler.backward(amp_loss(model, x, y))
    scaler.unscale_(optimizer)  # allowed again after update()


def test_update_without_a_step_is_a_clear_error():
    with pytest.raises(eo.EveryOError, match="no step"):
        eo.GradScaler().update()


@pytest.mark.parametrize("kwargs, match", [
    ({"init_scale": 0.0}, "init_scale"), ({"growth_factor": 1.0}, "growth_factor"),
    ({"backoff_factor": 1.5}, "backoff_factor"), ({"growth_interval": 0}, "growth_interval"),
    ({"group": object()}, "all_reduce_sum"),
])
def test_bad_arguments_are_named(kwargs, match):
    with pytest.raises(eo.EveryOError, match=match):
        eo.GradScaler(**kwargs)


def test_state_dict_resume_matches_an_uninterrupted_run():
    def run(steps, scaler):
        param = eo.Parameter([1.0])
        optimizer = eo.SGD([param], lr=0.0)
        for i in range(steps):
            param.grad = np.array([np.inf if i == 1 else 1.0], np.float32)
            scaler.step(optimizer)
            scaler.update()
        return scaler

    uninterrupted = run(6, eo.GradScaler(init_scale=16.0, growth_interval=3))
    first = run(4, eo.GradScaler(init_scale=16.0, growth_interval=3))
    state = first.state_dict()
    assert state["scale"] == 8.0 and state["_growth_tracker"] == 2
    resumed = eo.GradScaler()
    resumed.load_state_dict(state)
    assert resumed.get_growth_interval() == 3
    param = eo.Parameter([1.0])
    optimizer = eo.SGD([param], lr=0.0)
    for _ in range(2):
        param.grad = np.array([1.0], np.float32)
        resumed.step(optimizer)
        resumed.update()
    assert resumed.state_dict() == uninterrupted.state_dict()
    assert resumed.get_scale() == 16.0  # grew on the 3rd clean step after the overflow


def test_state_dict_survives_save_and_load(tmp_path):
    scaler = eo.GradScaler(init_scale=512.0, growth_interval=7)
    param = eo.Parameter([1.0])
    param.grad = np.array([1.0], np.float32)
    scaler.step(eo.SGD([param], lr=0.0))
    scaler.update()
    path = tmp_path / "scaler.npz"
    eo.save({k: v if isinstance(v, str) else np.asarray(v) for k, v in scaler.state_dict().items()},
            path)
    restored = eo.GradScaler()
    restored.load_state_dict(eo.load(path))
    assert restored.state_dict() == scaler.state_dict()


def test_load_state_dict_refuses_an_empty_state():
    with pytest.raises(eo.EveryOError, match="empty"):
        eo.GradScaler().load_state_dict(eo.GradScaler(enabled=False).state_dict())


def test_backward_suppresses_overflow_warnings_scale_backward_does_not():
    def overflowing_loss():
        w = eo.Parameter(np.full((4, 4), 100.0, np.float32))
        with eo.autocast():
            out = eo.ones(4, 4) @ w
        return w, (out.astype("float32") ** 2).sum()

    scaler = eo.GradScaler(init_scale=2.0**30)
    w, loss = overflowing_loss()
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        scaler.backward(loss)
    assert not np.all(np.isfinite(w.grad))
    w, loss = overflowing_loss()
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        scaler.scale(loss).backward()
    assert any("overflow" in str(w.message) for w in caught)


def test_disabled_scaler_is_a_pass_through():
    param = eo.Parameter([1.0])
    optimizer = eo.SGD([param], lr=0.5)
    scaler = eo.GradScaler(enabled=False)
    loss = (param * param).sum()
    assert scaler.scale(loss) is loss
    scaler.backward(loss)
    assert scaler.step(optimizer) is True
    scaler.update()
    np.testing.assert_array_equal(param.data, [0.0])
    assert scaler.get_scale() == 1.0 and scaler.state_dict() == {}


def test_scale_accepts_lists_and_refuses_other_things():
    scaler = eo.GradScaler(init_scale=4.0)
    a, b = scaler.scale([eo.ones(1), eo.ones(1)])
    assert a.item() == b.item() == 4.0
    with pytest.raises(eo.EveryOError, match="Tensor"):
        scaler.scale(3.0)


def test_a_float16_loss_is_scaled_in_float32():
    loss = eo.full(1, fill_value=2.0, dtype="float16", requires_grad=True)
    scaled = eo.GradScaler().scale(loss)  # 2 * 65536 overflows float16
    assert scaled.dtype == "float32" and scaled.item() == 2.0**17



def test_float16_gradients_are_unscaled_through_float32():
    # Regression: the inverse scale was rounded to float16 first; from a scale of 2**25 on it
    # is below float16's smallest subnormal, so unscale_ zeroed every float16 gradient.
    w = eo.Parameter(np.zeros(3, np.float16))
    w.grad = np.full(3, 2.0**14, np.float16)  # a true gradient of 2**-12 scaled by 2**26
    scaler = eo.GradScaler(init_scale=2.0**26)
    scaler.unscale_(eo.SGD([w], lr=0.1))
    assert w.grad.dtype == np.float16
    np.testing.assert_array_equal(w.grad, np.full(3, 2.0**-12, np.float16))


# -- data parallel: the inf/NaN decision is shared ------------------------------------------------

class ThreadGroup:
    """An in-process stand-in for a process group: ranks are threads, all_reduce_sum is real."""

    def __init__(self, world_size):
        self.world_size = world_size
        self.barrier = threading.Barrier(world_size, timeout=30)
        self.slots = [None] * world_size
        self.calls = [0] * world_size

    def rank_view(self, rank):
        group = self

        class View:
            def all_reduce_sum(self, array):
                group.calls[rank] += 1
                group.slots[rank] = np.array(array, dtype=np.float64)
                group.barrier.wait()
                total = np.sum(group.slots, axis=0)
                group.barrier.wait()
                return total

        return View()


EXPECTED_APPLIED = [True, True, False, True, True]
EXPECTED_SCALES = [256.0, 512.0, 256.0, 256.0, 512.0]


def test_lockstep_skip_across_ranks_with_an_in_process_group():
    group = ThreadGroup(2)
    results = [None, None]

    def worker(rank):
        results[rank] = lockstep_rank(group.rank_view(rank), rank, 5, {(1, 2)})

    threads = [threading.Thread(target=worker, args=(r,)) for r in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    (applied0, scales0, _), (applied1, scales1, _) = results
    assert applied0 == applied1 == EXPECTED_APPLIED
    assert scales0 == scales1 == EXPECTED_SCALES
    assert group.calls == [5, 5]


def test_without_a_group_only_the_bad_rank_skips():
    (applied0, scales0, _), (applied1, scales1, _) = (
        lockstep_rank(None, rank, 5, {(1, 2)}) for rank in (0, 1))
    assert applied0 == [True] * 5 and applied1 == EXPECTED_APPLIED
    assert scales0 != scales1  # what the group prevents


def test_lockstep_skip_across_two_worker_processes():
    from everyo.distributed import spawn

    results = spawn(lockstep_worker, 2, args=(5, {(1, 2)}), timeout=60)
    (applied0, scales0, weights0), (applied1, scales1, weights1) = results
    assert applied0 == applied1 == EXPECTED_APPLIED
    assert scales0 == scales1 == EXPECTED_SCALES
    # rank 0's NaN-free gradients were not applied on step 2 either: its weights equal a
    # single-process run that skips step 2
    (_, _, alone) = lockstep_rank(_AlwaysSkipAt(2), 0, 5, set())
    for a, b in zip(weights0, alone):
        np.testing.assert_array_equal(a, b)


class _AlwaysSkipAt:
    """A one-rank 'group' whose other (imaginary) rank votes inf on one step."""

    def __init__(self, step):
        self.step, self.calls = step, 0

    def all_reduce_sum(self, array):
        vote = 1.0 if self.calls == self.step else 0.0
        self.calls += 1
        return np.asarray(array) + vote
