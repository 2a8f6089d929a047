"""The optimizers take PyTorch's keyword arguments: ``maximize`` (and Adam's
``decoupled_weight_decay``) change the arithmetic as PyTorch's do; ``foreach``/``fused`` are
performance hints with no effect on the numbers; ``capturable``/``differentiable`` are refused by
name when set. ``zero_grad(set_to_none=False)`` zeroes, and a PyTorch optimizer's
``state_dict()`` (its ``step`` is a float tensor) loads and resumes PyTorch's trajectory."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

NAMES = ("SGD", "Adam", "AdamW", "Adagrad", "RMSprop", "Adadelta")
OPTIONS = {"SGD": {"lr": 0.1, "momentum": 0.9, "weight_decay": 0.01}, "Adam": {"lr": 0.05},
           "AdamW": {"lr": 0.05}, "Adagrad": {"lr": 0.1, "weight_decay": 0.01},
           "RMSprop": {"lr": 0.01, "momentum": 0.5, "centered": True}, "Adadelta": {}}


def _loss(w):
    return (w * w * w).sum() - (w * 2.0).sum() + (w * w).sum()


def _trajectory(lib, optimizer_class, start, steps, **options):
    w = lib.tensor(start.copy(), requires_grad=True) if lib is not eo else eo.Parameter(start)
    optimizer = optimizer_class([w], **options)
    path = []
    for _ in range(steps):
        optimizer.zero_grad()
        _loss(w).backward()
        optimizer.step()
        path.append(np.array(w.detach().numpy() if lib is not eo else w.data))
    return optimizer, w, np.array(path)


@pytest.mark.parametrize("name", NAMES)
def test_maximize_follows_pytorch(name, torch):
    start = np.random.default_rng(0).uniform(-0.5, 0.5, (3, 2))
    options = dict(OPTIONS[name], maximize=True)
    _, _, ours = _trajectory(eo, getattr(eo, name), start, 6, **options)
    _, _, theirs = _trajectory(torch, getattr(torch.optim, name), start, 6, **options)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    _, _, minimized = _trajectory(eo, getattr(eo, name), start, 6, **OPTIONS[name])
    assert not np.allclose(ours, minimized)  # the option did something


def test_adam_decoupled_weight_decay_is_adamw(torch):
    start = np.random.default_rng(1).standard_normal(4)
    options = {"lr": 0.05, "weight_decay": 0.2, "decoupled_weight_decay": True}
    _, _, ours = _trajectory(eo, eo.Adam, start, 5, **options)
    _, _, theirs = _trajectory(torch, torch.optim.Adam, start, 5, **options)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)
    _, _, adamw = _trajectory(eo, eo.AdamW, start, 5, lr=0.05, weight_decay=0.2)
    np.testing.assert_array_equal(ours, adamw)


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("hint", ["foreach", "fused"])
@pytest.mark.parametrize("value", [None, True, False])
def test_foreach_and_fused_are_hints_that_change_nothing(name, hint, value, torch):
    if hint not in inspect.signature(getattr(torch.optim, name)).parameters:
        pytest.skip(f"torch.optim.{name} has no {hint}")
    start = np.random.default_rng(2).standard_normal(5)
    _, _, plain = _trajectory(eo, getattr(eo, name), start, 4, **OPTIONS[name])
    optimizer, _, hinted = _trajectory(eo, getattr(eo, name), start, 4,
                                       **dict(OPTIONS[name], **{hint: value}))
    np.testing.assert_array_equal(hinted, plain)
    assert optimizer.param_groups[0][hint] is value


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("flag", ["capturable", "differentiable"])
def test_capturable_and_differentiable_are_refused_by_name(name, flag, torch):
    if flag not in inspect.signature(getattr(torch.optim, name)).parameters:
        pytest.skip(f"torch.optim.{name} has no {flag}")
    w = eo.Parameter([1.0, 2.0])
    getattr(eo, name)([w], **{flag: False})  # PyTorch's default is accepted
    with pytest.raises(EveryOError, match=flag):
        getattr(eo, name)([w], **{flag: True})


@pytest.mark.parametrize("name", NAMES)
@pytest.mark.parametrize("key,value", [("maximize", "yes"), ("foreach", 1), ("fused", "no"),
                                       ("maximize", None)])
def test_the_new_options_are_checked(name, key, value, torch):
    if key not in inspect.signature(getattr(torch.optim, name)).parameters:
        pytest.skip(f"torch.optim.{name} has no {key}")
    with pytest.raises(EveryOError, match=key):
        getattr(eo, name)([eo.Parameter([1.0])], **{key: value})


@pytest.mark.parametrize("name", NAMES)
def test_signatures_keep_pytorchs_argument_order(name, torch):
    ours = inspect.signature(getattr(eo, name)).parameters
    theirs = inspect.signature(getattr(torch.optim, name)).parameters
    # AdamW also takes decoupled_weight_decay (True only): AdamW(groups, **defaults) works
    assert [key for key in ours if (name, key) != ("AdamW", "decoupled_weight_decay")] == \
        list(theirs)
    for key in theirs:
        assert ours[key].kind == theirs[key].kind, key


def test_sgd_takes_weight_decay_in_pytorchs_position(torch):
    start = np.random.default_rng(3).standard_normal(3)
    _, _, ours = _trajectory(eo, lambda p: eo.SGD(p, 0.1, 0.9, 0, 0.05), start, 3)
    _, _, theirs = _trajectory(torch, lambda p: torch.optim.SGD(p, 0.1, 0.9, 0, 0.05), start, 3)
    np.testing.assert_allclose(ours, theirs, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("owner", ["optimizer", "module"])
def test_zero_grad_set_to_none_false_zeroes(owner):
    model = eo.Linear(3, 2, seed=0)
    optimizer = eo.SGD(model.parameters(), lr=0.1)
    model(np.ones((4, 3), np.float32)).sum().backward()
    first = {name: p.grad for name, p in model.named_parameters()}
    (optimizer if owner == "optimizer" else model).zero_grad(set_to_none=False)
    for p in model.parameters():
        assert p.grad is not None and p.grad.dtype == p.data.dtype
        np.testing.assert_array_equal(p.grad, np.zeros_like(p.data))
    model(np.ones((4, 3), np.float32)).sum().backward()
    for name, p in model.named_parameters():  # accumulated onto zeros: one pass's gradient
        np.testing.assert_array_equal(p.grad, first[name])
    (optimizer if owner == "optimizer" else model).zero_grad()
    assert all(p.grad is None for p in model.parameters())


@pytest.mark.parametrize("value", [None, 0, "no"])
def test_zero_grad_set_to_none_must_be_a_bool(value):
    model = eo.Linear(3, 2, seed=0)
    with pytest.raises(EveryOError, match="set_to_none"):
        model.zero_grad(set_to_none=value)
    with pytest.raises(EveryOError, match="set_to_none"):
        eo.SGD(model.parameters()).zero_grad(set_to_none=value)


@pytest.mark.parametrize("name", NAMES)
def test_pytorch_optimizer_state_resumes_pytorchs_trajectory(name, torch):
    start = np.random.default_rng(4).uniform(-0.5, 0.5, 6)
    options = OPTIONS[name]
    torch_opt, torch_w, _ = _trajectory(torch, getattr(torch.optim, name), start, 3, **options)
    resumed_from = torch_w.detach().numpy().copy()
    w = eo.Parameter(resumed_from)
    ours = getattr(eo, name)([w], **options)
    ours.load_state_dict(torch_opt.state_dict())
    their_path, our_path = [], []
    for _ in range(3):
        torch_opt.zero_grad()
        _loss(torch_w).backward()
        torch_opt.step()
        their_path.append(torch_w.detach().numpy().copy())
        ours.zero_grad()
        _loss(w).backward()
        ours.step()
        our_path.append(w.data.copy())
    np.testing.assert_allclose(our_path, their_path, rtol=1e-10, atol=1e-12)


@pytest.mark.parametrize("step", [2.5, -1.0, float("nan"), "3"])
def test_a_step_that_is_not_a_count_is_refused(step):
    w = eo.Parameter(np.ones(2))
    optimizer = eo.Adam([w])
    (w * w).sum().backward()
    optimizer.step()
    state = optimizer.state_dict()
    state["state"][0]["step"] = np.array(step) if not isinstance(step, str) else step
    before = {k: np.array(v, copy=True) for k, v in optimizer.state[w].items()}
    with pytest.raises(EveryOError, match="step"):
        optimizer.load_state_dict(state)
    for key, value in before.items():
        np.testing.assert_array_equal(optimizer.state[w][key], value)


def test_adamw_refuses_coupled_weight_decay_from_a_state():
    w = eo.Parameter([1.0])
    optimizer = eo.AdamW([w])
    state = optimizer.state_dict()
    assert state["param_groups"][0]["decoupled_weight_decay"] is True
    state["param_groups"][0]["decoupled_weight_decay"] = False
    with pytest.raises(EveryOError, match="decoupled_weight_decay"):
        optimizer.load_state_dict(state)
    assert optimizer.param_groups[0]["decoupled_weight_decay"] is True
    with pytest.raises(EveryOError, match="decoupled_weight_decay"):
        eo.AdamW([w], decoupled_weight_decay=False)
    assert eo.AdamW([w], **optimizer.defaults).defaults == optimizer.defaults


@pytest.mark.parametrize("name", NAMES + ("LBFGS",))
def test_every_default_is_pytorchs(name, torch):
    """A port that leaves an argument out trains as it did under PyTorch (SGD's lr is 1e-3
    since PyTorch 2.x: an unspecified lr must not silently be ten times larger)."""
    ours = inspect.signature(getattr(eo, name).__init__).parameters
    theirs = inspect.signature(getattr(torch.optim, name).__init__).parameters
    for argument, parameter in theirs.items():
        if argument in ("self", "params") or parameter.default is inspect.Parameter.empty:
            continue
        assert argument in ours, f"{name} lacks PyTorch's {argument}="
        assert ours[argument].default == parameter.default, (name, argument)
