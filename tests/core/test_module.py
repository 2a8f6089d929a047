"""Module, Parameter and Sequential."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


class Affine(eo.Module):
    def __init__(self, n_in, n_out):
        super().__init__()
        self.weight = eo.Parameter(np.full((n_in, n_out), 0.5, np.float32))
        self.bias = eo.Parameter(np.zeros(n_out, np.float32))
        self.register_buffer("calls", np.zeros((), np.int64))

    def forward(self, x):
        self.calls = self.calls + 1
        return eo.matmul(x, self.weight, bias=self.bias)


class Net(eo.Module):
    def __init__(self):
        super().__init__()
        self.body = eo.Sequential(Affine(3, 4), Affine(4, 2))
        self.scale = eo.Parameter([1.0])

    def forward(self, x):
        return self.body(x) * self.scale


def test_parameters_modules_and_names():
    net = Net()
    names = [name for name, _ in net.named_parameters()]
    assert names == ["scale", "body.0.weight", "body.0.bias", "body.1.weight", "body.1.bias"]
    assert len(list(net.parameters())) == 5
    assert [type(m).__name__ for m in net.modules()] == ["Net", "Sequential", "Affine", "Affine"]
    assert isinstance(net.body[0], Affine) and len(net.body) == 2
    assert isinstance(net.body[0:1], eo.Sequential)


def test_train_eval_and_zero_grad():
    net = Net()
    assert all(m.training for m in net.modules())
    net.eval()
    assert not any(m.training for m in net.modules())
    net.train()
    net(eo.ones(2, 3)).sum().backward()
    assert all(p.grad is not None for p in net.parameters())
    net.zero_grad()
    assert all(p.grad is None for p in net.parameters())


def test_state_dict_round_trip_and_buffers():
    net = Net()
    net(eo.ones(1, 3))
    state = net.state_dict()
    assert list(state) == ["scale", "body.0.weight", "body.0.bias", "body.1.weight",
                           "body.1.bias", "body.0.calls", "body.1.calls"]
    assert state["body.0.calls"] == 1
    other = Net()
    weight_before = other.body[0].weight
    other.load_state_dict({**state, "scale": np.array([3.0])})
    assert other.body[0].weight is weight_before  # loaded in place
    assert other.scale.data[0] == 3.0 and other.scale.dtype == "float32"
    assert other.body[1].calls == 1
    state["body.0.weight"][...] = 99  # a copy, not the live array
    assert net.body[0].weight.data.max() == 0.5


def test_load_state_dict_names_every_problem_and_changes_nothing():
    net = Net()
    state = net.state_dict()
    del state["scale"]
    state["extra"] = np.zeros(1)
    state["body.0.weight"] = np.zeros((5, 5))
    before = net.body[0].bias.data.copy()
    state["body.0.bias"] = before + 1
    with pytest.raises(eo.EveryOError) as info:
        net.load_state_dict(state)
    message = str(info.value)
    assert "missing keys ['scale']" in message and "unexpected keys ['extra']" in message
    assert "'body.0.weight' has shape (5, 5) in the state but (3, 4) in the model" in message
    np.testing.assert_array_equal(net.body[0].bias.data, before)


def test_to_float64_converts_parameters_and_buffers():
    class WithStats(eo.Module):
        def __init__(self):
            super().__init__()
            self.w = eo.Parameter([1.0])
            self.register_buffer("running", np.zeros(2, np.float32))

    m = WithStats().to("float64")
    assert m.w.dtype == "float64" and m.running.dtype == np.float64


def test_sequential_refuses_non_modules():
    with pytest.raises(eo.EveryOError, match="position 1"):
        eo.Sequential(Affine(1, 1), lambda x: x)


def test_forgetting_super_init_is_a_clear_error():
    class Broken(eo.Module):
        def __init__(self):
            self.w = eo.Parameter([1.0])

    with pytest.raises(eo.EveryOError, match="super\\(\\).__init__"):
        Broken()
