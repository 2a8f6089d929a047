"""Recurrent layers with per-sample lengths (PyTorch's packed sequences), bidirectional
stacks (``_reverse`` parameters) and dropout between layers."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from support.sequence_torch import copy_recurrent, recurrent_grad_pairs

KINDS = ["RNN", "LSTM", "GRU"]


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
def test_matches_torch(torch, rng, kind, dtype, bidirectional, with_lengths):
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
