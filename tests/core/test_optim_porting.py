"""LBFGS, Adagrad, RMSprop and Adadelta follow PyTorch's trajectories in float64 and
checkpoint their state."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def rosenbrock(x, lib):
    """The n-dimensional Rosenbrock function, on EveryO tensors or torch tensors."""
    return (100 * (x[1:] - x[:-1] ** 2) ** 2 + (1 - x[:-1]) ** 2).sum()


START = np.array([-1.2, 1.0, -0.5, 0.8, 1.5])


def closure_of(optimizer, x, lib=eo):
    """The closure LBFGS calls: zero the gradients, the loss at ``x``, its backward."""
    def closure():
        optimizer.zero_grad()
        loss = rosenbrock(x, lib)
        loss.backward()
        return loss
    return closure


def _lbfgs_trajectory(make, steps, x, lib):
    """Parameters after each ``step(closure)`` of the optimizer ``make(params)``."""
    optimizer = make([x])
    path = []
    for _ in range(steps):
        optimizer.step(closure_of(optimizer, x, lib))
        path.append(np.array(x.detach().numpy() if hasattr(x, "detach") else x.data))
    return optimizer, np.array(path)


@pytest.mark.parametrize("options", [
    {}, {"line_search_fn": "strong_wolfe"},
    {"line_search_fn": "strong_wolfe", "history_size": 3, "max_iter": 7},
    {"lr": 0.05, "history_size": 4, "max_iter": 5, "max_eval": 6},
])
def test_lbfgs_follows_pytorch_on_rosenbrock(options):
    torch = pytest.importorskip("torch")
    ours_x = eo.Parameter(START.copy())
    theirs_x = torch.tensor(START.copy(), requires_grad=True)
    ours, ours_path = _lbfgs_trajectory(lambda p: eo.LBFGS(p, **options), 6, ours_x, eo)
    theirs, theirs_path = _lbfgs_trajectory(lambda p: torch.optim.LBFGS(p, **options), 6,
                                            theirs_x, torch)
    np.testing.assert_allclose(ours_path, theirs_path, rtol=1e-10, atol=1e-10)
    ours_state = ours.state[ours_x]
    theirs_state = theirs.state[theirs.param_groups[0]["params"][0]]
    assert ours_state["func_evals"] == theirs_state["func_evals"]
    assert ours_state["n_iter"] == theirs_state["n_iter"]


def test_lbfgs_resumes_from_its_state_dict(tmp_path):
    def run(optimizer, x, steps):
        for _ in range(steps):
            optimizer.step(closure_of(optimizer, x))

    options = dict(line_search_fn="strong_wolfe", history_size=4, max_iter=3)
    straight_x = eo.Parameter(START.copy())
    run(eo.LBFGS([straight_x], **options), straight_x, 6)
    x = eo.Parameter(START.copy())
    first = eo.LBFGS([x], **options)
    run(first, x, 3)
    eo.save({"optimizer": first.state_dict(), "x": x.data}, tmp_path / "lbfgs.npz")
    saved = eo.load(tmp_path / "lbfgs.npz")
    resumed_x = eo.Parameter(saved["x"])
    resumed = eo.LBFGS([resumed_x], **options)
    resumed.load_state_dict(saved["optimizer"])
    run(resumed, resumed_x, 3)
    np.testing.assert_array_equal(resumed_x.data, straight_x.data)


def test_lbfgs_refuses_what_pytorch_refuses():
    a, b = eo.Parameter([1.0]), eo.Parameter([2.0])
    with pytest.raises(eo.EveryOError, match="per-parameter options"):
        eo.LBFGS([{"params": [a]}, {"params": [b]}])
    with pytest.raises(eo.EveryOError, match="line_search_fn must be None or 'strong_wolfe'"):
        eo.LBFGS([a], line_search_fn="armijo")
    with pytest.raises(eo.EveryOError, match="needs a closure"):
        eo.LBFGS([a]).step()


ADAPTIVE = [
    ("Adagrad", {}), ("Adagrad", {"lr": 0.1, "lr_decay": 0.01, "weight_decay": 0.1,
                                  "initial_accumulator_value": 0.5, "eps": 1e-8}),
    ("RMSprop", {}), ("RMSprop", {"momentum": 0.9}), ("RMSprop", {"centered": True}),
    ("RMSprop", {"lr": 0.003, "alpha": 0.9, "momentum": 0.5, "centered": True,
                 "weight_decay": 0.01, "eps": 1e-6}),
    ("Adadelta", {}), ("Adadelta", {"lr": 0.5, "rho": 0.8, "eps": 1e-5, "weight_decay": 0.1}),
]


def _trajectory(optimizer_class, options, params, loss_of, steps=30):
    optimizer = optimizer_class(params, **options)
    path = []
    for _ in range(steps):
        optimizer.zero_grad()
        loss_of(params).backward()
        optimizer.step()
        path.append(np.concatenate([np.array(p.detach().numpy() if hasattr(p, "detach")
                                             else p.data).ravel() for p in params]))
    return optimizer, np.array(path)


@pytest.mark.parametrize("name, options", ADAPTIVE)
def test_adaptive_optimizers_follow_pytorch(name, options):
    torch = pytest.importorskip("torch")
    rng = np.random.default_rng(0)
    w0, b0 = rng.standard_normal((3, 2)), rng.standard_normal(2)
    x = rng.standard_normal((5, 3))

    def loss(params, lib_x):
        w, b = params
        return (((lib_x @ w + b) ** 2).sum() + (w ** 4).sum()) / 5

    ours_params = [eo.Parameter(w0.copy()), eo.Parameter(b0.copy())]
    theirs_params = [torch.tensor(w0.copy(), requires_grad=True),
                     torch.tensor(b0.copy(), requires_grad=True)]
    _, ours = _trajectory(getattr(eo, name), options, ours_params,
                          lambda p: loss(p, eo.tensor(x)))
    _, theirs = _trajectory(getattr(torch.optim, name), options, theirs_params,
                            lambda p: loss(p, torch.tensor(x)))
    np.testing.assert_allclose(ours, theirs, rtol=1e-12, atol=1e-12)


@pytest.mark.parametrize("name, options", ADAPTIVE)
def test_adaptive_optimizers_resume_bit_for_bit(name, options, tmp_path):
    rng = np.random.default_rng(1)
    w0 = rng.standard_normal((4,))

    def run(optimizer, w, steps):
        for _ in range(steps):
            optimizer.zero_grad()
            ((w - 0.5) ** 2 * eo.tensor(np.arange(1.0, 5.0))).sum().backward()
            optimizer.step()

    straight = eo.Parameter(w0.copy())
    run(getattr(eo, name)([straight], **options), straight, 10)
    w = eo.Parameter(w0.copy())
    first = getattr(eo, name)([w], **options)
    run(first, w, 5)
    eo.save({"optimizer": first.state_dict(), "w": w.data}, tmp_path / "opt.npz")
    saved = eo.load(tmp_path / "opt.npz")
    resumed_w = eo.Parameter(saved["w"])
    resumed = getattr(eo, name)([resumed_w], **options)
    resumed.load_state_dict(saved["optimizer"])
    run(resumed, resumed_w, 5)
    np.testing.assert_array_equal(resumed_w.data, straight.data)


def test_pytorchs_defaults():
    w = [eo.Parameter([1.0])]
    hints = dict(foreach=None, maximize=False, differentiable=False)  # PyTorch's too
    assert eo.Adagrad(w).defaults == dict(lr=1e-2, lr_decay=0.0, weight_decay=0.0,
                                          initial_accumulator_value=0.0, eps=1e-10, fused=None,
                                          **hints)
    assert eo.RMSprop(w).defaults == dict(lr=1e-2, alpha=0.99, eps=1e-8, weight_decay=0.0,
                                          momentum=0.0, centered=False, capturable=False,
                                          **hints)
    assert eo.Adadelta(w).defaults == dict(lr=1.0, rho=0.9, eps=1e-6, weight_decay=0.0,
                                           capturable=False, **hints)
    lbfgs = eo.LBFGS(w).defaults
    assert (lbfgs["max_iter"], lbfgs["max_eval"], lbfgs["history_size"]) == (20, 25, 100)
    with pytest.raises(eo.EveryOError, match="rho must be in"):
        eo.Adadelta(w, rho=1.5)
    with pytest.raises(eo.EveryOError, match="RMSprop: lr must be"):
        eo.RMSprop(w, lr=-1.0)


def test_lbfgs_refuses_a_history_that_does_not_fit_before_changing_anything():
    x = eo.Parameter(START.copy())
    optimizer = eo.LBFGS([x], max_iter=2)
    optimizer.step(closure_of(optimizer, x))
    good = optimizer.state_dict()
    bad = optimizer.state_dict()
    bad["state"][0]["d"] = np.zeros(3)
    bad["param_groups"][0]["lr"] = 0.5
    with pytest.raises(eo.EveryOError, match="'d' has 3 entries, the parameters 5"):
        optimizer.load_state_dict(bad)
    assert optimizer.param_groups[0]["lr"] == 1.0
    np.testing.assert_array_equal(optimizer.state[x]["d"], good["state"][0]["d"])


@pytest.mark.parametrize("name, value", [("max_iter", 0), ("history_size", 2.5),
                                         ("max_eval", True)])
def test_lbfgs_counts_are_positive_ints(name, value):
    with pytest.raises(eo.EveryOError, match=f"{name} must be a positive int"):
        eo.LBFGS([eo.Parameter([1.0])], **{name: value})


def _stepped_lbfgs():
    x = eo.Parameter(START.copy())
    optimizer = eo.LBFGS([x], line_search_fn="strong_wolfe", history_size=3, max_iter=4)
    optimizer.step(closure_of(optimizer, x))
    return optimizer, x


def _with(state, **buffers):
    state = {**state, "state": {0: {**state["state"][0], **buffers}}}
    for name, value in buffers.items():
        if value is None:
            del state["state"][0][name]
    return state


@pytest.mark.parametrize("corrupt", [
    lambda s: 1.5, lambda s: None, lambda s: {**s, "state": 2.0},
    lambda s: _with(s, n_iter="x"), lambda s: _with(s, n_iter=np.zeros(3)),
    lambda s: _with(s, func_evals=2.5), lambda s: _with(s, n_iter=-1),
    lambda s: _with(s, t=None), lambda s: _with(s, t="x"), lambda s: _with(s, t=float("nan")),
    lambda s: _with(s, t=np.zeros(3)), lambda s: _with(s, H_diag=float("inf")),
    lambda s: _with(s, d=None), lambda s: _with(s, prev_flat_grad=None),
    lambda s: _with(s, d=np.ones(5) * 1j), lambda s: _with(s, old_dirs=None),
    lambda s: _with(s, ro=[]), lambda s: _with(s, ro={}), lambda s: _with(s, ro=[float("nan")]),
    lambda s: _with(s, old_stps=[]),
    lambda s: {**s, "param_groups": [{**s["param_groups"][0], "line_search_fn": np.ones(2)}]},
])
def test_a_corrupted_lbfgs_state_is_refused_by_name_and_changes_nothing(corrupt):
    # the LBFGS loader read state.get(...) before any check (raw AttributeError), kept counts,
    # steps and histories it never checked (raw TypeError/KeyError/IndexError at the next
    # step), and cast a complex direction to real with a ComplexWarning
    source, _ = _stepped_lbfgs()
    target, x = _stepped_lbfgs()
    before = target.state_dict()
    with pytest.raises(eo.EveryOError, match="LBFGS"):
        target.load_state_dict(corrupt(source.state_dict()))
    after = target.state_dict()
    assert after["state"].keys() == before["state"].keys()
    for name, value in before["state"][0].items():
        np.testing.assert_array_equal(np.asarray(after["state"][0][name]), np.asarray(value))
    assert after["param_groups"] == before["param_groups"]
    target.step(closure_of(target, x))  # (still usable)


def test_lbfgs_with_a_line_search_refuses_a_zero_lr():
    # lr=0 made the strong-Wolfe search interpolate between two equal steps: a raw
    # ZeroDivisionError at the first step
    with pytest.raises(eo.EveryOError, match="LBFGS: lr must be positive"):
        eo.LBFGS([eo.Parameter([1.0])], lr=0.0, line_search_fn="strong_wolfe")
