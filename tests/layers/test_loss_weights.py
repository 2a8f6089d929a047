"""Class weights of CrossEntropyLoss and NLLLoss and element weights of BCEWithLogitsLoss against
PyTorch (every reduction), gradcheck (first and second derivatives) and errors."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.torch_oracle import compare_with_torch

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


def test_weighted_losses_gradcheck_and_errors(rng):
    x, y = rng.standard_normal((4, 3)), rng.standard_normal((4, 3))
    weight = rng.uniform(0.5, 2, 3)
    target = np.array([0, 2, 1, 2])
    assert eo.gradcheck(lambda z: eo.cross_entropy(z, target, weight=weight,
                                                   label_smoothing=0.1), x)
    with pytest.raises(eo.EveryOError, match=r"cross_entropy: weight must have one entry per"):
        eo.cross_entropy(eo.tensor(x), target, weight=np.ones(4))
    with pytest.raises(eo.EveryOError, match="binary_cross_entropy_with_logits: weight of"):
        eo.BCEWithLogitsLoss(weight=np.ones(5))(eo.tensor(x), eo.tensor(y))


def test_weighted_losses_second_derivatives(rng):
    weight = rng.uniform(0.5, 2.0, 3)
    target = np.array([0, 2, 1, -100])
    assert eo.gradgradcheck(lambda z: eo.cross_entropy(z, target, weight=weight,
                                                       label_smoothing=0.1),
                            rng.standard_normal((4, 3)))
    assert eo.gradgradcheck(lambda z: eo.nll_loss(eo.log_softmax(z), target, weight=weight),
                            rng.standard_normal((4, 3)))
    y = rng.uniform(0, 1, (4, 3))
    assert eo.gradgradcheck(lambda z: eo.binary_cross_entropy_with_logits(
        z, y, weight=weight, pos_weight=weight[::-1].copy()), rng.standard_normal((4, 3)))
