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
    with pytest.raises(eo.EveryOError, match="lr must be a non-negative number"):
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


GROUP_CONFIGS = [
    ("SGD", {"lr": 0.05, "momentum": 0.9},
     [{"weight_decay": 0.1, "nesterov": True}, {"lr": 0.01, "dampening": 0.0}]),
    ("SGD", {"lr": 0.05}, [{"momentum": 0.5, "dampening": 0.2}, {"weight_decay": 0.3}]),
    ("Adam", {"lr": 0.01}, [{"weight_decay": 0.1, "betas": (0.8, 0.99)}, {"amsgrad": True}]),
    ("AdamW", {"lr": 3e-3}, [{"weight_decay": 0.1}, {"weight_decay": 0.0, "eps": 1e-6}]),
    ("AdamW", {"lr": 3e-3, "amsgrad": True}, [{"lr": 1e-2}, {"betas": (0.5, 0.9)}]),
]


def _bowl(p):
    """A loss with a minimum (gradient steps converge), so 20 steps stay finite."""
    return (p * p).sum() + (p * p * p * p).sum() * 0.1 + (p * 0.5).sum()


def _group_params(make, rng_seed=0):
    rng = np.random.default_rng(rng_seed)
    return [make(rng.standard_normal(shape)) for shape in ((3, 4), (4,), (2, 2))]


@pytest.mark.parametrize("name,defaults,groups", GROUP_CONFIGS,
                         ids=[f"{n}-{i}" for i, (n, _, _) in enumerate(GROUP_CONFIGS)])
def test_parameter_groups_match_pytorch_over_20_steps(name, defaults, groups, torch):
    ours = _group_params(eo.Parameter)
    theirs = _group_params(lambda a: torch.tensor(a, requires_grad=True))

    def build(params, optim):
        return optim([{"params": params[:2], **groups[0]}, {"params": [params[2]], **groups[1]}],
                     **defaults)

    opt, torch_opt = build(ours, getattr(eo, name)), build(theirs, getattr(torch.optim, name))
    for _ in range(20):
        for params, optimizer in ((ours, opt), (theirs, torch_opt)):
            optimizer.zero_grad()
            sum(_bowl(p) for p in params).backward()
            optimizer.step()
    for ours_p, theirs_p in zip(ours, theirs):
        assert np.isfinite(ours_p.data).all()
        np.testing.assert_allclose(ours_p.data, theirs_p.detach().numpy(), rtol=1e-10,
                                   atol=1e-12)
    for ours_group, theirs_group in zip(opt.param_groups, torch_opt.param_groups):
        for key, value in theirs_group.items():
            if key in ours_group and key != "params":
                assert ours_group[key] == value, key


def test_param_groups_take_defaults_and_add_param_group():
    a, b, c = eo.Parameter([1.0]), eo.Parameter([2.0]), eo.Parameter([3.0])
    opt = eo.AdamW([{"params": [a], "weight_decay": 0.1}, {"params": [b]}], lr=3e-4)
    assert [g["weight_decay"] for g in opt.param_groups] == [0.1, 0.01]
    assert [g["lr"] for g in opt.param_groups] == [3e-4, 3e-4]
    opt.add_param_group({"params": c, "lr": 1.0})
    assert opt.param_groups[2]["params"] == [c] and opt.param_groups[2]["lr"] == 1.0
    assert opt.param_groups[2]["betas"] == (0.9, 0.999)
    with pytest.raises(eo.EveryOError, match="more than one parameter group"):
        opt.add_param_group({"params": [a]})
    with pytest.raises(eo.EveryOError, match="different values"):
        opt.lr  # the groups disagree
    opt.lr = 0.5  # sets every group
    assert opt.lr == 0.5 and all(g["lr"] == 0.5 for g in opt.param_groups)
    with pytest.raises(eo.EveryOError, match="single tensor"):
        eo.SGD(a)
    with pytest.raises(eo.EveryOError, match="no 'params'"):
        eo.SGD([{"lr": 0.1}])


