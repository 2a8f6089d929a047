"""Every core op: analytic gradients against central differences in float64, and forward and
gradients against PyTorch where it is installed."""

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
    arrays = _inputs(builders, seed=3)
    ours = [eo.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    out = fn(*ours)
    expected = torch_fn(*theirs)
    np.testing.assert_allclose(out.data, expected.detach().numpy(), rtol=1e-12, atol=1e-12)
    weights = np.random.default_rng(1).standard_normal(out.shape)
    (out * weights).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    for ours_t, theirs_t in zip(ours, theirs):
        np.testing.assert_allclose(ours_t.grad, theirs_t.grad.numpy(), rtol=1e-10, atol=1e-12)


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
