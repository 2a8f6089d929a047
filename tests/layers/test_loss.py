"""The unweighted losses against PyTorch (all reductions, label smoothing, ignored targets,
padding-only batches), first and second derivatives in float64, float32 results for float16
input and the errors of bad targets."""

from __future__ import annotations

import re
import warnings

import numpy as np
import pytest

import everyo as eo
from support.second_order import (
    F,
    T,
    normal,
    second_order_tests,
)

REDUCTIONS = ["mean", "sum", "none"]


def _compare(torch, ours_fn, ref_fn, inputs, targets, grad_targets=False):
    """Run both losses on float64 copies; compare values and input (and target) gradients."""
    ours_in = eo.tensor(inputs, requires_grad=True)
    ours_t = eo.tensor(targets, requires_grad=grad_targets) if grad_targets else targets
    out = ours_fn(ours_in, ours_t)
    g = np.random.default_rng(5).standard_normal(out.shape)
    out.backward(g)
    ref_in = torch.tensor(inputs, requires_grad=True)
    ref_t = torch.tensor(targets, requires_grad=grad_targets)
    ref = ref_fn(ref_in, ref_t)
    ref.backward(torch.from_numpy(np.asarray(g)))
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours_in.grad, ref_in.grad.numpy(), rtol=1e-9, atol=1e-12)
    if grad_targets:
        np.testing.assert_allclose(ours_t.grad, ref_t.grad.numpy(), rtol=1e-9, atol=1e-12)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.2])
def test_cross_entropy_matches_torch(torch, rng, reduction, smoothing):
    logits = rng.standard_normal((6, 5)) * 3
    targets = rng.integers(0, 5, 6)
    _compare(torch,
             lambda x, t: eo.CrossEntropyLoss(reduction, label_smoothing=smoothing)(x, t),
             lambda x, t: torch.nn.functional.cross_entropy(
                 x, t, reduction=reduction, label_smoothing=smoothing),
             logits, targets)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("smoothing", [0.0, 0.1])
def test_cross_entropy_sequence_logits_with_ignored_targets(torch, rng, reduction, smoothing):
    logits = rng.standard_normal((3, 4, 7))  # (batch, seq, classes): classes on the last axis
    targets = rng.integers(0, 7, (3, 4))
    targets[0, 1] = targets[2, 3] = -100
    _compare(torch,
             lambda x, t: eo.cross_entropy(x, t, reduction=reduction, label_smoothing=smoothing),
             lambda x, t: torch.nn.functional.cross_entropy(
                 x.permute(0, 2, 1), t, reduction=reduction,
                 label_smoothing=smoothing).reshape(t.shape if reduction == "none" else ()),
             logits, targets)


@pytest.mark.parametrize("smoothing", [0.0, 0.3])
def test_cross_entropy_probability_targets_match_torch(torch, rng, smoothing):
    logits = rng.standard_normal((5, 4))
    probs = rng.random((5, 4))
    probs /= probs.sum(axis=1, keepdims=True)
    _compare(torch, lambda x, t: eo.cross_entropy(x, t, label_smoothing=smoothing),
             lambda x, t: torch.nn.functional.cross_entropy(x, t, label_smoothing=smoothing),
             logits, probs)


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_nll_loss_matches_torch(torch, rng, reduction):
    logp = np.log(rng.random((6, 4)))
    targets = rng.integers(0, 4, 6)
    targets[2] = -100
    _compare(torch, lambda x, t: eo.NLLLoss(reduction)(x, t),
             lambda x, t: torch.nn.functional.nll_loss(x, t, reduction=reduction),
             logp, targets)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("name", ["mse", "l1"])
def test_regression_losses_match_torch_with_target_gradients(torch, rng, reduction, name):
    x = rng.standard_normal((4, 3))
    y = rng.standard_normal((4, 3))
    ours = eo.MSELoss(reduction) if name == "mse" else eo.L1Loss(reduction)
    ref = torch.nn.functional.mse_loss if name == "mse" else torch.nn.functional.l1_loss
    _compare(torch, ours, lambda a, b: ref(a, b, reduction=reduction), x, y, grad_targets=True)


@pytest.mark.parametrize("reduction", REDUCTIONS)
@pytest.mark.parametrize("pos_weight", [None, [0.5, 2.0, 3.0]])
def test_bce_with_logits_matches_torch(torch, rng, reduction, pos_weight):
    x = rng.standard_normal((5, 3)) * 4
    y = rng.random((5, 3))
    pw = None if pos_weight is None else np.array(pos_weight)
    _compare(torch, lambda a, b: eo.BCEWithLogitsLoss(reduction, pos_weight=pw)(a, b),
             lambda a, b: torch.nn.functional.binary_cross_entropy_with_logits(
                 a, b, reduction=reduction,
                 pos_weight=None if pw is None else torch.from_numpy(pw)),
             x, y, grad_targets=True)


