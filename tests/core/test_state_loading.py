"""One validated loader for every core state (Module, optimizers, DataLoader, RNG): a state
names its class, every value is checked by the constructor's own rules before anything
changes, and a refusal is a named EveryOError (docs/checkpoints.md)."""

from __future__ import annotations

import copy

import numpy as np
import pytest

import everyo as eo


class Net(eo.Module):
    def __init__(self):
        super().__init__()
        self.a = eo.Parameter(np.ones((2, 3)))
        self.b = eo.Parameter(np.ones(3))
        self.register_buffer("count", np.zeros((), dtype=np.int64))


def snapshot(module):
    return {k: v.copy() for k, v in module.state_dict().items()}


def assert_unchanged(module, before):
    after = module.state_dict()
    assert set(after) == set(before)
    for key in before:
        np.testing.assert_array_equal(after[key], before[key])
        assert after[key].dtype == before[key].dtype


# -- Module ------------------------------------------------------------------------------------
def test_module_load_returns_missing_and_unexpected_keys():
    net = Net()
    result = net.load_state_dict(Net().state_dict())
    assert result == ([], []) and result.missing_keys == [] and result.unexpected_keys == []
    assert type(result).__name__ == "IncompatibleKeys"


def test_module_load_reports_the_keys_pytorch_reports():
    torch = pytest.importorskip("torch")
    ours = eo.Sequential(eo.Linear(3, 2, seed=0), eo.ReLU(), eo.Linear(2, 1, seed=1))
    theirs = torch.nn.Sequential(torch.nn.Linear(3, 2), torch.nn.ReLU(), torch.nn.Linear(2, 1))
    state = dict(ours.state_dict())
    del state["0.bias"], state["2.weight"]
    state["z.extra"] = np.zeros(1, np.float32)
    state["a.extra"] = np.zeros(1, np.float32)
    their_state = {k: torch.from_numpy(np.asarray(v)) for k, v in state.items()}
    for name in ("0.weight",):
        their_state[name] = their_state[name].T.contiguous()  # (in, out) vs (out, in)
    expected = theirs.load_state_dict(their_state, strict=False)
    result = ours.load_state_dict(state, strict=False)
    assert (result.missing_keys, result.unexpected_keys) == (
        list(expected.missing_keys), list(expected.unexpected_keys))


def test_module_load_non_strict_loads_the_intersection():
    net = Net()
    result = net.load_state_dict({"a": np.full((2, 3), 5.0), "extra": np.zeros(1)}, strict=False)
    assert result.missing_keys == ["b", "count"] and result.unexpected_keys == ["extra"]
    np.testing.assert_array_equal(net.a.data, np.full((2, 3), 5.0))
    np.testing.assert_array_equal(net.b.data, np.ones(3))


@pytest.mark.parametrize("bad, words", [
    (np.array(["x", "y", "z"]), "'b'"),              # strings: raw ValueError after writing 'a'
    (np.ones(3) + 1j, "complex"),                     # complex into a real parameter
    ({"nested": 1}, "'b'"),                           # not an array at all
])
def test_module_load_checks_every_value_before_changing_anything(bad, words):
    net = Net()
    before = snapshot(net)
    state = {"a": np.full((2, 3), 7.0), "b": bad, "count": np.array(3)}
    with pytest.raises(eo.EveryOError, match=words):
        net.load_state_dict(state)
    assert_unchanged(net, before)


def test_module_load_refuses_a_fractional_value_for_an_integer_buffer():
    net = Net()
    before = snapshot(net)
    with pytest.raises(eo.EveryOError, match="'count'"):
        net.load_state_dict({"a": np.zeros((2, 3)), "b": np.zeros(3), "count": np.array(2.5)})
    assert_unchanged(net, before)


def test_module_load_of_a_non_mapping_is_named():
    with pytest.raises(eo.EveryOError, match="Net.load_state_dict"):
        Net().load_state_dict([("a", np.zeros((2, 3)))])


def test_module_load_with_non_string_keys_is_named():
    net = Net()
    state = dict(net.state_dict())
    state[3] = np.zeros(1)
    with pytest.raises(eo.EveryOError, match="unexpected keys"):
        net.load_state_dict(state)


