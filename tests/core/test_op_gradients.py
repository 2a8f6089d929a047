"""Every core op: analytic gradients against central differences in float64, and forward and
gradients against PyTorch where it is installed; second derivatives the same two ways
(eo.gradgradcheck in float64, torch.autograd.grad(create_graph=True) as the oracle)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.ops import core_ops
from support.op_cases import CASES

IDS = [case[0] for case in CASES]


def _inputs(builders, seed=0):
    rng = np.random.default_rng(seed)
    return [build(rng) for build in builders]


def _leaves(torch, builders, seed):
    """The case's inputs, and the same values as EveryO and PyTorch leaves."""
    arrays = _inputs(builders, seed)
    return (arrays, [eo.tensor(a, requires_grad=True) for a in arrays],
            [torch.tensor(a, requires_grad=True) for a in arrays])


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradcheck(case):
    _, fn, _, builders, *options = case
    for seed in range(2):
        assert eo.gradcheck(fn, *_inputs(builders, seed), **(options[0] if options else {}))


def test_gradcheck_detects_a_wrong_gradient():
    class WrongSquare(eo.Op):
        __slots__ = ()

        def forward(self, x):
            self.saved = x
            return x * x

        def backward(self, g):
            return (g * self.saved,)  # should be 2 * x

    with pytest.raises(eo.GradcheckError, match="analytic"):
        eo.gradcheck(lambda x: WrongSquare.apply(x), np.array([1.0, 2.0]))


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_against_pytorch(case, torch):
    _, fn, torch_fn, builders, *_ = case
    _, ours, theirs = _leaves(torch, builders, seed=3)
    out = fn(*ours)
    expected = torch_fn(*theirs)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = np.random.default_rng(1).standard_normal(out.shape)
    (out * weights).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for ours_t, theirs_t in zip(ours, theirs):
        np.testing.assert_allclose(ours_t.grad, theirs_t.grad.numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_gradgradcheck(case):
    _, fn, _, builders, *options = case
    assert eo.gradgradcheck(fn, *_inputs(builders, 5), **(options[0] if options else {}))


@pytest.mark.torch
@pytest.mark.parametrize("case", CASES, ids=IDS)
def test_second_derivative_against_pytorch(case, torch):
    _, fn, torch_fn, builders, *_ = case
    arrays, ours, theirs = _leaves(torch, builders, seed=7)
    out, expected = fn(*ours), torch_fn(*theirs)
    rng = np.random.default_rng(2)
    v = rng.standard_normal(out.shape)
    v_ours = eo.tensor(v, requires_grad=True)
    v_theirs = torch.tensor(v, requires_grad=True)
    g_ours = eo.grad(out, ours, grad_outputs=v_ours, create_graph=True)
    g_theirs = torch.autograd.grad(expected, theirs, grad_outputs=v_theirs, create_graph=True)
    for a, b in zip(g_ours, g_theirs):
        np.testing.assert_allclose(a.data, b.detach().numpy(), rtol=1e-10, atol=1e-12)
    weights = [rng.standard_normal(a.shape) for a in arrays]
    total_ours = sum(((g * w).sum() for g, w in zip(g_ours, weights)), eo.tensor(np.float64(0)))
    total_theirs = sum((g * torch.tensor(w)).sum() for g, w in zip(g_theirs, weights))
    second_ours = eo.grad(total_ours, ours + [v_ours], allow_unused=True)
    second_theirs = torch.autograd.grad(total_theirs, theirs + [v_theirs], allow_unused=True)
    for a, b, x in zip(second_ours, second_theirs, arrays + [v]):
        a = np.zeros(x.shape) if a is None else a.data
        b = np.zeros(x.shape) if b is None else b.numpy(force=True)
        np.testing.assert_allclose(a, b, rtol=1e-9, atol=1e-11)



def test_every_core_op_is_covered_by_a_case():
    names_used = set()
    for _, fn, _, builders, *_ in CASES:
        recorded = []
        original = eo.dispatch.__globals__["OPS"]
        x = [eo.tensor(a, requires_grad=True) for a in _inputs(builders)]
        out = fn(*x)
        stack = [out._ctx]
        while stack:
            op = stack.pop()
            if op is None:
                continue
            recorded.append(op.name)
            stack.extend(p._ctx for p in op.parents)
        names_used.update(recorded)
        assert original is eo.registry("ops").items
    differentiable = {name for name, cls in core_ops().items() if cls.differentiable}
    assert differentiable - names_used == set()
