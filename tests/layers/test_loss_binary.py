"""BCELoss / binary_cross_entropy on probabilities: PyTorch's values, gradients (input and
target), log clamp at -100 and gradient floor at the edges, weights and reductions; numerical
and second derivatives in float64; bad input named."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.second_order import F, normal, second_order_tests

REDUCTIONS = ["mean", "sum", "none"]


def _probabilities(rng, *shape):
    return rng.uniform(0.05, 0.95, shape)


@pytest.mark.torch
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("weighted", [False, True])
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 1e-5)])
def test_matches_torch(torch, rng, reduction, weighted, dtype, tol):
    x, y = _probabilities(rng, 5, 3).astype(dtype), rng.random((5, 3)).astype(dtype)
    w = rng.uniform(0.5, 2.0, 3).astype(dtype) if weighted else None
    mine = [eo.tensor(x, requires_grad=True), eo.tensor(y, requires_grad=True)]
    theirs = [torch.tensor(x, requires_grad=True), torch.tensor(y, requires_grad=True)]
    out = eo.BCELoss(weight=w, reduction=reduction)(*mine)
    ref = torch.nn.BCELoss(weight=None if w is None else torch.from_numpy(w),
                           reduction=reduction)(*theirs)
    assert out.dtype == dtype
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=tol, atol=tol)
    g = rng.standard_normal(out.shape).astype(dtype)
    out.backward(g if out.ndim else np.asarray(g))
    ref.backward(torch.tensor(g))
    for m, t in zip(mine, theirs):
        np.testing.assert_allclose(m.grad, t.grad.numpy(), rtol=tol * 10, atol=tol * 10)


@pytest.mark.torch
def test_edges_clamp_the_log_at_minus_100_and_floor_the_gradient_as_torch(torch):
    x = np.array([0.0, 1.0, 0.0, 1.0, 1e-50, 0.5])
    y = np.array([1.0, 0.0, 0.0, 1.0, 1.0, 0.3])
    mine, theirs = eo.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out = eo.binary_cross_entropy(mine, eo.tensor(y), reduction="none")
    ref = torch.nn.functional.binary_cross_entropy(theirs, torch.tensor(y), reduction="none")
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=1e-12)
    assert out.data[0] == 100.0 and np.isfinite(out.data).all()
    out.sum().backward()
    ref.sum().backward()
    np.testing.assert_allclose(mine.grad, theirs.grad.numpy(), rtol=1e-12)


def test_without_torch_the_clamp_and_a_known_value():
    out = eo.binary_cross_entropy(eo.tensor([0.0, 0.5]), eo.tensor([1.0, 1.0]), reduction="none")
    np.testing.assert_allclose(out.data, [100.0, np.log(2.0)], rtol=1e-6)
    assert eo.binary_cross_entropy(eo.zeros(0), eo.zeros(0), reduction="sum").item() == 0.0


def test_float16_input_gives_a_float32_loss(rng):
    x = eo.tensor(_probabilities(rng, 4).astype(np.float16))
    assert eo.binary_cross_entropy(x, eo.tensor(np.ones(4, np.float16))).dtype == "float32"


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_gradcheck_input_and_target(rng, reduction):
    w = rng.uniform(0.5, 2.0, 3)
    assert eo.gradcheck(lambda x, y: eo.binary_cross_entropy(x, y, weight=w, reduction=reduction),
                        _probabilities(rng, 4, 3), rng.random((4, 3)))


@pytest.mark.parametrize("call, problem", [
    (lambda: eo.binary_cross_entropy(eo.tensor([0.5, 1.5]), eo.tensor([1.0, 0.0])),
     r"binary_cross_entropy: input must be probabilities in \[0, 1\].*got 1.5"),
    (lambda: eo.binary_cross_entropy(eo.tensor([np.nan]), eo.tensor([1.0])),
     r"probabilities in \[0, 1\].*got nan"),
    (lambda: eo.binary_cross_entropy(eo.tensor([0.5, 0.5]), eo.tensor([1.0, 2.0])),
     r"binary_cross_entropy: target must be in \[0, 1\].*got 2.0"),
    (lambda: eo.binary_cross_entropy(eo.tensor([0.5, 0.5]), eo.tensor([-0.1, 1.0])),
     r"target must be in \[0, 1\].*got -0.1"),
    (lambda: eo.BCELoss()(eo.tensor([0.5]), eo.tensor([np.nan])), r"target must be in.*got nan"),
    (lambda: eo.binary_cross_entropy(eo.tensor([0.5, 0.5]), eo.tensor([1.0])),
     r"binary_cross_entropy: input shape \(2,\) and target shape \(1,\) differ"),
    (lambda: eo.binary_cross_entropy(eo.tensor([0.5]), eo.tensor([1.0]), "sum"),
     "the third argument is weight.*reduction='sum'"),
    (lambda: eo.binary_cross_entropy(eo.tensor([0.5, 0.5]), eo.tensor([1.0, 0.0]),
                                     weight=np.ones(3)),
     r"weight of shape \(3,\) does not broadcast to the input shape \(2,\)"),
    (lambda: eo.BCELoss(reduction="avg"), "BCELoss.*reduction"),
    (lambda: eo.BCELoss()(eo.tensor(np.array([1, 0])), eo.tensor([1.0, 0.0])),
     "binary_cross_entropy: expected floating-point input"),
])
def test_bad_input_is_named(call, problem):
    with pytest.raises(eo.EveryOError, match=problem):
        call()


def _targets(rng):
    return rng.uniform(0, 1, (3, 2))


SECOND_ORDER = [
    ("binary_cross_entropy_mean", lambda x, y: eo.binary_cross_entropy(x, y),
     lambda x, y: F().binary_cross_entropy(x, y),
     [lambda rng: rng.uniform(0.1, 0.9, (3, 2)), _targets]),
    ("binary_cross_entropy_weight_sum",
     lambda x, y: eo.binary_cross_entropy(x, y, weight=np.array([0.5, 2.0]), reduction="sum"),
     lambda x, y: F().binary_cross_entropy(x, y, weight=F().torch.tensor([0.5, 2.0]),
                                           reduction="sum"),
     [lambda rng: rng.uniform(0.1, 0.9, (3, 2)), _targets]),
    ("binary_cross_entropy_of_sigmoid",
     lambda z: eo.binary_cross_entropy(eo.sigmoid(z), np.array([1.0, 0.0, 0.3]),
                                       reduction="none"),
     lambda z: F().binary_cross_entropy(z.sigmoid(), F().torch.tensor([1.0, 0.0, 0.3],
                                        dtype=F().torch.float64), reduction="none"),
     [normal(3)]),
]
test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))
