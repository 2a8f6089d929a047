"""The transformer layers with PyTorch's arguments: ``nhead``, PyTorch's positional order and
``batch_first`` (False, PyTorch's default, is sequence-first); ``TransformerDecoder`` and
``Transformer`` against ``torch.nn``'s, forward and every gradient in float32 and float64, in
both layouts; numerical and second derivatives; bad input named."""

from __future__ import annotations

import importlib.util
import warnings

import numpy as np
import pytest

import everyo as eo
from everyo_layers.attention import causal_mask
from support.second_order import second_order_tests
from support.sequence_torch import assert_grads_close, copy_transformer_layer, transformer_grad_pairs

TOL = {"float64": 1e-10, "float32": 2e-5}


def _randomise(module, rng, scale=0.4):
    for name, p in module.named_parameters():
        offset = 1.0 if "norm" in name and name.endswith("weight") else 0.0
        p.data[...] = offset + rng.standard_normal(p.shape) * scale


def _seq(rng, batch_first, batch, steps, dtype):
    shape = (batch, steps, 8) if batch_first else (steps, batch, 8)
    return rng.standard_normal(shape).astype(dtype)


def _backward_both(torch, rng, out, ref, dtype):
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=TOL[dtype], atol=TOL[dtype])
    g = rng.standard_normal(out.shape).astype(dtype)
    (out * g).sum().backward()
    (ref * torch.from_numpy(g)).sum().backward()


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("batch_first", [False, True])
def test_encoder_and_decoder_layers_match_torch_in_both_layouts(torch, rng, dtype, batch_first):
    kinds = [(eo.TransformerEncoderLayer, torch.nn.TransformerEncoderLayer, 16),
             (eo.TransformerDecoderLayer, torch.nn.TransformerDecoderLayer, 26)]
    for ours_cls, theirs_cls, count in kinds:
        layer = ours_cls(8, 2, 12, 0.0, "gelu", batch_first=batch_first, seed=1).to(dtype)
        _randomise(layer, rng)
        ref = theirs_cls(8, 2, 12, 0.0, "gelu", batch_first=batch_first).to(getattr(torch, dtype))
        copy_transformer_layer(torch, layer, ref, rng)
        padding = np.zeros((3, 5), dtype=bool)
        padding[1, -2:] = True
        arrays = [_seq(rng, batch_first, 3, 5, dtype)]
        if ours_cls is eo.TransformerDecoderLayer:
            arrays.append(_seq(rng, batch_first, 3, 4, dtype))
        mine = [eo.tensor(a, requires_grad=True) for a in arrays]
        theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
        if len(arrays) == 1:
            out = layer(mine[0], src_mask=causal_mask(5), src_key_padding_mask=padding)
            expected = ref(theirs[0], src_mask=torch.from_numpy(causal_mask(5)),
                           src_key_padding_mask=torch.from_numpy(padding))
        else:
            out = layer(*mine, tgt_mask=causal_mask(5), tgt_key_padding_mask=padding)
            expected = ref(*theirs, tgt_mask=torch.from_numpy(causal_mask(5)),
                           tgt_key_padding_mask=torch.from_numpy(padding))
        assert out.shape == arrays[0].shape
        _backward_both(torch, rng, out, expected, dtype)
        for m, t in zip(mine, theirs):
            np.testing.assert_allclose(m.grad, t.grad.numpy(), rtol=TOL[dtype] * 10,
                                       atol=TOL[dtype] * 10)
        assert assert_grads_close(transformer_grad_pairs(layer, ref),
                                  atol=TOL[dtype] * 10) == count


def test_sequence_first_is_batch_first_on_the_swapped_input(rng):
    first = eo.TransformerEncoderLayer(8, 2, 12, 0.0, seed=3).to("float64")
    second = eo.TransformerEncoderLayer(8, 2, 12, 0.0, batch_first=True, seed=3).to("float64")
    x = rng.standard_normal((5, 3, 8))
    np.testing.assert_allclose(first(x).data, second(x.transpose(1, 0, 2)).data.transpose(1, 0, 2),
                               rtol=1e-12, atol=1e-12)


def _copy_stack(torch, ours, theirs, rng):
    for stack in ("encoder", "decoder"):
        mine, ref = getattr(ours, stack), getattr(theirs, stack)
        for m, t in zip(mine.layers, ref.layers):
            copy_transformer_layer(torch, m, t, rng)
        with torch.no_grad():
            ref.norm.weight.copy_(torch.from_numpy(mine.norm.weight.data))
            ref.norm.bias.copy_(torch.from_numpy(mine.norm.bias.data))


