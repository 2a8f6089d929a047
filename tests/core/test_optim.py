"""Optimizers against PyTorch's update rules, and their state round trip."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo

CONFIGS = [
    ("SGD", {"lr": 0.1}),
    ("SGD", {"lr": 0.1, "momentum": 0.9}),
    ("SGD", {"lr": 0.1, "momentum": 0.9, "nesterov": True, "weight_decay": 0.01}),
    ("SGD", {"lr": 0.05, "momentum": 0.5, "dampening": 0.1}),
    ("Adam", {"lr": 0.01}),
    ("Adam", {"lr": 0.01, "weight_decay": 0.1, "betas": (0.8, 0.99)}),
    ("AdamW", {"lr": 0.01}),
    ("AdamW", {"lr": 0.01, "weight_decay": 0.3, "eps": 1e-6}),
]


def _loss(w):
    return ((w * w * w).sum() + (w * 2.0).sum())


def _train(w, optimizer, steps):
    """``steps`` optimizer steps on ``_loss``; returns ``w``."""
    for _ in range(steps):
        optimizer.zero_grad()
        _loss(w).backward()
        optimizer.step()
    return w


@pytest.mark.parametrize("name,options", CONFIGS, ids=[f"{n}-{i}" for i, (n, _) in enumerate(CONFIGS)])
def test_matches_pytorch(name, options, torch):
    start = np.random.default_rng(0).standard_normal((3, 4))
    ours = eo.Parameter(start)
    theirs = torch.tensor(start, requires_grad=True)
    opt = getattr(eo, name)([ours], **options)
    torch_opt = getattr(torch.optim, name)([theirs], **options)
    for _ in range(5):
        opt.zero_grad()
        _loss(ours).backward()
        opt.step()
        torch_opt.zero_grad()
        _loss(theirs).backward()
        torch_opt.step()
    np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("name,options", CONFIGS[1:3] + CONFIGS[4:6])
def test_state_dict_resumes_exactly(name, options, tmp_path):
    start = np.random.default_rng(1).standard_normal(5)

    def fresh():
        w = eo.Parameter(start)
        return w, getattr(eo, name)([w], **options)

    straight = _train(*fresh(), steps=6)
    w, opt = fresh()
    _train(w, opt, steps=3)
    eo.save({"model": {"w": w.data}, "optimizer": opt.state_dict()}, tmp_path / "ckpt.npz")
    checkpoint = eo.load(tmp_path / "ckpt.npz")
    w2 = eo.Parameter(checkpoint["model"]["w"])
    opt2 = getattr(eo, name)([w2], **options)
    opt2.load_state_dict(checkpoint["optimizer"])
    np.testing.assert_array_equal(_train(w2, opt2, steps=3).data, straight.data)


def test_load_state_dict_refuses_a_foreign_state():
    w = eo.Parameter([1.0])
    with pytest.raises(eo.EveryOError, match="belongs to 'Adam'"):
        eo.SGD([w]).load_state_dict(eo.Adam([w]).state_dict())


def test_bad_arguments():
    with pytest.raises(eo.EveryOError, match="empty parameter list"):
        eo.SGD([])
    with pytest.raises(eo.EveryOError, match="lr must be >= 0"):
        eo.SGD([eo.Parameter([1.0])], lr=-1)
    with pytest.raises(eo.EveryOError, match="nesterov"):
        eo.SGD([eo.Parameter([1.0])], nesterov=True)
    with pytest.raises(eo.EveryOError, match="requires grad"):
        eo.SGD([eo.tensor([1.0])])


def test_parameters_without_gradients_are_left_alone():
    a, b = eo.Parameter([1.0]), eo.Parameter([1.0])
    opt = eo.SGD([a, b], lr=0.5)
    (a * 2).sum().backward()
    opt.step()
    assert a.data[0] == 0.0 and b.data[0] == 1.0


@pytest.mark.parametrize("name", ["Adam", "AdamW"])
def test_adam_bias_correction_counts_each_parameters_own_steps(name, torch):
    # Regression: the bias correction used the optimizer's global step count, so a parameter
    # whose first gradient arrived at step 2 was corrected as if it had seen 2 steps (PyTorch
    # keeps a step count per parameter).
    a0, b0 = np.array([1.0, 2.0]), np.array([0.5, -1.5])
    ours = [eo.Parameter(a0), eo.Parameter(b0)]
    theirs = [torch.tensor(a0, requires_grad=True), torch.tensor(b0, requires_grad=True)]
    opt = getattr(eo, name)(ours, lr=0.1)
    torch_opt = getattr(torch.optim, name)(theirs, lr=0.1)
    for step in range(4):
        for params, optimizer in ((ours, opt), (theirs, torch_opt)):
            optimizer.zero_grad()
            a, b = params
            loss = (a * a).sum() + ((b * b * b).sum() if step >= 2 else 0.0)
            loss.backward()
            optimizer.step()
    for ours_p, theirs_p in zip(ours, theirs):
        np.testing.assert_allclose(ours_p.data, theirs_p.detach().numpy(), rtol=1e-10, atol=1e-12)


def test_adam_resumes_from_a_checkpoint_without_per_parameter_steps():
    # Checkpoints written before Adam counted steps per parameter carry only step_count.
    def fresh():
        w = eo.Parameter(np.linspace(-1.0, 1.0, 4))
        return w, eo.Adam([w], lr=0.05)

    straight = _train(*fresh(), steps=5)
    w, opt = fresh()
    _train(w, opt, steps=2)
    state = opt.state_dict()
    for buffers in state["state"].values():
        del buffers["step"]
    opt.load_state_dict(state)
    np.testing.assert_array_equal(_train(w, opt, steps=3).data, straight.data)