# -- optimizers ----------------------------------------------------------------------------------
@pytest.mark.parametrize("cls", [eo.Adam, eo.AdamW, eo.SGD])
@pytest.mark.parametrize("option", ["lr", "eps", "weight_decay", "momentum"])
@pytest.mark.parametrize("value", [float("nan"), float("inf"), "0.1"])
def test_optimizers_refuse_non_finite_options_by_name(cls, option, value):
    if option not in cls([eo.Parameter([1.0])]).defaults:
        pytest.skip(f"{cls.__name__} has no {option}")
    with pytest.raises(eo.EveryOError, match=f"{cls.__name__}: {option} must be"):
        cls([eo.Parameter([1.0])], **{option: value})


@pytest.mark.parametrize("betas", [(float("nan"), 0.999), (0.9, float("inf")), ("a", 0.9)])
def test_adam_refuses_bad_betas_by_name(betas):
    with pytest.raises(eo.EveryOError, match="Adam: betas"):
        eo.Adam([eo.Parameter([1.0])], betas=betas)


def trained_adam():
    w = eo.Parameter(np.ones(3))
    opt = eo.Adam([w], lr=0.1)
    (w * w).sum().backward()
    opt.step()
    return w, opt


@pytest.mark.parametrize("corrupt, words", [
    (lambda s: s["param_groups"][0].update(lr=float("nan")), "Adam: lr must be"),
    (lambda s: s["param_groups"][0].update(eps="1e-8"), "Adam: eps must be"),
    (lambda s: s["state"][0].update(exp_avg=np.array(["a", "b", "c"])), "exp_avg"),
    (lambda s: s["state"][0].update(exp_avg_sq=np.ones(3) * 1j), "exp_avg_sq"),
    (lambda s: s["state"][0].update(step=-1), "step"),
    (lambda s: s.update(step_count="3"), "step_count"),
    # a step reads these together: loaded half, the next step() was a raw KeyError
    (lambda s: s["state"][0].pop("exp_avg_sq"), "parameter 0 has 'exp_avg' but not "
                                                 "\\['exp_avg_sq'\\]"),
    (lambda s: s["param_groups"][0].update(amsgrad=True), "not \\['max_exp_avg_sq'\\]"),
])
def test_optimizer_load_checks_everything_before_changing_anything(corrupt, words):
    w, opt = trained_adam()
    state = copy.deepcopy(opt.state_dict())
    corrupt(state)
    before = copy.deepcopy(opt.state_dict())
    with pytest.raises(eo.EveryOError, match=words):
        opt.load_state_dict(state)
    after = opt.state_dict()
    assert after["param_groups"] == before["param_groups"]
    assert after["step_count"] == before["step_count"]
    for key, value in before["state"][0].items():
        np.testing.assert_array_equal(after["state"][0][key], value)


def test_optimizer_load_of_a_non_mapping_is_named():
    _, opt = trained_adam()
    with pytest.raises(eo.EveryOError, match="Adam.load_state_dict"):
        opt.load_state_dict(["not", "a", "state"])


def trained_lbfgs():
    w = eo.Parameter(np.ones(3))
    opt = eo.LBFGS([w], lr=0.5, max_iter=3)

    def loss():
        opt.zero_grad()
        value = (w * w).sum()
        value.backward()
        return value
    opt.step(loss)
    return opt


@pytest.mark.parametrize("corrupt, words", [  # each raised a raw exception before
    (lambda s: s["state"][0].update(ro=0.5), "'ro' must be a list"),
    (lambda s: s["state"][0].update(ro=["x"]), "'ro' must be a finite number"),
    (lambda s: s["state"][0].update(old_dirs=0.5), "'old_dirs' must be a list"),
    (lambda s: s["state"][0].update(d=np.ones(3) * 1j), "'d' is not a vector of real"),
    (lambda s: s.update(state=[0.5]), "'state' must be a dict"),
    (lambda s: s["param_groups"][0].update(line_search_fn=np.array(["a", "b"])),
     "line_search_fn must be None or 'strong_wolfe'"),
])
def test_lbfgs_load_checks_its_history_before_changing_anything(corrupt, words):
    opt = trained_lbfgs()
    state = copy.deepcopy(opt.state_dict())
    corrupt(state)
    before = repr(opt.state_dict())
    with pytest.raises(eo.EveryOError, match=words):
        opt.load_state_dict(state)
    assert repr(opt.state_dict()) == before