@pytest.mark.torch
@pytest.mark.parametrize("dtype", ["float64", "float32"])
@pytest.mark.parametrize("batch_first, norm_first", [(False, False), (True, True)])
def test_transformer_matches_torch(torch, rng, dtype, batch_first, norm_first):
    options = dict(d_model=8, nhead=2, num_encoder_layers=2, num_decoder_layers=2,
                   dim_feedforward=12, dropout=0.0, batch_first=batch_first, norm_first=norm_first)
    model = eo.Transformer(**options, seed=0).to(dtype)
    _randomise(model, rng)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # torch's note on nested tensors
        ref = torch.nn.Transformer(**options).to(getattr(torch, dtype))
    _copy_stack(torch, model, ref, rng)
    arrays = [_seq(rng, batch_first, 2, 6, dtype), _seq(rng, batch_first, 2, 4, dtype)]
    mine = [eo.tensor(a, requires_grad=True) for a in arrays]
    theirs = [torch.tensor(a, requires_grad=True) for a in arrays]
    mask = eo.Transformer.generate_square_subsequent_mask(4)
    np.testing.assert_array_equal(mask, torch.nn.Transformer.generate_square_subsequent_mask(4))
    src_padding = np.array([[False] * 6, [False] * 4 + [True] * 2])
    out = model(*mine, tgt_mask=mask, src_key_padding_mask=src_padding,
                memory_key_padding_mask=src_padding)
    expected = ref(*theirs, tgt_mask=torch.from_numpy(mask),
                   src_key_padding_mask=torch.from_numpy(src_padding),
                   memory_key_padding_mask=torch.from_numpy(src_padding))
    _backward_both(torch, rng, out, expected, dtype)
    for m, t in zip(mine, theirs):
        np.testing.assert_allclose(m.grad, t.grad.numpy(), rtol=TOL[dtype] * 10,
                                   atol=TOL[dtype] * 10)
    compared = sum(assert_grads_close(transformer_grad_pairs(m, t, f"{stack}.{i}."),
                                      atol=TOL[dtype] * 10)
                   for stack in ("encoder", "decoder")
                   for i, (m, t) in enumerate(zip(getattr(model, stack).layers,
                                                  getattr(ref, stack).layers)))
    assert compared == 2 * 16 + 2 * 26


@pytest.mark.torch
def test_transformer_names_and_initialisation_are_pytorchs(torch):
    model = eo.Transformer(d_model=16, nhead=4, num_encoder_layers=2, num_decoder_layers=1,
                           dim_feedforward=32, seed=0)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        ref = torch.nn.Transformer(d_model=16, nhead=4, num_encoder_layers=2,
                                   num_decoder_layers=1, dim_feedforward=32)
    packed = {"q_proj", "k_proj", "v_proj"}
    ours = {k for k in model.state_dict() if not packed & set(k.split("."))}
    theirs = {k for k in ref.state_dict() if "in_proj" not in k}
    assert ours == theirs
    first, second = model.encoder.layers
    assert not np.array_equal(first.linear1.weight.data, second.linear1.weight.data)
    xavier = np.sqrt(6 / (16 + 32))
    assert np.abs(first.linear1.weight.data).max() <= xavier
    assert np.abs(first.linear1.weight.data).max() > 0.8 * xavier  # not the Linear default
    stacked = np.sqrt(6 / (4 * 16))
    assert np.abs(first.self_attn.q_proj.weight.data).max() <= stacked
    assert np.abs(first.self_attn.out_proj.weight.data).max() <= np.sqrt(6 / 32)


def test_pytorchs_positional_order_and_the_num_heads_spelling():
    layer = eo.TransformerEncoderLayer(8, 2, 16, 0.0, "gelu", 1e-6, True, True)
    assert (layer.nhead, layer.activation_name, layer.norm1.eps, layer.batch_first,
            layer.norm_first) == (2, "gelu", 1e-6, True, True)
    with pytest.warns(UserWarning, match=r"PyTorch's default, \(seq, batch, features\).*"
                                         r"batch_first=True"):
        old = eo.TransformerDecoderLayer(8, num_heads=2, dim_feedforward=16)
    assert old.num_heads == old.nhead == 2 and not old.batch_first
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        eo.TransformerEncoderLayer(8, num_heads=2, dim_feedforward=16, batch_first=True)


