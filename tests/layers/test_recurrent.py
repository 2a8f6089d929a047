"""RNN, LSTM and GRU: numerical gradients (BPTT) in float64 and PyTorch as the oracle, with
per-sample lengths (PyTorch's packed sequences), bidirectional stacks and dropout between
layers; second derivatives through the fused ops' composites."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_layers.recurrent_ops import ScratchPool
from support.sequence_torch import assert_grads_close, copy_recurrent, recurrent_grad_pairs

KINDS = ["RNN", "LSTM", "GRU"]


def _state(kind, rng, layers, batch, hidden, tensor=np.asarray):
    def one():
        return tensor(rng.standard_normal((layers, batch, hidden)))

    return (one(), one()) if kind == "LSTM" else one()


def _flatten_state(kind, state):
    return list(state) if kind == "LSTM" else [state]


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layers,batch_first,with_state", [(1, True, True), (2, False, False)])
def test_gradcheck_through_time(kind, layers, batch_first, with_state, rng):
    layer = getattr(eo, kind)(2, 3, num_layers=layers, batch_first=batch_first,
                              return_state=True, seed=0).to("float64")
    x = rng.standard_normal((2, 4, 2) if batch_first else (4, 2, 2))
    state = _state(kind, rng, layers, 2, 3) if with_state else None

    def run(x, *start):
        start = None if not start else (tuple(start) if kind == "LSTM" else start[0])
        out, final = layer(x, start)
        # every output reaches the checked scalar: the sequence and each final state
        parts = [out.reshape(-1)] + [f.reshape(-1) for f in _flatten_state(kind, final)]
        return eo.concatenate(parts)

    inputs = [x] + (_flatten_state(kind, state) if with_state else [])
    assert eo.gradcheck(run, *inputs, params=list(layer.parameters()))


def test_relu_rnn_gradcheck(rng):
    layer = eo.RNN(2, 3, nonlinearity="relu", seed=1).to("float64")
    assert eo.gradcheck(layer, rng.standard_normal((2, 3, 2)), params=list(layer.parameters()))


@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("layers", [1, 2])
@pytest.mark.parametrize("with_state", [False, True])
def test_matches_torch(torch, kind, layers, with_state, rng):
    batch_first = layers == 1  # the time-major layout is exercised with two layers
    layer = getattr(eo, kind)(3, 5, num_layers=layers, batch_first=batch_first,
                              return_state=True, seed=2).to("float64")
    ref = getattr(torch.nn, kind)(3, 5, num_layers=layers, batch_first=batch_first).double()
    copy_recurrent(torch, layer, ref)
    x = rng.standard_normal((4, 6, 3))
    mine_x, ref_x = eo.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    batch = 4 if batch_first else 6
    if with_state:
        state = _flatten_state(kind, _state(kind, rng, layers, batch, 5))
        mine_s = [eo.tensor(s, requires_grad=True) for s in state]
        ref_s = [torch.tensor(s, requires_grad=True) for s in state]
        out, final = layer(mine_x, tuple(mine_s) if kind == "LSTM" else mine_s[0])
        ref_out, ref_final = ref(ref_x, tuple(ref_s) if kind == "LSTM" else ref_s[0])
    else:
        out, final = layer(mine_x)
        ref_out, ref_final = ref(ref_x)
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), atol=1e-12)
    finals, ref_finals = _flatten_state(kind, final), _flatten_state(kind, ref_final)
    loss = (out * (g := rng.standard_normal(out.shape))).sum()
    ref_loss = (ref_out * torch.from_numpy(g)).sum()
    for f, rf in zip(finals, ref_finals):
        np.testing.assert_allclose(f.data, rf.detach().numpy(), atol=1e-12)
        w = rng.standard_normal(f.shape)
        loss = loss + (f * w).sum()
        ref_loss = ref_loss + (rf * torch.from_numpy(w)).sum()
    loss.backward()
    ref_loss.backward()
    np.testing.assert_allclose(mine_x.grad, ref_x.grad.numpy(), atol=1e-10)
    assert assert_grads_close(recurrent_grad_pairs(layer, ref)) == 4 * layers
    if with_state:
        for s, rs in zip(mine_s, ref_s):
            np.testing.assert_allclose(s.grad, rs.grad.numpy(), atol=1e-10)


def test_relu_rnn_matches_torch(torch, rng):
    layer = eo.RNN(3, 4, nonlinearity="relu", seed=3).to("float64")
    ref = torch.nn.RNN(3, 4, nonlinearity="relu", batch_first=True).double()
    copy_recurrent(torch, layer, ref)
    x = rng.standard_normal((2, 5, 3))
    mine_x, ref_x = eo.tensor(x, requires_grad=True), torch.tensor(x, requires_grad=True)
    out, ref_out = layer(mine_x), ref(ref_x)[0]
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), atol=1e-12)
    out.sum().backward()
    ref_out.sum().backward()
    np.testing.assert_allclose(mine_x.grad, ref_x.grad.numpy(), atol=1e-12)
    assert_grads_close(recurrent_grad_pairs(layer, ref))


@pytest.mark.parametrize("kind", KINDS)
def test_output_only_by_default_and_composes_in_sequential(kind):
    model = eo.Sequential(getattr(eo, kind)(3, 4, seed=0), getattr(eo, kind)(4, 2, seed=1))
    out = model(eo.randn(5, 7, 3, seed=0))
    assert isinstance(out, eo.Tensor) and out.shape == (5, 7, 2) and out.dtype == "float32"
    out.sum().backward()
    assert all(p.grad is not None and p.grad.dtype == np.float32 for p in model.parameters())


def test_final_state_is_the_last_step_of_each_layer():
    lstm = eo.LSTM(3, 4, num_layers=2, return_state=True, seed=0)
    x = eo.randn(2, 5, 3, seed=1)
    out, (h, c) = lstm(x)
    assert h.shape == c.shape == (2, 2, 4)
    np.testing.assert_array_equal(h.data[-1], out.data[:, -1])
    first = eo.LSTM(3, 4, return_state=True, seed=0)  # same seed, same first-layer weights
    _, (h1, c1) = first(x)
    np.testing.assert_allclose(h.data[0], h1.data[0], rtol=1e-6)
    np.testing.assert_allclose(c.data[0], c1.data[0], rtol=1e-6)


def test_parameter_layout_and_init():
    gru = eo.GRU(3, 4, num_layers=2, seed=0)
    shapes = {n: p.shape for n, p in gru.named_parameters()}
    assert shapes == {"weight_ih_l0": (3, 12), "weight_hh_l0": (4, 12), "bias_ih_l0": (12,),
                      "bias_hh_l0": (12,), "weight_ih_l1": (4, 12), "weight_hh_l1": (4, 12),
                      "bias_ih_l1": (12,), "bias_hh_l1": (12,)}
    assert max(np.abs(p.data).max() for p in gru.parameters()) <= 0.5  # U(-1/sqrt(4), ..)
    assert np.array_equal(eo.GRU(3, 4, seed=0).weight_ih_l0.data, gru.weight_ih_l0.data)


def test_fused_ops_are_registered():
    ops = eo.registry("ops").items
    assert {"rnn", "lstm", "gru"} <= set(ops)
    assert eo.LSTM.__name__ == "LSTM" and eo.registry("layers").items["GRU"] is eo.GRU


@pytest.mark.parametrize("kind", KINDS)
def test_bad_input_names_layer_and_shapes(kind):
    layer = getattr(eo, kind)(3, 4, seed=0)
    with pytest.raises(eo.EveryOError, match=rf"{kind}\(3→4\).*3 features.*\(2, 5, 7\)"):
        layer(eo.zeros(2, 5, 7))
    with pytest.raises(eo.EveryOError, match=r"\(batch, seq, features\).*\(5, 3\)"):
        layer(eo.zeros(5, 3))
    with pytest.raises(eo.EveryOError, match="floating-point"):
        layer(np.zeros((2, 5, 3), dtype=np.int64))
    bad_state = np.zeros((2, 2, 4))
    with pytest.raises(eo.EveryOError, match=r"initial state.*\(1, 2, 4\).*\(2, 2, 4\)"):
        layer(eo.zeros(2, 5, 3), (bad_state, bad_state) if kind == "LSTM" else bad_state)
    with pytest.raises(eo.EveryOError, match=r"sequence .* is empty \(shape \(2, 0, 3\)\)"):
        layer(eo.zeros(2, 0, 3))
    with pytest.raises(eo.EveryOError, match="positive"):
        getattr(eo, kind)(0, 4)


@pytest.mark.parametrize("kind", KINDS)
def test_backward_twice_with_retained_graph_gives_the_same_gradients(kind):
    # backward borrows pooled scratch arrays; the saved activations must survive it
    lstm = getattr(eo, kind)(3, 4, num_layers=2, seed=0)
    out = lstm(eo.randn(2, 5, 3, seed=1))
    out.sum().backward(retain_graph=True)
    first = [p.grad.copy() for p in lstm.parameters()]
    lstm.zero_grad()
    out.sum().backward()
    for a, p in zip(first, lstm.parameters()):
        np.testing.assert_array_equal(a, p.grad)


def test_scratch_pool_reuses_and_bounds():
    pool = ScratchPool(keep=1, max_keys=2)
    a = pool.take((2, 3), np.float32)
    pool.give(a, np.empty((2, 3), np.float32))  # only one kept per shape
    assert pool.take((2, 3), np.float32) is a
    assert pool.take((2, 3), np.float32) is not a
    for n in range(4):
        pool.give(np.empty((n + 1,), np.float64))
    assert len(pool._free) <= 2  # oldest shapes forgotten


@pytest.mark.parametrize("kind", ["RNN", "LSTM", "GRU"])
def test_an_empty_batch_runs_forward_and_backward(kind):
    # Regression: reshapes with -1 failed on a batch of 0 sequences.
    layer = getattr(eo, kind)(2, 4, num_layers=2, return_state=True, seed=0)
    x = eo.zeros(0, 3, 2, requires_grad=True)
    out, state = layer(x)
    assert out.shape == (0, 3, 4)
    out.sum().backward()
    assert x.grad.shape == (0, 3, 2)
    assert not layer.weight_hh_l1.grad.any() and layer.weight_hh_l1.grad.shape == (4, 4 * layer.gates)


def _parts(kind, final):
    return list(final) if kind == "LSTM" else [final]


def _run_both(torch, kind, layer, ref, x, lengths, dtype, rng):
    """Forward both with a weighted loss over the outputs and final states; backward."""
    T = getattr(torch, dtype)
    mine_x = eo.tensor(x.astype(dtype), requires_grad=True)
    ref_x = torch.tensor(x.astype(dtype), requires_grad=True)
    out, final = layer(mine_x, lengths=lengths)
    if lengths is None:
        ref_out, ref_final = ref(ref_x)
    else:
        pack = torch.nn.utils.rnn
        packed = pack.pack_padded_sequence(ref_x, torch.tensor(lengths), batch_first=True,
                                           enforce_sorted=False)
        ref_packed, ref_final = ref(packed)
        ref_out, _ = pack.pad_packed_sequence(ref_packed, batch_first=True,
                                              total_length=x.shape[1])
    tol = 1e-10 if dtype == "float64" else 2e-5
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), atol=tol)
    g = rng.standard_normal(out.shape).astype(dtype)
    loss, ref_loss = (out * g).sum(), (ref_out * torch.tensor(g)).sum()
    for f, rf in zip(_parts(kind, final), _parts(kind, ref_final)):
        np.testing.assert_allclose(f.data, rf.detach().numpy(), atol=tol)
        w = rng.standard_normal(f.shape).astype(dtype)
        loss, ref_loss = loss + (f * w).sum(), ref_loss + (rf * torch.tensor(w, dtype=T)).sum()
    loss.backward()
    ref_loss.backward()
    np.testing.assert_allclose(mine_x.grad, ref_x.grad.numpy(), atol=tol * 10)
    count = 0
    for name, mine, theirs in recurrent_grad_pairs(layer, ref):
        np.testing.assert_allclose(mine, theirs, atol=tol * 10, err_msg=name)
        count += 1
    return count


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("kind", KINDS)
@pytest.mark.parametrize("bidirectional, with_lengths", [(True, False), (False, True),
                                                         (True, True)])
def test_lengths_and_bidirectional_match_torch(torch, rng, kind, dtype, bidirectional, with_lengths):
    layer = getattr(eo, kind)(3, 4, num_layers=2, return_state=True, bidirectional=bidirectional,
                              seed=5).to(dtype)
    ref = getattr(torch.nn, kind)(3, 4, num_layers=2, batch_first=True,
                                  bidirectional=bidirectional).to(getattr(torch, dtype))
    names = [n for n, _ in layer.named_parameters()]
    assert names == [n for n, _ in ref.named_parameters()]
    copy_recurrent(torch, layer, ref)
    x = rng.standard_normal((5, 7, 3))
    lengths = np.array([7, 3, 5, 3, 1]) if with_lengths else None
    count = _run_both(torch, kind, layer, ref, x, lengths, dtype, rng)
    assert count == 4 * 2 * (2 if bidirectional else 1)


def test_time_major_bidirectional_with_lengths(torch, rng):
    layer = eo.GRU(2, 3, batch_first=False, bidirectional=True, return_state=True,
                   seed=1).to("float64")
    ref = torch.nn.GRU(2, 3, bidirectional=True).double()
    copy_recurrent(torch, layer, ref)
    x = rng.standard_normal((6, 4, 2))  # (seq, batch, features)
    lengths = np.array([2, 6, 4, 4])
    out, h = layer(eo.tensor(x), lengths=lengths)
    packed = torch.nn.utils.rnn.pack_padded_sequence(torch.tensor(x), torch.tensor(lengths),
                                                     enforce_sorted=False)
    ref_packed, ref_h = ref(packed)
    ref_out, _ = torch.nn.utils.rnn.pad_packed_sequence(ref_packed, total_length=6)
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(h.data, ref_h.detach().numpy(), atol=1e-12)


def test_gradcheck_lengths_bidirectional(rng):
    layer = eo.LSTM(2, 3, num_layers=2, bidirectional=True, return_state=True,
                    seed=0).to("float64")
    lengths = np.array([3, 1, 2])

    def fn(x):
        out, (h, c) = layer(x, lengths=lengths)
        return (out * out).sum() + h.sum() + (c * c).sum()

    assert eo.gradcheck(fn, rng.standard_normal((3, 3, 2)), params=list(layer.parameters()))


def test_dropout_between_layers(rng):
    x = eo.tensor(rng.standard_normal((4, 5, 3)))
    layer = eo.LSTM(3, 6, num_layers=2, dropout=0.5, seed=0)
    trained = layer(x).data
    evaluated = layer.eval()(x).data
    undropped = eo.LSTM(3, 6, num_layers=2, seed=0)(x).data
    np.testing.assert_array_equal(evaluated, undropped)  # no dropout in eval mode
    assert not np.allclose(trained, evaluated)
    single = eo.GRU(3, 6, num_layers=1, dropout=0.5, seed=0)
    np.testing.assert_array_equal(single(x).data, single.eval()(x).data)  # nothing between


def test_bad_lengths_and_state_name_the_layer():
    layer = eo.LSTM(3, 4, bidirectional=True)
    x = eo.zeros(2, 5, 3)
    with pytest.raises(eo.EveryOError, match=r"LSTM\(3→4\): lengths must be between 1 and the "
                                             r"sequence length 5, got 2..6"):
        layer(x, lengths=np.array([6, 2]))
    with pytest.raises(eo.EveryOError, match=r"LSTM\(3→4\): lengths must be 2 integers"):
        layer(x, lengths=np.array([5]))
    with pytest.raises(eo.EveryOError, match=r"expected initial state of shape .* \(2, 2, 4\)"):
        layer(x, (eo.zeros(1, 2, 4), eo.zeros(1, 2, 4)))
    with pytest.raises(eo.EveryOError, match=r"GRU: dropout must be in \[0, 1\)"):
        eo.GRU(3, 4, dropout=1.0)


def test_malformed_lengths_and_state_name_the_layer():
    """Not NumPy's or Python's own errors: a ragged lengths list, an LSTM state that is no pair."""
    x = eo.zeros(2, 5, 3)
    with pytest.raises(eo.EveryOError, match=r"GRU\(3→4\): lengths must be 2 integers"):
        eo.GRU(3, 4)(x, lengths=[2, [3]])
    with pytest.raises(eo.EveryOError, match=r"LSTM\(3→4\): the initial state is a pair"):
        eo.LSTM(3, 4)(x, 5)


@pytest.mark.parametrize("kind", [eo.LSTM, eo.GRU, eo.RNN])
def test_an_empty_batch_with_lengths_gives_empty_outputs(kind):
    """As without lengths: nothing to run (NumPy's or Python's errors were leaking)."""
    layer = kind(3, 2, bidirectional=True, return_state=True)
    out, state = layer(eo.zeros(0, 4, 3), lengths=np.array([], dtype=np.int64))
    assert out.shape == (0, 4, 4)
    assert (state[0] if isinstance(state, tuple) else state).shape == (2, 0, 2)


@pytest.mark.parametrize("kind", KINDS)
def test_second_derivatives_through_the_layers(kind, rng):
    """The fused ops differentiate their composite (recurrent_composite) for create_graph."""
    layer = getattr(eo, kind)(2, 2, num_layers=2, batch_first=False, seed=0).to("float64")
    assert eo.gradgradcheck(lambda x: layer(x), rng.standard_normal((3, 2, 2)))


@pytest.mark.parametrize("kind", ["LSTM", "GRU"])
def test_second_derivatives_with_lengths_and_bidirectional(rng, kind):
    layer = getattr(eo, kind)(2, 2, bidirectional=True, seed=0).to("float64")
    assert eo.gradgradcheck(lambda x: layer(x, lengths=np.array([3, 1])),
                            rng.standard_normal((2, 3, 2)))


@pytest.mark.parametrize("kind", KINDS)
def test_the_composite_reproduces_the_fused_op(kind, rng):
    layer = getattr(eo, kind)(2, 3, seed=1).to("float64")
    out = layer(eo.tensor(rng.standard_normal((2, 4, 2)), requires_grad=True))
    op = out._ctx
    while type(op).__name__ not in ("RNNOp", "LSTMOp", "GRUOp"):  # the LSTM slices its output
        op = op.parents[0]._ctx
    with eo.no_grad():
        again = op.composite(*op.parents)
    np.testing.assert_allclose(again.data, eo.dispatch(kind.lower(), *op.parents).data,
                               rtol=1e-12, atol=1e-12)


# --- bidirectional LSTM as one op (bilstm, recurrent_bidirectional.py) ---

def _bilstm_run(layer, x, state, lengths=None):
    """Output, final states and every gradient of a loss using all of them."""
    layer.zero_grad()
    xs, h0, c0 = (eo.tensor(a, requires_grad=True) for a in (x, *state))
    out, (h, c) = layer(xs, (h0, c0), lengths=lengths)
    ((out * out).sum() + (h * 3).sum() + (c * c).sum()).backward()
    return [out.data, h.data, c.data, xs.grad, h0.grad, c0.grad,
            *[p.grad for p in layer.parameters()]]


@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("batch_first", [True, False])
def test_the_bilstm_op_gives_the_two_lstm_ops_bits(rng, dtype, batch_first):
    """Lengths that cut nothing take the two-op path (an lstm op per direction, the input and
    outputs reversed by gathers): the one op must give its bits, forward and every gradient."""
    layer = eo.LSTM(3, 5, num_layers=2, bidirectional=True, return_state=True,
                    batch_first=batch_first, seed=2).to(dtype)
    x = rng.standard_normal((4, 6, 3) if batch_first else (6, 4, 3)).astype(dtype)
    state = [rng.standard_normal((4, 4, 5)).astype(dtype) for _ in range(2)]
    one_op = _bilstm_run(layer, x, state)
    two_ops = _bilstm_run(layer, x, state, lengths=np.full(4, 6))
    assert len(one_op) == 6 + 16
    for k, (got, expected) in enumerate(zip(one_op, two_ops)):
        np.testing.assert_array_equal(got, expected, err_msg=f"result {k}")


def test_the_bidirectional_lstm_layer_runs_one_op_per_layer(rng):
    layer = eo.LSTM(3, 4, num_layers=2, bidirectional=True)
    out = layer(eo.tensor(rng.standard_normal((2, 3, 3)), requires_grad=True))
    seen, stack = [], [out._ctx]
    while stack:
        op = stack.pop()
        if op is not None:
            seen.append(op.name)
            stack += [p._ctx for p in op.parents]
    assert seen.count("bilstm") == 2 and "lstm" not in seen and "concatenate" not in seen


@pytest.mark.parametrize("batch_first", [True, False])
def test_gradcheck_bidirectional_lstm(rng, batch_first):
    layer = eo.LSTM(2, 3, bidirectional=True, return_state=True, batch_first=batch_first,
                    seed=0).to("float64")
    h0, c0 = (eo.tensor(rng.standard_normal((2, 2, 3)), requires_grad=True) for _ in range(2))

    def fn(x):
        out, (h, c) = layer(x, (h0, c0))
        return (out * out).sum() + h.sum() + (c * c).sum()

    x = rng.standard_normal((2, 4, 2) if batch_first else (4, 2, 2))  # batch 2, 4 steps
    assert eo.gradcheck(fn, x, params=[h0, c0, *layer.parameters()])


def test_second_derivatives_through_the_bilstm_op(rng):
    layer = eo.LSTM(2, 2, bidirectional=True, batch_first=False, seed=0).to("float64")
    assert eo.gradgradcheck(lambda x: layer(x), rng.standard_normal((3, 2, 2)))


@pytest.mark.parametrize("batch_first", [True, False])
def test_the_composite_reproduces_the_bilstm_op(rng, batch_first):
    layer = eo.LSTM(2, 3, bidirectional=True, seed=1).to("float64")
    x = rng.standard_normal((2, 4, 2) if batch_first else (4, 2, 2))
    state = [eo.tensor(rng.standard_normal((2, 3))) for _ in range(4)]
    operands = [eo.tensor(x, requires_grad=True),
                *state[:2], *layer.layer_parameters(0), *state[2:], *layer.layer_parameters(0, "_reverse")]
    fused = eo.dispatch("bilstm", *operands, batch_first=batch_first)
    assert fused.shape == ((2, 5, 6) if batch_first else (5, 2, 6))
    with eo.no_grad():
        again = fused._ctx.composite(*operands)
    np.testing.assert_allclose(again.data, fused.data, rtol=1e-12, atol=1e-12)
