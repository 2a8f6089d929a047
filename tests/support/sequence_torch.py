"""Copy EveryO sequence-layer weights into their PyTorch twins, and compare gradients back.

The two layouts differ only by transposes (EveryO keeps ``Linear``'s ``(in, out)``), which is
exactly what these helpers encode; the oracle tests then compare forward and every gradient.
"""

from __future__ import annotations

import numpy as np


def _set(torch, target, array) -> None:
    with torch.no_grad():
        target.copy_(torch.from_numpy(np.ascontiguousarray(array)))


def copy_recurrent(torch, layer, ref) -> None:
    """RNN/LSTM/GRU: every ``weight_*`` is transposed, biases copied; names are the same."""
    for name, param in layer.named_parameters():
        data = param.data.T if param.data.ndim == 2 else param.data
        _set(torch, getattr(ref, name), data)


def recurrent_grad_pairs(layer, ref):
    """``(name, everyo grad, torch grad in EveryO's layout)`` for every parameter."""
    for name, param in layer.named_parameters():
        grad = getattr(ref, name).grad.numpy()
        yield name, param.grad, grad.T if grad.ndim == 2 else grad


def _in_projection(mha):
    weight = np.concatenate([mha.q_proj.weight.data, mha.k_proj.weight.data,
                             mha.v_proj.weight.data], axis=1).T
    bias = np.concatenate([mha.q_proj.bias.data, mha.k_proj.bias.data, mha.v_proj.bias.data])
    return weight, bias


def copy_attention(torch, mha, ref) -> None:
    """MultiHeadAttention -> torch.nn.MultiheadAttention (stacked in_proj, out_proj)."""
    weight, bias = _in_projection(mha)
    _set(torch, ref.in_proj_weight, weight)
    _set(torch, ref.in_proj_bias, bias)
    _set(torch, ref.out_proj.weight, mha.out_proj.weight.data.T)
    _set(torch, ref.out_proj.bias, mha.out_proj.bias.data)


def attention_grad_pairs(mha, ref, prefix: str = ""):
    """``(name, everyo grad, torch grad in EveryO's layout)`` for the attention parameters."""
    E = mha.embed_dim
    w, b = ref.in_proj_weight.grad.numpy(), ref.in_proj_bias.grad.numpy()
    for i, proj in enumerate((mha.q_proj, mha.k_proj, mha.v_proj)):
        yield f"{prefix}{i}.weight", proj.weight.grad, w[i * E:(i + 1) * E].T
        yield f"{prefix}{i}.bias", proj.bias.grad, b[i * E:(i + 1) * E]
    yield f"{prefix}out.weight", mha.out_proj.weight.grad, ref.out_proj.weight.grad.numpy().T
    yield f"{prefix}out.bias", mha.out_proj.bias.grad, ref.out_proj.bias.grad.numpy()


def _norms(layer):
    return [n for n in ("norm1", "norm2", "norm3") if hasattr(layer, n)]


def copy_transformer_layer(torch, layer, ref, rng) -> None:
    """Encoder/decoder layer -> its torch twin. LayerNorm scales are randomised first (on both
    sides), so that a gradient routed through the wrong norm cannot hide behind ones/zeros."""
    copy_attention(torch, layer.self_attn, ref.self_attn)
    if hasattr(layer, "multihead_attn"):
        copy_attention(torch, layer.multihead_attn, ref.multihead_attn)
    for name in ("linear1", "linear2"):
        _set(torch, getattr(ref, name).weight, getattr(layer, name).weight.data.T)
        _set(torch, getattr(ref, name).bias, getattr(layer, name).bias.data)
    for name in _norms(layer):
        norm = getattr(layer, name)
        norm.weight.data[...] = 1 + 0.5 * rng.standard_normal(norm.weight.shape)
        norm.bias.data[...] = 0.5 * rng.standard_normal(norm.bias.shape)
        _set(torch, getattr(ref, name).weight, norm.weight.data)
        _set(torch, getattr(ref, name).bias, norm.bias.data)


def transformer_grad_pairs(layer, ref, prefix: str = ""):
    """Every parameter gradient of an encoder/decoder layer, paired with torch's."""
    yield from attention_grad_pairs(layer.self_attn, ref.self_attn, prefix + "self_attn.")
    if hasattr(layer, "multihead_attn"):
        yield from attention_grad_pairs(layer.multihead_attn, ref.multihead_attn,
                                        prefix + "multihead_attn.")
    for name in ("linear1", "linear2"):
        mine, theirs = getattr(layer, name), getattr(ref, name)
        yield f"{prefix}{name}.weight", mine.weight.grad, theirs.weight.grad.numpy().T
        yield f"{prefix}{name}.bias", mine.bias.grad, theirs.bias.grad.numpy()
    for name in _norms(layer):
        mine, theirs = getattr(layer, name), getattr(ref, name)
        yield f"{prefix}{name}.weight", mine.weight.grad, theirs.weight.grad.numpy()
        yield f"{prefix}{name}.bias", mine.bias.grad, theirs.bias.grad.numpy()


def assert_grads_close(pairs, atol=1e-10) -> int:
    """Assert every pair is close; returns how many were compared (so a test can check that
    it compared something)."""
    count = 0
    for name, mine, theirs in pairs:
        assert mine is not None, f"{name}: no gradient"
        np.testing.assert_allclose(mine, theirs, atol=atol, rtol=1e-7, err_msg=name)
        count += 1
    return count
