"""MultiHeadAttention and the fused attention_weights op: gradcheck, PyTorch oracle with and
without masks (first and second derivatives), mask validation."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_layers.attention import causal_mask
from support.second_order import (
    T,
    normal,
    second_order_tests,
)
from support.sequence_torch import assert_grads_close, attention_grad_pairs, copy_attention


def test_attention_weights_op_gradcheck(rng):
    q, k = rng.standard_normal((2, 3, 4)), rng.standard_normal((2, 5, 4))
    mask = np.where(rng.random((3, 5)) < 0.3, -np.inf, rng.standard_normal((3, 5)))
    mask[:, 0] = 0  # keep one key visible in every row

    def weights(q, k):
        return eo.dispatch("attention_weights", q, k, scale=0.5, mask=mask)

    assert eo.gradcheck(weights, q, k)
    out = weights(eo.tensor(q), eo.tensor(k)).data
    np.testing.assert_allclose(out.sum(axis=-1), 1.0)
    assert not out[:, np.isinf(mask)].any()  # hidden keys get exactly zero weight


@pytest.mark.parametrize("cross", [False, True])
def test_gradcheck_inputs_and_parameters(rng, cross):
    mha = eo.MultiHeadAttention(4, 2, seed=0).to("float64")
    for p in mha.parameters():  # non-zero biases, so their gradients are exercised too
        p.data[...] = rng.standard_normal(p.shape) * 0.5
    params = list(mha.parameters())
    query = rng.standard_normal((2, 3, 4))
    mask = causal_mask(3)
    if cross:
        memory = rng.standard_normal((2, 4, 4))
        padding = np.array([[False, False, True, True], [False] * 4])
        assert eo.gradcheck(lambda q, m: mha(q, m, m, key_padding_mask=padding),
                            query, memory, params=params)
    else:
        assert eo.gradcheck(lambda q: mha(q, attn_mask=mask), query, params=params)


def _masks(rng, batch, heads, tq, tk):
    padding = np.zeros((batch, tk), dtype=bool)
    padding[0, -2:] = True
    return {
        "none": {},
        "bool_causal": {"attn_mask": causal_mask(tq)},
        "float": {"attn_mask": rng.standard_normal((tq, tk))},
        "per_head_float": {"attn_mask": rng.standard_normal((batch * heads, tq, tk))},
        "padding": {"key_padding_mask": padding},
        "both": {"attn_mask": causal_mask(tq), "key_padding_mask": padding},
    }


# NOTE: a causal mask is square, so its cases are self-attention only.
ORACLE_CASES = [(kind, False) for kind in ("none", "bool_causal", "float", "per_head_float",
                                           "padding", "both")]
ORACLE_CASES += [(kind, True) for kind in ("none", "float", "per_head_float", "padding")]


@pytest.mark.parametrize("mask_kind,cross", ORACLE_CASES)
def test_matches_torch(torch, rng, mask_kind, cross):
    E, heads, batch, tq = 8, 2, 3, 5
    tk = 6 if cross else tq
    mha = eo.MultiHeadAttention(E, heads, seed=1).to("float64")
    for p in mha.parameters():
        p.data[...] = rng.standard_normal(p.shape) * 0.3
    ref = torch.nn.MultiheadAttention(E, heads, batch_first=True).double()
    copy_attention(torch, mha, ref)
    masks = _masks(rng, batch, heads, tq, tk)[mask_kind]
    query = rng.standard_normal((batch, tq, E))
    key = rng.standard_normal((batch, tk, E)) if cross else query
    value = rng.standard_normal((batch, tk, E)) if cross else query
    mine = [eo.tensor(a, requires_grad=True) for a in (query, key, value)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (query, key, value)]
    out, weights = mha(*mine, need_weights=True, **masks)
    ref_out, ref_weights = ref(*theirs, need_weights=True,
                               **{k: torch.from_numpy(v) for k, v in masks.items()})
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), atol=1e-12)
    np.testing.assert_allclose(weights.data, ref_weights.detach().numpy(), atol=1e-12)
    g, gw = rng.standard_normal(out.shape), rng.standard_normal(weights.shape)
    ((out * g).sum() + (weights * gw).sum()).backward()
    ((ref_out * torch.from_numpy(g)).sum() + (ref_weights * torch.from_numpy(gw)).sum()).backward()
    for m, t in zip(mine, theirs):
        np.testing.assert_allclose(m.grad, t.grad.numpy(), atol=1e-10)
    assert assert_grads_close(attention_grad_pairs(mha, ref)) == 8


def test_output_only_by_default_and_float32():
    mha = eo.MultiHeadAttention(8, 4, seed=0)
    out = mha(eo.randn(2, 3, 8, seed=0))
    assert isinstance(out, eo.Tensor) and out.shape == (2, 3, 8) and out.dtype == "float32"


def test_init_follows_pytorch():
    mha = eo.MultiHeadAttention(16, 4, seed=0)
    bound = np.sqrt(6 / (4 * 16))  # Xavier-uniform over the stacked (3E, E) in-projection
    for proj in (mha.q_proj, mha.k_proj, mha.v_proj):
        assert np.abs(proj.weight.data).max() <= bound and not proj.bias.data.any()
    assert not mha.out_proj.bias.data.any()
    assert np.array_equal(eo.MultiHeadAttention(16, 4, seed=0).q_proj.weight.data,
                          mha.q_proj.weight.data)


def test_dropout_on_weights_only_in_training():
    mha = eo.MultiHeadAttention(8, 2, dropout=0.5, seed=0)
    x = eo.randn(2, 6, 8, seed=1)
    _, train_weights = mha(x, need_weights=True)
    mha.eval()
    _, eval_weights = mha(x, need_weights=True)
    np.testing.assert_allclose(eval_weights.data.sum(axis=-1), 1.0, rtol=1e-5)
    assert not np.allclose(train_weights.data, eval_weights.data)


def test_bad_input_and_masks_are_clear_errors():
    mha = eo.MultiHeadAttention(8, 2)
    label = r"MultiHeadAttention\(8, heads=2\)"
    expected_query = r": expected query of shape \(batch, seq, 8\), got \(2, 3, 6\)"
    with pytest.raises(eo.EveryOError, match=label + expected_query):
        mha(eo.zeros(2, 3, 6))
    with pytest.raises(eo.EveryOError, match=r"expected key of shape \(2, seq, 8\), got \(3, 4, 8\)"):
        mha(eo.zeros(2, 3, 8), eo.zeros(3, 4, 8))
    with pytest.raises(eo.EveryOError, match="same sequence length"):
        mha(eo.zeros(2, 3, 8), eo.zeros(2, 4, 8), eo.zeros(2, 5, 8))
    with pytest.raises(eo.EveryOError, match=r"attn_mask must have shape \(3, 3\).*got \(4, 4\)"):
        mha(eo.zeros(2, 3, 8), attn_mask=causal_mask(4))
    with pytest.raises(eo.EveryOError, match=r"key_padding_mask must have shape.*\(2, 3\)"):
        mha(eo.zeros(2, 3, 8), key_padding_mask=np.zeros((3, 2), bool))
    with pytest.raises(eo.EveryOError, match="bool.*or additive float, got int64"):
        mha(eo.zeros(2, 3, 8), attn_mask=np.zeros((3, 3), np.int64))
    with pytest.raises(eo.EveryOError, match="multiple of num_heads"):
        eo.MultiHeadAttention(10, 3)


def test_attention_over_an_empty_key_sequence_matches_torch(torch, rng):
    """Regression: no keys at all raised NumPy's raw 'zero-size array to reduction' error;
    PyTorch attends to nothing: empty weights, a zero weighted sum (the output projection's
    bias), zero gradients for the query."""
    mha = eo.MultiHeadAttention(8, 2, seed=1).to("float64")
    for p in mha.parameters():
        p.data[...] = rng.standard_normal(p.shape) * 0.3
    ref = torch.nn.MultiheadAttention(8, 2, batch_first=True).double()
    copy_attention(torch, mha, ref)
    query, key = rng.standard_normal((2, 3, 8)), np.zeros((2, 0, 8))
    mine = [eo.tensor(a, requires_grad=True) for a in (query, key)]
    theirs = [torch.tensor(a, requires_grad=True) for a in (query, key)]
    out, weights = mha(mine[0], mine[1], mine[1], need_weights=True)
    ref_out, ref_weights = ref(theirs[0], theirs[1], theirs[1], need_weights=True)
    assert weights.shape == tuple(ref_weights.shape) == (2, 3, 0)
    np.testing.assert_allclose(out.data, ref_out.detach().numpy(), atol=1e-12)
    out.sum().backward()
    ref_out.sum().backward()
    for m, t in zip(mine, theirs):
        np.testing.assert_allclose(m.grad, t.grad.numpy(), atol=1e-12)
    q, k = (eo.tensor(a, requires_grad=True) for a in (rng.standard_normal((2, 3, 4)),
                                                       np.zeros((2, 0, 4))))
    (gq,) = eo.grad(eo.dispatch("attention_weights", q, k).sum() + (q * q).sum(), q,
                    create_graph=True)  # the composite (second derivatives) too
    np.testing.assert_allclose(gq.data, 2 * q.data)


MASK = np.where(np.triu(np.ones((3, 4)), 2) > 0, -np.inf, 0.0)
SECOND_ORDER = [
    ("attention_weights_masked",
     lambda q, k: eo.dispatch("attention_weights", q, k, scale=0.5, mask=MASK),
     lambda q, k: (q @ k.transpose(-1, -2) * 0.5 + T().tensor(MASK)).softmax(-1),
     [normal(2, 3, 5), normal(2, 4, 5)]),
]

test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))