@pytest.mark.parametrize("build, problem", [
    (lambda: eo.TransformerEncoderLayer(8), r"TransformerEncoderLayer: nhead \(the number of "
                                            r"attention heads\) must be given once"),
    (lambda: eo.TransformerEncoderLayer(8, 2, num_heads=2), "must be given once"),
    (lambda: eo.TransformerEncoderLayer(8, 2, 16, 0.0, True), "activation must be"),
    (lambda: eo.TransformerEncoderLayer(8, 2, 16)(eo.zeros(2, 5, 4)),
     r"TransformerEncoderLayer\(d_model=8\): expected input of shape \(seq, batch, 8\), got "
     r"\(2, 5, 4\) \(batch_first=False, PyTorch's default\)"),
    (lambda: eo.TransformerDecoderLayer(8, 2, 16)(eo.zeros(5, 2, 8), eo.zeros(4, 3, 8)),
     r"tgt and memory batch sizes differ \(2 and 3; batch_first=False\)"),
    (lambda: eo.Transformer(8, 2, 1, 1, 16)(eo.zeros(5, 2, 8), eo.zeros(4, 3, 8)),
     r"Transformer: src \(5, 2, 8\) and tgt \(4, 3, 8\) batch sizes differ"),
    (lambda: eo.Transformer(8, 3), "MultiHeadAttention"),
    (lambda: eo.TransformerDecoder("layer", 2), "TransformerDecoder: decoder_layer must be"),
    (lambda: eo.TransformerDecoder(eo.TransformerDecoderLayer(8, 2, 16), 0),
     "TransformerDecoder: num_layers must be a positive int"),
    (lambda: eo.Transformer.generate_square_subsequent_mask(-1),
     "generate_square_subsequent_mask: size must be a non-negative int"),
])
def test_bad_arguments_and_input_are_named(build, problem):
    with pytest.raises(eo.EveryOError, match=problem):
        build()


def test_transformer_gradcheck_sequence_first(rng):
    model = eo.Transformer(4, 2, 1, 1, 6, 0.0, seed=0).to("float64")
    _randomise(model, rng)
    mask = eo.Transformer.generate_square_subsequent_mask(3).astype(np.float64)
    assert eo.gradcheck(lambda s, t: model(s, t, tgt_mask=mask), rng.standard_normal((2, 2, 4)),
                        rng.standard_normal((3, 2, 4)), params=list(model.parameters()))


_BUILT: dict = {}


def _ours():
    """An EveryO encoder layer (sequence-first), built once; needs no PyTorch, so its own
    second-derivative check runs where PyTorch is absent."""
    if not _BUILT:
        rng = np.random.default_rng(5)
        layer = eo.TransformerEncoderLayer(4, 2, 6, 0.0, seed=0).to("float64")
        _randomise(layer, rng)
        _BUILT.update(layer=layer, rng=rng)
    return _BUILT["layer"]


def _twins():
    """That layer and its PyTorch twin (built once; the copy randomises the norms on both)."""
    if "ref" not in _BUILT:
        import torch

        layer = _ours()
        ref = torch.nn.TransformerEncoderLayer(4, 2, 6, 0.0).double()
        copy_transformer_layer(torch, layer, ref, _BUILT["rng"])
        _BUILT["ref"] = ref
    return _BUILT["layer"], _BUILT["ref"]


def _layer():
    """The layer the cases run: the PyTorch twin's copy where PyTorch is installed (the copy
    sets its norms), the layer alone where it is not."""
    return _twins()[0] if importlib.util.find_spec("torch") else _ours()


def _theirs(x):
    """PyTorch's layer on its math attention path (its fused CPU kernel has no second
    derivative)."""
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel(SDPBackend.MATH):
        return _twins()[1](x)


SECOND_ORDER = [
    ("encoder_layer_sequence_first", lambda x: _layer()(x), _theirs,
     [lambda rng: rng.standard_normal((3, 2, 4))]),
]
test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))


def test_a_custom_encoder_is_used_as_given():
    encoder = eo.TransformerEncoder(eo.TransformerEncoderLayer(8, 2, 16, batch_first=True), 1)
    model = eo.Transformer(8, 2, 1, 1, 16, custom_encoder=encoder, batch_first=True, seed=0)
    assert model.encoder is encoder and model.encoder.norm is None
    assert model(eo.randn(2, 5, 8, seed=0), eo.randn(2, 3, 8, seed=1)).shape == (2, 3, 8)