CLASS_WEIGHT = np.array([0.5, 2.0, 1.0, 1.5])
ALL_IGNORED = [  # (id, ours, PyTorch's): every target ignored, as in a padding-only batch
    ("cross_entropy", lambda x, t, r: eo.cross_entropy(x, t, r),
     lambda F, x, t, r: F.cross_entropy(x, t, reduction=r)),
    ("cross_entropy_smoothing", lambda x, t, r: eo.cross_entropy(x, t, r, label_smoothing=0.2),
     lambda F, x, t, r: F.cross_entropy(x, t, reduction=r, label_smoothing=0.2)),
    ("cross_entropy_weight", lambda x, t, r: eo.cross_entropy(x, t, r, weight=CLASS_WEIGHT,
                                                              label_smoothing=0.1),
     lambda F, x, t, r: F.cross_entropy(x, t, reduction=r, label_smoothing=0.1,
                                        weight=F.torch.tensor(CLASS_WEIGHT))),
    ("nll_loss", lambda x, t, r: eo.nll_loss(eo.log_softmax(x), t, r),
     lambda F, x, t, r: F.nll_loss(x.log_softmax(-1), t, reduction=r)),
    ("nll_loss_weight", lambda x, t, r: eo.nll_loss(eo.log_softmax(x), t, r, weight=CLASS_WEIGHT),
     lambda F, x, t, r: F.nll_loss(x.log_softmax(-1), t, reduction=r,
                                   weight=F.torch.tensor(CLASS_WEIGHT))),
]


@pytest.mark.parametrize("reduction", ["mean", "sum"])
@pytest.mark.parametrize("case", ALL_IGNORED, ids=[case[0] for case in ALL_IGNORED])
def test_a_batch_of_only_ignored_targets_gives_zero_gradients_as_torch(torch, rng, case,
                                                                       reduction):
    """Regression: "mean" over no counted target divided the gradient by zero, so a
    padding-only batch gave NaN gradients (and NaN weights after the step); PyTorch's loss is
    NaN (0 / 0) there and its gradients, first and second, are zeros."""
    _, ours, theirs = case
    logits, targets = rng.standard_normal((3, 4)), np.full(3, -100)
    x = eo.tensor(logits, requires_grad=True)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # no NumPy warning on the way either
        loss = ours(x, targets, reduction)
        (g,) = eo.grad(loss, x, create_graph=True)
        (gg,) = eo.grad((g * g).sum() + g.sum(), x, allow_unused=True)
        plain = eo.tensor(logits, requires_grad=True)
        ours(plain, targets, reduction).backward()  # the fused ops' own backward
    xt = torch.tensor(logits, requires_grad=True)
    expected = theirs(torch.nn.functional, xt, torch.tensor(targets), reduction)
    (g_t,) = torch.autograd.grad(expected, xt)
    np.testing.assert_array_equal(loss.data, expected.detach().numpy())  # nan for "mean"
    for gradient in (g.data, plain.grad):
        np.testing.assert_array_equal(gradient, g_t.numpy())
    assert not g.data.any() and (gg is None or not gg.data.any())


def test_bce_with_logits_is_stable_for_huge_logits():
    loss = eo.binary_cross_entropy_with_logits(eo.tensor([1000.0, -1000.0]),
                                               eo.tensor([0.0, 1.0]), reduction="none")
    np.testing.assert_allclose(loss.data, [1000.0, 1000.0])


@pytest.mark.parametrize("reduction", REDUCTIONS)
def test_loss_gradcheck(rng, reduction):
    logits = rng.standard_normal((4, 5))
    targets = rng.integers(0, 5, 4)
    y = rng.random((4, 5))
    assert eo.gradcheck(lambda x: eo.cross_entropy(x, targets, reduction, label_smoothing=0.1),
                        logits)
    assert eo.gradcheck(lambda x: eo.nll_loss(eo.log_softmax(x), targets, reduction), logits)
    assert eo.gradcheck(lambda x, t: eo.mse_loss(x, t, reduction), logits, y)
    assert eo.gradcheck(lambda x, t: eo.l1_loss(x, t, reduction), logits, y)
    assert eo.gradcheck(lambda x, t: eo.binary_cross_entropy_with_logits(
        x, t, reduction, pos_weight=np.full(5, 2.0)), logits, y)


def test_losses_return_float32_for_float16_input(rng):
    logits = eo.tensor(rng.standard_normal((8, 10)).astype(np.float16), requires_grad=True)
    targets = rng.integers(0, 10, 8)
    loss = eo.cross_entropy(logits, targets)
    assert loss.dtype == "float32"
    reference = eo.cross_entropy(eo.tensor(logits.data.astype(np.float32)), targets)
    np.testing.assert_allclose(loss.item(), reference.item(), rtol=1e-6)
    loss.backward()
    assert logits.grad.dtype == np.float16
    big = eo.tensor(np.full((4, 3), 300, np.float16))
    mse = eo.mse_loss(big, eo.zeros(4, 3, dtype="float16"))
    assert mse.dtype == "float32" and mse.item() == 90000.0  # > float16's max 65504
    for fn in (eo.l1_loss, eo.binary_cross_entropy_with_logits):
        assert fn(big, eo.zeros(4, 3, dtype="float16")).dtype == "float32"


