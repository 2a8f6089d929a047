"""Tensor.register_hook and register_post_accumulate_grad_hook."""

from __future__ import annotations

import gc

import numpy as np
import pytest

import everyo as eo


def test_leaf_hook_sees_the_total_gradient_once_and_may_replace_it():
    x = eo.tensor(np.array([1.0, 2.0]), requires_grad=True)
    seen = []

    def hook(g):
        seen.append(g.copy())
        return g * 10

    x.register_hook(hook)
    (x * 3.0 + x * x).sum().backward()  # two contributions, one total
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], 3.0 + 2 * x.data)
    np.testing.assert_allclose(x.grad, 10 * (3.0 + 2 * x.data))


def test_non_leaf_hook_changes_what_flows_on_even_after_the_tensor_is_gone():
    x = eo.tensor(np.array([1.0, 2.0]), requires_grad=True)

    def forward(x):
        h = x * 2.0
        h.register_hook(lambda g: g + 1.0)
        return h * h  # h goes out of scope here

    y = forward(x)
    gc.collect()
    y.sum().backward()
    np.testing.assert_allclose(x.grad, 2 * (2 * (2 * x.data) + 1.0))


def test_hook_returning_none_keeps_the_gradient_and_remove_unregisters():
    x = eo.tensor(np.ones(2), requires_grad=True)
    calls = []
    handle = x.register_hook(lambda g: calls.append(1))
    (x * 2.0).sum().backward()
    np.testing.assert_allclose(x.grad, [2.0, 2.0])
    handle.remove()
    handle.remove()
    (x * 2.0).sum().backward()
    assert len(calls) == 1


def test_hook_returning_a_wrong_shape_is_an_error():
    x = eo.tensor(np.ones(2), requires_grad=True)
    x.register_hook(lambda g: np.ones(3))
    with pytest.raises(eo.EveryOError, match="hook returned shape \\(3,\\)"):
        (x * 2.0).sum().backward()


def test_hook_on_a_tensor_without_grad_is_refused():
    with pytest.raises(eo.EveryOError, match="does not require grad"):
        eo.ones(2).register_hook(lambda g: g)


def test_tensor_hooks_run_for_eo_grad():
    x = eo.tensor(np.ones(2), requires_grad=True)
    x.register_hook(lambda g: g * 0.5)
    (g,) = eo.grad((x * 4.0).sum(), x)
    np.testing.assert_allclose(g.data, [2.0, 2.0])


def test_a_hook_replacement_under_create_graph_refuses_to_be_differentiated():
    x = eo.tensor(np.array([2.0]), requires_grad=True)
    h = x * x
    h.register_hook(lambda g: g * 3)  # g (= x here) depends on x: the array replacement cannot
    (g,) = eo.grad((h * x).sum(), x, create_graph=True)
    np.testing.assert_allclose(g.data, [3 * 2.0 * 2 * 2.0 + 2.0 ** 2])
    with pytest.raises(eo.EveryOError, match="gradient hook"):
        eo.grad(g.sum(), x)


@pytest.mark.torch
def test_hooks_match_pytorch(torch):
    rng = np.random.default_rng(0)
    a, w = rng.standard_normal((3, 4)), rng.standard_normal((4, 2))

    def run(lib, tensor):
        x, ww = tensor(a), tensor(w)
        h = lib.tanh(x @ ww)
        h.register_hook(lambda g: g * 2)
        ww.register_hook(lambda g: g - 1)
        (h * h).sum().backward()
        return x.grad, ww.grad

    ours = run(eo, lambda v: eo.tensor(v, requires_grad=True))
    theirs = run(torch, lambda v: torch.tensor(v, requires_grad=True))
    for o, t in zip(ours, theirs):
        np.testing.assert_allclose(o, t.numpy(), rtol=1e-12)


# -- post-accumulate-grad hooks ----------------------------------------------------------------

def test_post_accumulate_hook_runs_once_after_the_gradient_is_final():
    w = eo.Parameter(np.array([1.0, 2.0]))
    seen = []
    w.register_post_accumulate_grad_hook(lambda p: seen.append(p.grad.copy()))
    x = eo.tensor(np.array([3.0, 4.0]))
    (w * x + w * w).sum().backward()  # w used by two ops: one call, with the sum
    assert len(seen) == 1
    np.testing.assert_allclose(seen[0], x.data + 2 * w.data)
    (w * x).sum().backward()  # accumulates onto the existing .grad
    np.testing.assert_allclose(seen[1], 2 * x.data + 2 * w.data)


def test_post_accumulate_hooks_follow_the_engine_order_and_can_be_removed():
    layers = [eo.Parameter(np.full(2, i + 1.0)) for i in range(3)]
    order = []
    handles = [p.register_post_accumulate_grad_hook(lambda p, i=i: order.append(i))
               for i, p in enumerate(layers)]
    h = eo.tensor(np.ones(2))
    for p in layers:
        h = eo.tanh(h * p)
    h.sum().backward()
    assert order == [2, 1, 0]  # the last layer's parameter is final first
    handles[1].remove()
    order.clear()
    h = eo.tensor(np.ones(2))
    for p in layers:
        h = eo.tanh(h * p)
    h.sum().backward()
    assert order == [2, 0]


def test_post_accumulate_hook_is_not_called_by_eo_grad_or_for_non_leaves():
    w = eo.Parameter(np.ones(2))
    calls = []
    w.register_post_accumulate_grad_hook(lambda p: calls.append(1))
    eo.grad((w * 2.0).sum(), w)
    assert calls == [] and w.grad is None
    with pytest.raises(eo.EveryOError, match="leaf"):
        (w * 2.0).register_post_accumulate_grad_hook(lambda p: None)


@pytest.mark.torch
def test_post_accumulate_hook_matches_pytorch_call_count(torch):
    def run(lib, make):
        w1, w2 = make(np.ones(3)), make(np.full(3, 0.5))
        calls = []
        for name, p in (("w1", w1), ("w2", w2)):
            p.register_post_accumulate_grad_hook(lambda p, name=name: calls.append(name))
        x = make(np.arange(3.0))
        y = lib.tanh(x * w1) * w2 + w1 * w2
        y.sum().backward()
        return sorted(calls)

    ours = run(eo, lambda v: eo.Parameter(v))
    theirs = run(torch, lambda v: torch.nn.Parameter(torch.tensor(v)))
    assert ours == theirs == ["w1", "w2"]
