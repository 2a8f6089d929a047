"""PositionalEncoding and the transformer layers: gradcheck in float64 and PyTorch as the
oracle (forward and every gradient, weights copied across, dropout 0)."""

from __future__ import annotations

import math

import numpy as np
import pytest

import everyo as eo
from everyo_layers.attention import causal_mask
from support.sequence_torch import (
    assert_grads_close,
    copy_transformer_layer,
    transformer_grad_pairs,
)


def _randomise(module, rng, scale=0.4):
    """Random weights everywhere (norm scales around 1), so no gradient hides behind a zero."""
    for name, p in module.named_parameters():
        offset = 1.0 if "norm" in name and name.endswith("weight") else 0.0
        p.data[...] = offset + rng.standard_normal(p.shape) * scale


# -- PositionalEncoding -------------------------------------------------------------------------

def test_positional_encoding_matches_the_paper_formula():
    d_model = 5  # odd on purpose: the last feature is a sine
    pe = eo.PositionalEncoding(d_model, max_len=20)
    out = pe(eo.zeros(1, 7, d_model, dtype="float64")).data[0]
    for pos in range(7):
        for i in range(d_model):
            angle = pos / 10000 ** ((i - i % 2) / d_model)
            expected = math.sin(angle) if i % 2 == 0 else math.cos(angle)
            assert out[pos, i] == pytest.approx(expected, abs=1e-12)


def test_positional_encoding_gradient_and_dtype(rng):
    pe = eo.PositionalEncoding(4, max_len=10)
    assert eo.gradcheck(pe, rng.standard_normal((2, 3, 4)))
    assert pe(eo.zeros(2, 3, 4)).dtype == "float32"
    assert pe.state_dict() == {}  # a constant, not state


def test_positional_encoding_errors():
    pe = eo.PositionalEncoding(4, max_len=6)
    with pytest.raises(eo.EveryOError, match="length 7 is longer than max_len 6"):
        pe(eo.zeros(1, 7, 4))
    with pytest.raises(eo.EveryOError, match=r"PositionalEncoding\(4.*\(batch, seq, 4\), got \(1, 3, 5\)"):
        pe(eo.zeros(1, 3, 5))


# -- gradcheck ----------------------------------------------------------------------------------

@pytest.mark.parametrize("norm_first", [False, True])
def test_encoder_layer_gradcheck(rng, norm_first):
    layer = eo.TransformerEncoderLayer(4, 2, batch_first=True, dim_feedforward=6, dropout=0.0,
                                       norm_first=norm_first, seed=0).to("float64")
    _randomise(layer, rng)
    padding = np.array([[False, False, True], [False] * 3])
    assert eo.gradcheck(lambda x: layer(x, src_mask=causal_mask(3), src_key_padding_mask=padding),
                        rng.standard_normal((2, 3, 4)), params=list(layer.parameters()))


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_gradcheck(rng, norm_first):
    layer = eo.TransformerDecoderLayer(4, 2, batch_first=True, dim_feedforward=5, dropout=0.0,
                                       norm_first=norm_first, seed=0).to("float64")
    _randomise(layer, rng)
    assert eo.gradcheck(lambda t, m: layer(t, m, tgt_mask=causal_mask(3)),
                        rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 2, 4)),
                        params=list(layer.parameters()))


def test_encoder_stack_gradcheck(rng):
    layer = eo.TransformerEncoderLayer(4, 1, batch_first=True, dim_feedforward=4, dropout=0.0, seed=0)
    encoder = eo.TransformerEncoder(layer, 2, norm=eo.LayerNorm(4)).to("float64")
    _randomise(encoder, rng)
    assert eo.gradcheck(encoder, rng.standard_normal((1, 3, 4)),
                        params=list(encoder.parameters()))


# -- PyTorch oracle -----------------------------------------------------------------------------

def _tensors(torch, *arrays):
    return ([eo.tensor(a, requires_grad=True) for a in arrays],
            [torch.tensor(a, requires_grad=True) for a in arrays])


