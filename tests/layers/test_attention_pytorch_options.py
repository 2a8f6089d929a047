"""``MultiHeadAttention`` takes ``torch.nn.MultiheadAttention``'s constructor arguments:
``bias=False``, ``kdim``/``vdim`` and ``batch_first`` compute what PyTorch computes (weights
loaded with ``convert_state_dict`` from PyTorch's state dict); ``add_bias_kv`` and
``add_zero_attn`` are refused by name. The forward's ``average_attn_weights`` and ``is_causal``
are PyTorch's too."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

E, HEADS, B, TQ, TK = 8, 2, 3, 4, 5

CASES = [
    {"bias": False}, {"kdim": 6, "vdim": 3}, {"kdim": 6, "vdim": 3, "bias": False},
    {"batch_first": False}, {"kdim": E, "vdim": E}, {"batch_first": False, "kdim": 5},
]


def _inputs(options, rng):
    kdim, vdim = options.get("kdim") or E, options.get("vdim") or E
    shapes = [(B, TQ, E), (B, TK, kdim), (B, TK, vdim)]
    arrays = [rng.standard_normal(s) for s in shapes]
    if options.get("batch_first") is False:
        arrays = [a.transpose(1, 0, 2).copy() for a in arrays]
    return arrays


@pytest.mark.parametrize("options", CASES, ids=lambda o: ",".join(f"{k}={v}" for k, v in
                                                                    o.items()))
@pytest.mark.parametrize("average", [True, False])
def test_matches_pytorch(torch, options, average):
    torch.manual_seed(0)
    ref = torch.nn.MultiheadAttention(E, HEADS, **{"batch_first": True, **options}).double()
    ours = eo.MultiHeadAttention(E, HEADS, **options, seed=0).double()
    ours.load_state_dict(eo.convert_state_dict(ours, ref.state_dict()))
    rng = np.random.default_rng(1)
    arrays = _inputs(options, rng)
    mask = rng.random((B, TK)) < 0.3
    mask[:, 0] = False
    leaves = [eo.Parameter(a) for a in arrays]
    out, weights = ours(*leaves, key_padding_mask=mask, need_weights=True,
                        average_attn_weights=average)
    tleaves = [torch.tensor(a, requires_grad=True) for a in arrays]
    tout, tweights = ref(*tleaves, key_padding_mask=torch.tensor(mask), need_weights=True,
                         average_attn_weights=average)
    np.testing.assert_allclose(out.data, tout.detach().numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(weights.data, tweights.detach().numpy(), rtol=1e-10, atol=1e-12)
    g = rng.standard_normal(out.shape)
    ((out * g).sum() + (weights * weights).sum()).backward()
    ((tout * torch.tensor(g)).sum() + (tweights * tweights).sum()).backward()
    for leaf, tleaf in zip(leaves, tleaves):
        np.testing.assert_allclose(leaf.grad, tleaf.grad.numpy(), rtol=1e-9, atol=1e-11)
    assert (ours.q_proj.bias is None) == (options.get("bias") is False)


@pytest.mark.parametrize("options", CASES[:3], ids=str)
def test_initialisation_follows_pytorchs_distribution(options):
    mha = eo.MultiHeadAttention(64, 4, **options, seed=0)
    for proj, dim in ((mha.q_proj, 64), (mha.k_proj, options.get("kdim", 64)),
                      (mha.v_proj, options.get("vdim", 64))):
        # PyTorch: Xavier-uniform over the stacked (3E, E) matrix when kdim == vdim == E,
        # else over each (E, dim) matrix
        fan = 4 * 64 if "kdim" not in options else 64 + dim
        bound = np.sqrt(6.0 / fan)
        assert proj.weight.shape == (dim, 64)
        assert np.abs(proj.weight.data).max() <= bound
        assert np.abs(proj.weight.data).max() > 0.9 * bound
        assert proj.bias is None or not proj.bias.data.any()


@pytest.mark.parametrize("flag", ["add_bias_kv", "add_zero_attn"])
def test_unsupported_options_are_refused_by_name(flag):
    eo.MultiHeadAttention(E, HEADS, **{flag: False})
    with pytest.raises(EveryOError, match=flag):
        eo.MultiHeadAttention(E, HEADS, **{flag: True})


@pytest.mark.parametrize("options, name", [
    ({"bias": 1}, "bias"), ({"bias": None}, "bias"), ({"kdim": 0}, "kdim"),
    ({"vdim": 2.5}, "vdim"), ({"batch_first": "yes"}, "batch_first"),
])
def test_bad_options_are_named(options, name):
    with pytest.raises(EveryOError, match=name):
        eo.MultiHeadAttention(E, HEADS, **options)


def test_key_of_the_wrong_width_is_named():
    mha = eo.MultiHeadAttention(E, HEADS, kdim=6, vdim=3, seed=0)
    q, k, v = _inputs({"kdim": 6, "vdim": 3}, np.random.default_rng(0))
    with pytest.raises(EveryOError, match="key"):
        mha(q, v, v)
    with pytest.raises(EveryOError, match="value"):
        mha(q, k, k)


def test_is_causal_is_a_hint_about_attn_mask():
    mha = eo.MultiHeadAttention(E, HEADS, seed=0)
    x = np.random.default_rng(0).standard_normal((B, TQ, E))
    mask = np.triu(np.ones((TQ, TQ), bool), 1)
    np.testing.assert_array_equal(mha(x, attn_mask=mask, is_causal=True).data,
                                  mha(x, attn_mask=mask).data)
    with pytest.raises(EveryOError, match="is_causal"):
        mha(x, is_causal=True)  # PyTorch: "Need attn_mask if specifying the is_causal hint"


def test_converter_refuses_pytorchs_packed_weights_for_other_key_widths(torch):
    ref = torch.nn.MultiheadAttention(E, HEADS, batch_first=True).double()
    ours = eo.MultiHeadAttention(E, HEADS, kdim=6, seed=0).double()
    with pytest.raises(EveryOError, match="q_proj_weight"):
        eo.convert_state_dict(ours, ref.state_dict())
