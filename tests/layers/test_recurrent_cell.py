"""RNNCell, LSTMCell and GRUCell: the full layers' weights and op, so one step of a cell and of
a one-layer RNN/LSTM/GRU agree bit for bit; PyTorch's cells as the oracle (float32 and float64,
forward and every gradient), numerical gradients and second derivatives in float64."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.second_order import T, normal, second_order_tests

KINDS = ["RNN", "LSTM", "GRU"]
GATES = {"RNN": 1, "LSTM": 4, "GRU": 3}


def _cell(kind, *args, **kwargs):
    return getattr(eo, f"{kind}Cell")(*args, **kwargs)


def _flat(kind, result):
    return list(result) if kind == "LSTM" else [result]


def _state(kind, rng, *shape):
    parts = [rng.standard_normal(shape) for _ in range(2 if kind == "LSTM" else 1)]
    return parts


@pytest.mark.parametrize("kind", KINDS)
def test_same_seed_same_weights_and_one_step_agrees_bit_for_bit(kind, rng):
    cell, layer = _cell(kind, 3, 4, seed=7), getattr(eo, kind)(3, 4, return_state=True, seed=7)
    names = [n for n, _ in cell.named_parameters()]
    assert names == ["weight_ih", "weight_hh", "bias_ih", "bias_hh"]
    for name, param in cell.named_parameters():
        np.testing.assert_array_equal(param.data, getattr(layer, f"{name}_l0").data)
    x = rng.standard_normal((5, 3)).astype(np.float32)
    start = [s.astype(np.float32) for s in _state(kind, rng, 5, 4)]
    x_cell, x_layer = eo.tensor(x, requires_grad=True), eo.tensor(x[:, None], requires_grad=True)
    step = _flat(kind, cell(x_cell, tuple(start) if kind == "LSTM" else start[0]))
    layer_start = [s[None] for s in start]
    out, final = layer(x_layer, tuple(layer_start) if kind == "LSTM" else layer_start[0])
    final = [f[0] for f in _flat(kind, final)]
    np.testing.assert_array_equal(step[0].data, out.data[:, 0])
    for mine, theirs in zip(step, final):
        np.testing.assert_array_equal(mine.data, theirs.data)
    weights = [rng.standard_normal(s.shape).astype(np.float32) for s in step]
    sum((s * w).sum() for s, w in zip(step, weights)).backward()
    sum((f * w).sum() for f, w in zip(final, weights)).backward()
    np.testing.assert_array_equal(x_cell.grad, x_layer.grad[:, 0])
    for name, param in cell.named_parameters():
        np.testing.assert_array_equal(param.grad, getattr(layer, f"{name}_l0").grad)


@pytest.mark.parametrize("kind", KINDS)
def test_a_loop_of_cells_is_the_layer(kind, rng):
    cell = _cell(kind, 2, 3, seed=1).to("float64")
    layer = getattr(eo, kind)(2, 3, seed=1).to("float64")
    x = rng.standard_normal((4, 6, 2))
    state = None
    outputs = []
    for t in range(6):
        state = cell(x[:, t], state)
        outputs.append(state[0] if kind == "LSTM" else state)
    np.testing.assert_allclose(eo.stack(outputs, axis=1).data, layer(x).data, atol=1e-13)


@pytest.mark.torch
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("dtype, tol", [("float64", 1e-12), ("float32", 2e-6)])
@pytest.mark.parametrize("bias, with_state", [(True, True), (False, False), (True, False)])
def test_matches_torch_cells(torch, kind, dtype, tol, bias, with_state, rng):
    cell = _cell(kind, 3, 5, bias=bias, seed=2).to(dtype)
    ref = getattr(torch.nn, f"{kind}Cell")(3, 5, bias=bias).to(getattr(torch, dtype))
    with torch.no_grad():
        for name, param in cell.named_parameters():
            getattr(ref, name).copy_(torch.from_numpy(param.data.T.copy() if param.ndim == 2
                                                      else param.data))
    x = rng.standard_normal((4, 3)).astype(dtype)
    state = [s.astype(dtype) for s in _state(kind, rng, 4, 5)] if with_state else []
    mine = [eo.tensor(a, requires_grad=True) for a in [x] + state]
    theirs = [torch.tensor(a, requires_grad=True) for a in [x] + state]
    pack = (lambda s: tuple(s) if kind == "LSTM" else s[0]) if with_state else (lambda s: None)
    out, ref_out = _flat(kind, cell(mine[0], pack(mine[1:]))), _flat(
        kind, ref(theirs[0], pack(theirs[1:])))
    loss, ref_loss = 0.0, 0.0
    for o, r in zip(out, ref_out):
        np.testing.assert_allclose(o.data, r.detach().numpy(), rtol=tol, atol=tol)
        w = rng.standard_normal(o.shape).astype(dtype)
        loss, ref_loss = loss + (o * w).sum(), ref_loss + (r * torch.from_numpy(w)).sum()
    loss.backward()
    ref_loss.backward()
    for m, t in zip(mine, theirs):
        np.testing.assert_allclose(m.grad, t.grad.numpy(), rtol=tol * 10, atol=tol * 10)
    for name, param in cell.named_parameters():
        expected = getattr(ref, name).grad.numpy()
        np.testing.assert_allclose(param.grad, expected.T if expected.ndim == 2 else expected,
                                   rtol=tol * 10, atol=tol * 10, err_msg=name)
    assert len(list(cell.parameters())) == (4 if bias else 2)


@pytest.mark.parametrize("kind", KINDS)
def test_gradcheck_input_state_and_parameters(kind, rng):
    cell = _cell(kind, 2, 3, seed=3).to("float64")
    if kind == "RNN":
        relu = eo.RNNCell(2, 3, nonlinearity="relu", seed=3).to("float64")
        assert eo.gradcheck(relu, rng.standard_normal((4, 2)) + 0.5,
                            params=list(relu.parameters()))

    def run(x, *state):
        out = _flat(kind, cell(x, tuple(state) if kind == "LSTM" else state[0]))
        return eo.concatenate([o.reshape(-1) for o in out])

    assert eo.gradcheck(run, rng.standard_normal((4, 2)), *_state(kind, rng, 4, 3),
                        params=list(cell.parameters()))


def test_unbatched_input_and_bias_false():
    cell = eo.LSTMCell(3, 2, bias=False, seed=0)
    h, c = cell(eo.ones(3))
    assert h.shape == c.shape == (2,)
    h2, _ = cell(eo.ones(1, 3))
    np.testing.assert_array_equal(h.data, h2.data[0])
    assert cell(eo.ones(3), (h, c))[0].shape == (2,)
    assert [n for n, _ in cell.named_parameters()] == ["weight_ih", "weight_hh"]


@pytest.mark.parametrize("build, x, state, problem", [
    (lambda: eo.LSTMCell(3, 2), np.ones((4, 5), np.float32), None,
     r"LSTMCell\(3→2\): expected input \(batch, 3\) or \(3,\), got shape \(4, 5\)"),
    (lambda: eo.GRUCell(3, 2), np.ones((4, 1, 3), np.float32), None, r"GRUCell.*\(4, 1, 3\)"),
    (lambda: eo.RNNCell(3, 2), np.ones((4, 3), np.int64), None, "RNNCell.*floating-point"),
    (lambda: eo.RNNCell(3, 2), np.ones((4, 3), np.float32), np.ones((5, 2), np.float32),
     r"RNNCell\(3→2\): expected a state of shape \(4, 2\).*got \(5, 2\)"),
    (lambda: eo.LSTMCell(3, 2), np.ones((4, 3), np.float32), np.ones((4, 2), np.float32),
     r"LSTMCell.*the state is a pair \(h, c\)"),
    (lambda: eo.LSTMCell(3, 2), np.ones(3, np.float32),
     (np.ones((1, 2), np.float32),) * 2, r"LSTMCell.*shape \(2,\) \(the input is unbatched\)"),
])
def test_bad_input_names_the_cell(build, x, state, problem):
    with pytest.raises(eo.EveryOError, match=problem):
        build()(x, state)


def test_bad_constructor_arguments_name_the_cell():
    with pytest.raises(eo.EveryOError, match="RNNCell: nonlinearity"):
        eo.RNNCell(2, 3, nonlinearity="sigmoid")
    with pytest.raises(eo.EveryOError, match="GRUCell: hidden_size"):
        eo.GRUCell(2, 0)


def _torch_cell(kind, relu=False):
    """PyTorch's functional cell on EveryO's layout: (x, *state, w_ih, w_hh, b_ih, b_hh)."""
    def run(x, *rest):
        torch = T()
        states, (w_ih, w_hh, b_ih, b_hh) = rest[:-4], rest[-4:]
        weights = (w_ih.T, w_hh.T, b_ih, b_hh)
        if kind == "LSTM":
            h, c = torch.lstm_cell(x[:, 0], tuple(s for s in states), *weights)
            return torch.stack([h, c], dim=1)
        step = {"GRU": torch.gru_cell, "RNN": torch.rnn_relu_cell if relu
                else torch.rnn_tanh_cell}[kind]
        return step(x[:, 0], states[0], *weights)[:, None]
    return run


def _case(kind, relu=False):
    states = 2 if kind == "LSTM" else 1
    width = GATES[kind] * 3
    attrs = {"nonlinearity": "relu"} if relu else {}
    return (f"{kind.lower()}{'_relu' if relu else ''}_one_step",
            lambda *a: eo.dispatch(kind.lower(), *a, batch_first=True, **attrs),
            _torch_cell(kind, relu),
            [normal(2, 1, 2)] + [normal(2, 3)] * states
            + [normal(2, width), normal(3, width), normal(width), normal(width)])


def _two_steps(kind):
    """Two steps, time-major: the composite's loop and layout, against the PyTorch layer."""
    states = 2 if kind == "LSTM" else 1
    width = GATES[kind] * 3

    def theirs(x, *rest):
        torch = T()
        states_, (w_ih, w_hh, b_ih, b_hh) = rest[:-4], rest[-4:]
        weights = [w_ih.T, w_hh.T, b_ih, b_hh]
        if kind == "LSTM":
            out, _, c = torch.lstm(x, tuple(s[None] for s in states_), weights, True, 1, 0.0,
                                   False, False, False)
            return torch.cat([out, c])
        run = torch.gru if kind == "GRU" else torch.rnn_tanh
        return run(x, states_[0][None], weights, True, 1, 0.0, False, False, False)[0]

    return (f"{kind.lower()}_two_steps_time_major",
            lambda *a: eo.dispatch(kind.lower(), *a, batch_first=False),
            theirs, [normal(2, 2, 2)] + [normal(2, 3)] * states
            + [normal(2, width), normal(3, width), normal(width), normal(width)])


SECOND_ORDER = [_case(k) for k in KINDS] + [_case("RNN", relu=True)] + [
    _two_steps(k) for k in KINDS]
test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))