# -- DataLoader ------------------------------------------------------------------------------------
@pytest.mark.parametrize("batch_size", ["2", 2.5, True, 0, float("nan")])
def test_dataloader_refuses_a_batch_size_that_is_not_a_positive_int(batch_size):
    with pytest.raises(eo.EveryOError, match="DataLoader: batch_size must be a positive int"):
        eo.DataLoader(np.arange(10.0), batch_size=batch_size)


def half_read_loader(batch_size=2, with_iterator=False):
    loader = eo.DataLoader(np.arange(10.0), batch_size=batch_size, shuffle=True, seed=0)
    iterator = iter(loader)
    next(iterator)
    next(iterator)
    return (loader, iterator) if with_iterator else loader


def test_dataloader_refuses_a_state_saved_with_another_batch_size():
    state = half_read_loader(batch_size=2).state_dict()
    other = eo.DataLoader(np.arange(10.0), batch_size=3, shuffle=True, seed=0)
    with pytest.raises(eo.EveryOError, match="batch_size 2.*3|batch size"):
        other.load_state_dict(state)


@pytest.mark.parametrize("corrupt, words", [
    (lambda s: s.update(order=np.array([0, 0, 1, 2, 3, 4, 5, 6, 7, 8])), "order"),
    (lambda s: s.update(order=np.arange(10) + 0.5), "order"),
    (lambda s: s.update(position=99), "position"),
    (lambda s: s.update(position="1"), "position"),
    (lambda s: s["generator"].update(state={"state": "x", "inc": 1}), "generator"),
    (lambda s: s.update(type="Adam"), "'Adam'"),
])
def test_dataloader_load_checks_everything_before_changing_anything(corrupt, words):
    loader = half_read_loader()
    state = copy.deepcopy(loader.state_dict())
    corrupt(state)
    before = loader.state_dict()
    with pytest.raises(eo.EveryOError, match=words):
        loader.load_state_dict(state)
    after = loader.state_dict()
    np.testing.assert_array_equal(after["order"], before["order"])
    assert after["position"] == before["position"] and after["generator"] == before["generator"]


def test_dataloader_resume_still_gives_the_remaining_batches():
    loader, iterator = half_read_loader(with_iterator=True)
    state = copy.deepcopy(loader.state_dict())
    rest = [b.data.tolist() for b in iterator]
    resumed = eo.DataLoader(np.arange(10.0), batch_size=2, shuffle=True, seed=0)
    resumed.load_state_dict(state)
    assert [b.data.tolist() for b in resumed] == rest


# -- RNG -----------------------------------------------------------------------------------------
def test_set_rng_state_checks_every_generator_before_changing_any():
    class Seeded(eo.Module):
        def __init__(self):
            super().__init__()
            self.rng = np.random.default_rng(1)

    model = Seeded()
    state = copy.deepcopy(eo.get_rng_state(model))
    state["default"] = {"bit_generator": "PCG64", "state": "garbage", "has_uint32": 0,
                        "uinteger": 0}
    before_module = copy.deepcopy(model.rng.bit_generator.state)
    before_default = copy.deepcopy(eo.default_generator().bit_generator.state)
    model.rng.random()  # the saved module state now differs from the current one
    before_module = copy.deepcopy(model.rng.bit_generator.state)
    with pytest.raises(eo.EveryOError, match="default"):
        eo.set_rng_state(state, model)
    assert model.rng.bit_generator.state == before_module
    assert eo.default_generator().bit_generator.state == before_default


def test_set_rng_state_refuses_another_state():
    with pytest.raises(eo.EveryOError, match="'DataLoader'"):
        eo.set_rng_state({"type": "DataLoader", "default": {}, "modules": {}})