def _compare(torch, rng, out, ref_out, mine, theirs):
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), atol=1e-10)
    g = rng.standard_normal(out.shape)
    (out * g).sum().backward()
    (ref_out * torch.from_numpy(g)).sum().backward()
    for m, t in zip(mine, theirs):
        np.testing.assert_allclose(m.grad, t.grad.numpy(), atol=1e-9)


@pytest.mark.parametrize("norm_first", [False, True])
@pytest.mark.parametrize("activation", ["relu", "gelu"])
def test_encoder_layer_matches_torch(torch, rng, norm_first, activation):
    layer = eo.TransformerEncoderLayer(8, 2, batch_first=True, dim_feedforward=12, dropout=0.0,
                                       norm_first=norm_first, activation=activation,
                                       seed=1).to("float64")
    _randomise(layer, rng)
    ref = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, dropout=0.0,
                                           norm_first=norm_first, activation=activation,
                                           batch_first=True).double()
    copy_transformer_layer(torch, layer, ref, rng)
    padding = np.zeros((3, 5), dtype=bool)
    padding[1, -2:] = True
    (x,), (tx,) = _tensors(torch, rng.standard_normal((3, 5, 8)))
    out = layer(x, src_mask=causal_mask(5), src_key_padding_mask=padding)
    ref_out = ref(tx, src_mask=torch.from_numpy(causal_mask(5)),
                  src_key_padding_mask=torch.from_numpy(padding))
    _compare(torch, rng, out, ref_out, [x], [tx])
    assert assert_grads_close(transformer_grad_pairs(layer, ref), atol=1e-9) == 16


@pytest.mark.parametrize("norm_first", [False, True])
def test_decoder_layer_matches_torch(torch, rng, norm_first):
    layer = eo.TransformerDecoderLayer(8, 2, batch_first=True, dim_feedforward=12, dropout=0.0,
                                       norm_first=norm_first, seed=2).to("float64")
    _randomise(layer, rng)
    ref = torch.nn.TransformerDecoderLayer(8, 2, dim_feedforward=12, dropout=0.0,
                                           norm_first=norm_first, batch_first=True).double()
    copy_transformer_layer(torch, layer, ref, rng)
    memory_padding = np.zeros((3, 6), dtype=bool)
    memory_padding[0, -3:] = True
    memory_mask = rng.random((4, 6)) < 0.4  # bool, like the padding mask (torch wants one kind)
    memory_mask[:, 0] = False  # every query keeps a visible key
    mine, theirs = _tensors(torch, rng.standard_normal((3, 4, 8)), rng.standard_normal((3, 6, 8)))
    out = layer(*mine, tgt_mask=causal_mask(4), memory_mask=memory_mask,
                memory_key_padding_mask=memory_padding)
    ref_out = ref(*theirs, tgt_mask=torch.from_numpy(causal_mask(4)),
                  memory_mask=torch.from_numpy(memory_mask),
                  memory_key_padding_mask=torch.from_numpy(memory_padding))
    _compare(torch, rng, out, ref_out, mine, theirs)
    assert assert_grads_close(transformer_grad_pairs(layer, ref), atol=1e-9) == 26


