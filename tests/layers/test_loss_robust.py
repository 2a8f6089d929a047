"""SmoothL1Loss, HuberLoss and KLDivLoss against PyTorch (every reduction), gradcheck (first and
second derivatives), composites and errors."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.torch_oracle import assert_composite_matches, compare_with_torch

DTYPES = ["float64", "float32"]


REDUCTIONS = ["mean", "sum", "none"]


ROBUST = {
    "SmoothL1Loss": (lambda r: eo.SmoothL1Loss(r, beta=0.5),
                     lambda torch, r: torch.nn.SmoothL1Loss(reduction=r, beta=0.5)),
    "HuberLoss": (lambda r: eo.HuberLoss(r, delta=0.7),
                  lambda torch, r: torch.nn.HuberLoss(reduction=r, delta=0.7)),
}


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", sorted(ROBUST))
def test_robust_losses_match_torch(torch, rng, dtype, reduction, name):
    ours, ref = ROBUST[name]
    x, y = rng.standard_normal((5, 3)) * 2, rng.standard_normal((5, 3))
    compare_with_torch(torch, ours(reduction), ref(torch, reduction), [x, y], dtype=dtype)


@pytest.mark.filterwarnings("error")  # np.where used to evaluate d / 1e-300 everywhere
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("beta", [0.0, 0.5])
def test_smooth_l1_computes_without_numpy_warnings(torch, rng, dtype, beta):
    x, y = rng.standard_normal((5, 3)) * 2, rng.standard_normal((5, 3))
    x[0, 0] = y[0, 0]  # a zero difference: the kink of the beta = 0 (plain L1) case
    x[1, 1] = 1e9  # d * d / 1e-300 overflows even float64
    layer = eo.SmoothL1Loss("sum", beta=beta)
    compare_with_torch(torch, layer, torch.nn.SmoothL1Loss(reduction="sum", beta=beta),
                       [x, y], dtype=dtype)
    assert_composite_matches(layer(eo.tensor(x, requires_grad=True), eo.tensor(y)))


@pytest.mark.filterwarnings("ignore:reduction. 'mean' divides")
@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS + ["batchmean"])
@pytest.mark.parametrize("log_target", [False, True])
def test_kl_div_matches_torch(torch, rng, dtype, reduction, log_target):
    logq = np.log(rng.dirichlet(np.ones(4), 6))
    p = rng.dirichlet(np.ones(4), 6)
    target = np.log(p) if log_target else p
    compare_with_torch(torch, eo.KLDivLoss(reduction, log_target=log_target),
                       torch.nn.KLDivLoss(reduction=reduction, log_target=log_target),
                       [logq, target], dtype=dtype)


def test_robust_losses_gradcheck_composites_and_errors(rng):
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    x = np.where(np.abs(np.abs(x - y) - 0.6) < 0.05, x + 0.2, x)  # away from the kinks
    for layer in (eo.SmoothL1Loss(beta=0.6), eo.HuberLoss(delta=0.6)):
        assert eo.gradcheck(layer, x, y)
        assert_composite_matches(layer(eo.tensor(x, requires_grad=True), eo.tensor(y)))
    p = rng.dirichlet(np.ones(3), 4)
    kl = eo.KLDivLoss("batchmean")
    assert eo.gradcheck(kl, np.log(rng.dirichlet(np.ones(3), 4)), p)
    out = eo.KLDivLoss("sum")(eo.tensor(np.log(p), requires_grad=True), eo.tensor(p))
    assert_composite_matches(out)
    with pytest.raises(eo.EveryOError, match="KLDivLoss: reduction must be one of"):
        eo.KLDivLoss("batch")


def test_robust_losses_second_derivatives(rng):
    x, y = rng.standard_normal((3, 4)), rng.standard_normal((3, 4))
    x = np.where(np.abs(np.abs(x - y) - 0.5) < 0.05, x + 0.2, x)
    assert eo.gradgradcheck(lambda a, b: eo.smooth_l1_loss(a, b, beta=0.5), x, y)
    assert eo.gradgradcheck(lambda a, b: eo.huber_loss(a, b, delta=0.5), x, y)
    p = rng.dirichlet(np.ones(4), 3)
    assert eo.gradgradcheck(lambda a, b: eo.kl_div(a, b, reduction="batchmean"),
                            np.log(rng.dirichlet(np.ones(4), 3)), p)


@pytest.mark.parametrize("loss", [eo.huber_loss, eo.smooth_l1_loss])
def test_an_input_written_after_the_forward_is_refused_by_the_second_derivative(loss):
    # the create_graph backward recomputes the loss from its operands: it gave the gradient
    # at the new values, silently (PyTorch: "modified by an inplace operation")
    x = eo.tensor(np.array([0.3, -2.0, 1.5]), requires_grad=True)
    value = loss(x, eo.zeros(3))
    with eo.no_grad():
        x.add_(5.0)
    with pytest.raises(eo.EveryOError, match="operand 0.*modified in place"):
        eo.grad(value, x, create_graph=True)