def test_group_state_dict_round_trip_through_a_file(tmp_path):
    def fresh():
        params = _group_params(eo.Parameter, rng_seed=4)
        opt = eo.Adam([{"params": params[:1], "lr": 0.02}, {"params": params[1:],
                                                             "weight_decay": 0.1}], lr=0.01)
        return params, opt

    def train(params, opt, steps):
        for _ in range(steps):
            opt.zero_grad()
            sum(_bowl(p) for p in params).backward()
            opt.step()

    straight, opt = fresh()
    train(straight, opt, 8)
    params, opt = fresh()
    train(params, opt, 3)
    opt.param_groups[0]["lr"] = 0.02  # unchanged, but a group value written by hand survives
    eo.save({"params": [p.data for p in params], "optimizer": opt.state_dict()},
            tmp_path / "ckpt.npz")
    checkpoint = eo.load(tmp_path / "ckpt.npz")
    resumed, opt2 = fresh()
    for p, saved in zip(resumed, checkpoint["params"]):
        p.data[...] = saved
    opt2.load_state_dict(checkpoint["optimizer"])
    assert opt2.state_dict()["param_groups"] == opt.state_dict()["param_groups"]
    train(resumed, opt2, 5)
    for a, b in zip(resumed, straight):
        np.testing.assert_array_equal(a.data, b.data)


def test_load_state_dict_refuses_mismatched_groups():
    a, b = eo.Parameter([1.0]), eo.Parameter([2.0])
    two = eo.SGD([{"params": [a]}, {"params": [b]}], lr=0.1)
    one = eo.SGD([a, b], lr=0.1)
    with pytest.raises(eo.EveryOError, match="2 parameter groups"):
        one.load_state_dict(two.state_dict())


@pytest.mark.parametrize("write", ["step", "init"])
def test_in_place_writes_bump_the_version_counter(write):
    # A graph that saved w before an in-place write must refuse to run backward.
    w = eo.Parameter(np.array([1.0, 2.0]))
    loss = (w * w).sum()
    if write == "step":
        w.grad = np.ones(2)
        eo.Adam([w], lr=0.1).step()
    else:
        eo.init.normal_(w, generator=np.random.default_rng(0))
    with pytest.raises(eo.EveryOError, match="modified in place"):
        loss.backward()


def test_bad_betas_and_incomplete_states_are_refused_up_front():
    w = eo.Parameter(np.zeros(2))
    # betas=(0.9,) was accepted and failed inside step() with a ValueError; 0.9 a TypeError
    for betas in ((0.9,), 0.9, (0.9, 0.99, 0.5)):
        with pytest.raises(eo.EveryOError, match="betas must be two numbers"):
            eo.Adam([w], betas=betas)
    with pytest.raises(eo.EveryOError, match=r"missing keys \['param_groups', 'state'\]"):
        eo.SGD([w]).load_state_dict({"type": "SGD"})  # a KeyError before


@pytest.mark.parametrize("make", [lambda ps: eo.SGD(ps, lr=0.1, momentum=0.9, nesterov=True),
                                  lambda ps: eo.Adam([{"params": ps[:1]},
                                                      {"params": ps[1:], "lr": 0.01}])])
def test_stepping_parameters_bucket_by_bucket_is_one_step(make):
    # (what DistributedDataParallel(optimizer=) does as each bucket's averages land)
    rng = np.random.default_rng(0)
    arrays = [rng.standard_normal(shape).astype(np.float32) for shape in [(3, 4), (4,), (2,)]]
    grads = [rng.standard_normal(a.shape).astype(np.float32) for a in arrays]
    runs = []
    for split in (False, True):
        params = [eo.Parameter(a.copy()) for a in arrays]
        optimizer = make(params)
        for _ in range(3):
            for p, g in zip(params, grads):
                p.grad = g.copy()
            if split:
                optimizer.step_parameters([params[2], params[0]])
                optimizer.step_parameters([params[1]], count=False)
            else:
                optimizer.step()
        runs.append(([p.data.tobytes() for p in params], optimizer.step_count))
    assert runs[0] == runs[1]