def test_encoder_stack_matches_torch(torch, rng):
    layer = eo.TransformerEncoderLayer(8, 2, batch_first=True, dim_feedforward=12, dropout=0.0, seed=3)
    encoder = eo.TransformerEncoder(layer, 3, norm=eo.LayerNorm(8)).to("float64")
    _randomise(encoder, rng)  # every copy gets its own weights
    ref_layer = torch.nn.TransformerEncoderLayer(8, 2, dim_feedforward=12, dropout=0.0,
                                                 batch_first=True)
    ref = torch.nn.TransformerEncoder(ref_layer, 3, norm=torch.nn.LayerNorm(8),
                                      enable_nested_tensor=False).double()
    for mine_layer, ref_sub in zip(encoder.layers, ref.layers):
        copy_transformer_layer(torch, mine_layer, ref_sub, rng)
    with torch.no_grad():
        ref.norm.weight.copy_(torch.from_numpy(encoder.norm.weight.data))
        ref.norm.bias.copy_(torch.from_numpy(encoder.norm.bias.data))
    (x,), (tx,) = _tensors(torch, rng.standard_normal((2, 5, 8)))
    out = encoder(x, mask=causal_mask(5))
    ref_out = ref(tx, mask=torch.from_numpy(causal_mask(5)))
    _compare(torch, rng, out, ref_out, [x], [tx])
    compared = sum(assert_grads_close(transformer_grad_pairs(m, t, f"layers.{i}."), atol=1e-9)
                   for i, (m, t) in enumerate(zip(encoder.layers, ref.layers)))
    assert compared == 3 * 16
    np.testing.assert_allclose(encoder.norm.weight.grad, ref.norm.weight.grad.numpy(), atol=1e-9)


# -- behaviour ----------------------------------------------------------------------------------

def test_encoder_copies_are_independent():
    layer = eo.TransformerEncoderLayer(8, 2, batch_first=True, dim_feedforward=16, dropout=0.5, seed=0)
    encoder = eo.TransformerEncoder(layer, 2)
    first, second = encoder.layers
    assert first is not layer and first.linear1.weight is not second.linear1.weight
    np.testing.assert_array_equal(first.linear1.weight.data, layer.linear1.weight.data)
    first.linear1.weight.data[...] = 0
    assert layer.linear1.weight.data.any() and second.linear1.weight.data.any()
    ones = eo.ones(4, 8)
    assert not np.array_equal(first.dropout(ones).data, second.dropout(ones).data)
    assert len(list(encoder.parameters())) == 2 * len(list(layer.parameters()))


def test_dropout_active_in_training_only():
    layer = eo.TransformerEncoderLayer(8, 2, batch_first=True, dim_feedforward=16, seed=0)  # dropout 0.1
    x = eo.randn(2, 5, 8, seed=1)
    assert not np.allclose(layer(x).data, layer(x).data)
    layer.eval()
    np.testing.assert_array_equal(layer(x).data, layer(x).data)


def test_trains_on_a_copy_task():
    rng = np.random.default_rng(0)
    model = eo.Sequential(eo.TransformerEncoderLayer(8, 2, batch_first=True, dim_feedforward=16, dropout=0.0,
                                                     seed=0), eo.Linear(8, 8, seed=1))
    opt = eo.Adam(model.parameters(), lr=0.01)
    x = eo.tensor(rng.standard_normal((16, 4, 8)).astype(np.float32))
    losses = []
    for _ in range(60):
        err = model(x) - x
        loss = (err * err).mean()
        model.zero_grad()
        loss.backward()
        opt.step()
        losses.append(loss.item())
    assert losses[-1] < 0.2 * losses[0]


def test_bad_input_names_the_layer():
    enc = eo.TransformerEncoderLayer(8, 2, batch_first=True, dim_feedforward=16)
    expected = (r"TransformerEncoderLayer\(d_model=8\): expected input of shape "
                r"\(batch, seq, 8\), got \(2, 5, 4\)")
    with pytest.raises(eo.EveryOError, match=expected):
        enc(eo.zeros(2, 5, 4))
    dec = eo.TransformerDecoderLayer(8, 2, batch_first=True, dim_feedforward=16)
    with pytest.raises(eo.EveryOError, match=r"expected memory of shape \(batch, seq, 8\), got \(2, 8\)"):
        dec(eo.zeros(2, 5, 8), eo.zeros(2, 8))
    with pytest.raises(eo.EveryOError, match="batch sizes differ"):
        dec(eo.zeros(2, 5, 8), eo.zeros(3, 4, 8))
    with pytest.raises(eo.EveryOError, match="activation must be"):
        eo.TransformerEncoderLayer(8, 2, batch_first=True, activation="swish")
    with pytest.raises(eo.EveryOError, match="TransformerEncoder: num_layers must be a positive int"):
        eo.TransformerEncoder(enc, 0)