def test_loss_bad_inputs():
    logits = eo.zeros(3, 4)
    with pytest.raises(eo.EveryOError, match=r"target 4 is outside the 4 classes \[0, 3\]"):
        eo.cross_entropy(logits, np.array([0, 1, 4]))
    with pytest.raises(eo.EveryOError, match="target -2 is outside"):
        eo.nll_loss(logits, np.array([0, -2, 1]))
    with pytest.raises(eo.EveryOError, match=r"needs targets of shape \(3,\), got \(3, 1\)"):
        eo.cross_entropy(logits, np.zeros((3, 1), np.int64))
    with pytest.raises(eo.EveryOError, match="probability targets must match"):
        eo.cross_entropy(logits, np.zeros((3, 5)))
    with pytest.raises(eo.EveryOError, match="class targets must be integers"):
        eo.nll_loss(logits, np.zeros(3, bool))
    with pytest.raises(eo.EveryOError, match=r"input shape \(3, 1\) and target shape \(3,\)"):
        eo.mse_loss(eo.zeros(3, 1), eo.zeros(3))
    with pytest.raises(eo.EveryOError, match="reduction must be one of"):
        eo.L1Loss("average")
    # Regression: a pos_weight that does not broadcast to the input died in NumPy, and one
    # that broadcast *beyond* it silently averaged a larger loss in forward.
    for shape, pos_weight in (((4, 3), np.ones(2)), ((3,), np.ones((2, 3)))):
        with pytest.raises(eo.EveryOError, match=re.escape(
                f"pos_weight of shape {pos_weight.shape} does not broadcast to the input shape "
                f"{shape}")):
            eo.binary_cross_entropy_with_logits(eo.zeros(*shape), eo.ones(*shape),
                                                pos_weight=pos_weight)
    with pytest.raises(eo.EveryOError, match="floating-point input, got int64"):
        eo.cross_entropy(eo.tensor(np.zeros((2, 3), np.int64)), np.array([0, 1]))


CLASSES = np.array([2, 0, 1, 2])
IGNORED = np.array([2, -100, 1, 0])
PROBS = np.random.default_rng(9).dirichlet(np.ones(3), size=4)
SECOND_ORDER = [
    ("cross_entropy_smoothing",
     lambda x: eo.cross_entropy(x, CLASSES, label_smoothing=0.1),
     lambda x: F().cross_entropy(x, T().tensor(CLASSES), label_smoothing=0.1),
     [normal(4, 3)]),
    ("cross_entropy_ignore_sum",
     lambda x: eo.cross_entropy(x, IGNORED, reduction="sum"),
     lambda x: F().cross_entropy(x, T().tensor(IGNORED), reduction="sum"),
     [normal(4, 3)]),
    ("cross_entropy_probabilities",
     lambda x: eo.cross_entropy(x, PROBS),
     lambda x: F().cross_entropy(x, T().tensor(PROBS)), [normal(4, 3)]),
    ("nll_loss_ignore",
     lambda x: eo.nll_loss(eo.log_softmax(x), IGNORED),
     lambda x: F().nll_loss(x.log_softmax(-1), T().tensor(IGNORED)), [normal(4, 3)]),
    ("mse_loss", lambda x, y: eo.mse_loss(x, y), lambda x, y: F().mse_loss(x, y),
     [normal(3, 4), normal(3, 4)]),
    ("l1_loss_none", lambda x, y: eo.l1_loss(x, y, reduction="none") ** 2,
     lambda x, y: F().l1_loss(x, y, reduction="none") ** 2,
     [normal(3, 4), lambda rng: np.zeros((3, 4)) + 5.0]),
    ("bce_with_logits_pos_weight",
     lambda x, y: eo.binary_cross_entropy_with_logits(x, y, pos_weight=np.array([0.5, 2.0])),
     lambda x, y: F().binary_cross_entropy_with_logits(
         x, y, pos_weight=T().tensor([0.5, 2.0])),
     [normal(3, 2), lambda rng: rng.uniform(0, 1, (3, 2))]),
    ("bce_with_logits_at_zero",
     lambda x, y: eo.binary_cross_entropy_with_logits(x, y, reduction="sum"),
     lambda x, y: F().binary_cross_entropy_with_logits(x, y, reduction="sum"),
     [lambda rng: np.array([0.0, 1.0, -2.0]), lambda rng: np.array([0.2, 0.5, 1.0])]),
]

test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))


@pytest.mark.parametrize("target", [CLASSES, IGNORED, PROBS], ids=["classes", "ignored", "probs"])
def test_cross_entropy_composite_reproduces_the_fused_loss(target):
    x = eo.tensor(np.random.default_rng(8).standard_normal((4, 3)), requires_grad=True)
    out = eo.cross_entropy(x, target, label_smoothing=0.2)
    np.testing.assert_allclose(out._ctx.composite(x).data, out.data, rtol=1e-12)
