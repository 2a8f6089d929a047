"""Class/element weights of CrossEntropyLoss, NLLLoss, BCEWithLogitsLoss and the losses
SmoothL1Loss, HuberLoss, KLDivLoss against PyTorch (every reduction) and gradcheck."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.torch_oracle import assert_composite_matches, compare_with_torch

DTYPES = ["float64", "float32"]
REDUCTIONS = ["mean", "sum", "none"]


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_weighted_cross_entropy_matches_torch(torch, rng, dtype, reduction, smoothing):
    logits = rng.standard_normal((6, 4))
    target = np.array([0, 3, -100, 2, 3, 1])
    weight = rng.uniform(0.2, 2.0, 4)
    layer = eo.CrossEntropyLoss(reduction, label_smoothing=smoothing, weight=weight)
    ref = torch.nn.CrossEntropyLoss(weight=torch.tensor(weight, dtype=getattr(torch, dtype)),
                                    reduction=reduction, label_smoothing=smoothing)
    compare_with_torch(torch, lambda x: layer(x, target),
                       lambda t: ref(t, torch.tensor(target)), [logits], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_weighted_cross_entropy_probability_targets(torch, rng, dtype, smoothing):
    logits = rng.standard_normal((5, 3))
    q = rng.dirichlet(np.ones(3), 5)
    weight = rng.uniform(0.2, 2.0, 3)
    ref = torch.nn.CrossEntropyLoss(weight=torch.tensor(weight, dtype=getattr(torch, dtype)),
                                    label_smoothing=smoothing)
    compare_with_torch(torch, lambda x: eo.cross_entropy(x, q.astype(dtype), weight=weight,
                                                         label_smoothing=smoothing),
                       lambda t: ref(t, torch.tensor(q.astype(dtype))), [logits], dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_weighted_nll_matches_torch(torch, rng, dtype, reduction):
    logp = np.log(rng.dirichlet(np.ones(5), (3, 4)))
    target = rng.integers(0, 5, (3, 4))
    target[0, 0] = -100
    weight = rng.uniform(0.2, 2.0, 5)
    layer = eo.NLLLoss(reduction, weight=weight)
    ref = torch.nn.NLLLoss(weight=torch.tensor(weight, dtype=getattr(torch, dtype)),
                           reduction=reduction)
    # PyTorch's NLLLoss wants the classes on axis 1
    compare_with_torch(torch, lambda x: layer(x, target),
                       lambda t: ref(t.permute(0, 2, 1), torch.tensor(target)), [logp],
                       dtype=dtype)


@pytest.mark.parametrize("dtype", DTYPES)
@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_weighted_bce_with_logits_matches_torch(torch, rng, dtype, reduction):
    x, y = rng.standard_normal((4, 3)), rng.uniform(0, 1, (4, 3))
    weight, pos = rng.uniform(0.2, 2.0, 3), rng.uniform(0.5, 3.0, 3)
    layer = eo.BCEWithLogitsLoss(reduction, pos_weight=pos, weight=weight)
    T = getattr(torch, dtype)
    ref = torch.nn.BCEWithLogitsLoss(weight=torch.tensor(weight, dtype=T), reduction=reduction,
                                     pos_weight=torch.tensor(pos, dtype=T))
    compare_with_torch(torch, layer, ref, [x, y], dtype=dtype)


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


def test_losses_gradcheck_composites_and_errors(rng):
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
    weight = rng.uniform(0.5, 2, 3)
    target = np.array([0, 2, 1, 2])
    assert eo.gradcheck(lambda z: eo.cross_entropy(z, target, weight=weight,
                                                   label_smoothing=0.1), x)
    with pytest.raises(eo.EveryOError, match=r"cross_entropy: weight must have one entry per"):
        eo.cross_entropy(eo.tensor(x), target, weight=np.ones(4))
    with pytest.raises(eo.EveryOError, match="KLDivLoss: reduction must be one of"):
        eo.KLDivLoss("batch")
    with pytest.raises(eo.EveryOError, match="binary_cross_entropy_with_logits: weight of"):
        eo.BCEWithLogitsLoss(weight=np.ones(5))(eo.tensor(x), eo.tensor(y))
