"""clip_grad_norm_ and the learning-rate schedulers against PyTorch's."""

from __future__ import annotations

import math
import warnings

import numpy as np
import pytest

import everyo as eo


def _params_with_grads(rng, scale):
    shapes = [(3, 4), (4,), (2, 2, 3)]
    params = [eo.Parameter(rng.standard_normal(s).astype(np.float32)) for s in shapes]
    for p in params:
        p.grad = (rng.standard_normal(p.shape) * scale).astype(np.float32)
    return params


@pytest.mark.parametrize("scale, max_norm", [(1.0, 0.5), (0.01, 5.0)])
@pytest.mark.parametrize("norm_type", [2.0, 1.0, float("inf")])
def test_clip_grad_norm_matches_torch(torch, rng, scale, max_norm, norm_type):
    params = _params_with_grads(rng, scale)
    ref = [torch.tensor(p.data, requires_grad=True) for p in params]
    for r, p in zip(ref, params):
        r.grad = torch.tensor(p.grad.copy())
    total = eo.clip_grad_norm_(params, max_norm, norm_type=norm_type)
    ref_total = torch.nn.utils.clip_grad_norm_(ref, max_norm, norm_type=norm_type)
    assert isinstance(total, float)
    assert total == pytest.approx(float(ref_total), rel=1e-5)
    for p, r in zip(params, ref):
        np.testing.assert_allclose(p.grad, r.grad.numpy(), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("norm_type", [0, 0.0, -1.0, -2.5, -math.inf, "inf", "2", True])
def test_clip_grad_norm_takes_every_norm_type_pytorch_takes(torch, rng, norm_type):
    """Regression: norm_type=0 divided by zero (raw ZeroDivisionError) and -inf was read as
    +inf (the max-norm, a silent wrong number). PyTorch's total is the p-norm of the
    parameters' own p-norms: for p=0 the number of parameters with a nonzero gradient, for
    p<0 and -inf 0 as soon as one gradient element is 0."""
    params = _params_with_grads(rng, 1.0)
    params[1].grad[2] = 0.0
    params.append(eo.Parameter(np.zeros(3, np.float32)))
    params[-1].grad = np.zeros(3, np.float32)  # a parameter whose gradient is all zeros
    ref = [torch.tensor(p.data, requires_grad=True) for p in params]
    for r, p in zip(ref, params):
        r.grad = torch.tensor(p.grad.copy())
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        total = eo.clip_grad_norm_(params, 0.5, norm_type=norm_type)
    ref_total = torch.nn.utils.clip_grad_norm_(ref, 0.5, norm_type=norm_type)
    assert total == pytest.approx(float(ref_total), rel=1e-5)
    for p, r in zip(params, ref):
        np.testing.assert_allclose(p.grad, r.grad.numpy(), rtol=1e-5, atol=1e-8)


@pytest.mark.parametrize("norm_type, message", [
    ("fro", r"norm_type='fro' is a matrix norm.*norm_type=2"),
    ("nuc", r"norm_type='nuc' is a matrix norm"),
    (None, r"norm_type must be a number .* got None"),
    ("two", r"norm_type must be a number .* got 'two'"),
    (math.nan, r"norm_type must be a number .* got nan"),
])
def test_clip_grad_norm_refuses_a_norm_type_that_is_no_p_norm_by_name(rng, norm_type,
                                                                      message):
    params = _params_with_grads(rng, 1.0)
    before = [p.grad.copy() for p in params]
    with pytest.raises(eo.EveryOError, match=message):
        eo.clip_grad_norm_(params, 1.0, norm_type=norm_type)
    for p, grad in zip(params, before):
        np.testing.assert_array_equal(p.grad, grad)


@pytest.mark.parametrize("norm_type", [-1.0, -math.inf])
def test_clip_grad_norm_refuses_a_negative_norm_of_an_empty_gradient(norm_type):
    a, b = eo.Parameter(np.zeros(2, np.float32)), eo.Parameter(np.zeros(0, np.float32))
    a.grad, b.grad = np.ones(2, np.float32), np.zeros(0, np.float32)
    with pytest.raises(eo.EveryOError, match=r"no -\S+ norm of an empty gradient \(shape \(0,\)\)"):
        eo.clip_grad_norm_([a, b], 1.0, norm_type=norm_type)


def test_clip_grad_norm_skips_parameters_without_grad_and_accepts_a_module():
    model = eo.Linear(3, 2, seed=0)
    (model(eo.ones(4, 3)) * 10).sum().backward()
    model.bias.grad = None
    before = float(np.linalg.norm(model.weight.grad))
    assert eo.clip_grad_norm_(model.parameters(), 1.0) == pytest.approx(before, rel=1e-6)
    assert float(np.linalg.norm(model.weight.grad)) == pytest.approx(1.0, rel=1e-4)


def test_clip_grad_norm_nonfinite():
    p = eo.Parameter(np.zeros(2, np.float32))
    p.grad = np.array([np.inf, 1.0], np.float32)
    with pytest.raises(eo.EveryOError, match="total gradient norm is inf"):
        eo.clip_grad_norm_([p], 1.0, error_if_nonfinite=True)


def test_clip_grad_max_norm_sees_a_nan_in_any_parameter():
    # Python's max(2.0, nan) is 2.0: a NaN in the second gradient gave a finite norm and a
    # "clipped" first gradient; PyTorch's max-norm is NaN (and error_if_nonfinite raises)
    a, b = eo.Parameter(np.zeros(2, np.float32)), eo.Parameter(np.zeros(2, np.float32))
    a.grad = np.array([1.0, 2.0], np.float32)
    b.grad = np.array([np.nan, 1.0], np.float32)
    assert math.isnan(eo.clip_grad_norm_([a, b], 1.0, norm_type=math.inf))
    with pytest.raises(eo.EveryOError, match="total gradient norm is nan"):
        eo.clip_grad_norm_([a, b], 1.0, norm_type=math.inf, error_if_nonfinite=True)


def _lr_curves(torch, make_ours, make_ref, epochs):
    ours_opt = eo.SGD([eo.Parameter([1.0])], lr=0.5)
    ours = make_ours(ours_opt)
    ref_opt = torch.optim.SGD([torch.nn.Parameter(torch.ones(1))], lr=0.5)
    ref = make_ref(ref_opt)
    ours_lrs, ref_lrs = [], []
    for _ in range(epochs):
        ours_lrs.append(ours_opt.lr)
        ref_lrs.append(ref_opt.param_groups[0]["lr"])
        assert ours.get_last_lr() == [ours_opt.lr]
        ref_opt.step()  # torch warns when the scheduler steps first
        ours.step()
        ref.step()
    return ours_lrs, ref_lrs


def test_step_lr_matches_torch(torch):
    ours, ref = _lr_curves(torch, lambda o: eo.StepLR(o, step_size=3, gamma=0.3),
                           lambda o: torch.optim.lr_scheduler.StepLR(o, 3, gamma=0.3), 12)
    np.testing.assert_allclose(ours, ref, rtol=1e-12)


@pytest.mark.parametrize("eta_min", [0.0, 0.05])
def test_cosine_annealing_matches_torch(torch, eta_min):
    ours, ref = _lr_curves(torch, lambda o: eo.CosineAnnealingLR(o, T_max=5, eta_min=eta_min),
                           lambda o: torch.optim.lr_scheduler.CosineAnnealingLR(
                               o, T_max=5, eta_min=eta_min), 16)  # past T_max: back up
    np.testing.assert_allclose(ours, ref, rtol=1e-9, atol=1e-12)
    assert ours[5] == pytest.approx(eta_min)


def test_scheduler_state_dict_round_trip():
    # The groups' current learning rates live in the optimizer: resume both.
    opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
    sched = eo.CosineAnnealingLR(opt, T_max=10)
    for _ in range(4):
        sched.step()
    opt2 = eo.SGD([eo.Parameter([1.0])], lr=123.0)
    sched2 = eo.CosineAnnealingLR(opt2, T_max=10)
    opt2.load_state_dict(opt.state_dict())
    sched2.load_state_dict(sched.state_dict())
    sched.step()
    sched2.step()
    assert opt2.lr == opt.lr == pytest.approx(0.5 * (1 + math.cos(math.pi * 5 / 10)))


def test_scheduler_bad_arguments():
    opt = eo.SGD([eo.Parameter([1.0])], lr=1.0)
    with pytest.raises(eo.EveryOError, match="step_size must be a positive int"):
        eo.StepLR(opt, step_size=0)
    with pytest.raises(eo.EveryOError, match="T_max must be a positive number"):
        eo.CosineAnnealingLR(opt, T_max=0)
