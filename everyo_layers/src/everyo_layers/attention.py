"""``MultiHeadAttention`` on ``(batch, seq, features)`` input, with PyTorch's mask semantics.

The attention weights ``softmax(q k^T / sqrt(d) + mask)`` are ONE fused op
(``attention_weights``) with a hand-written backward, so a mask or a scale costs no extra graph
nodes; the projections are ``Linear`` layers and the weighted sum is a core ``matmul``.
"""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Module, Op, Tensor, dispatch, matmul
from everyo.kernels import is_floating, swap_last
from everyo_layers.checks import LayerArgumentError, argument, check_float
from everyo_layers.dropout import Dropout
from everyo_layers.initializers import layer_generator
from everyo_layers.linear import Linear


class AttentionWeightsOp(Op):
    """``softmax(q @ k^T * scale + mask)`` over the last axis.

    Operands ``q`` ``(..., Tq, d)`` and ``k`` ``(..., Tk, d)``; attrs ``scale`` and ``mask``
    (an additive float array broadcastable to ``(..., Tq, Tk)``, ``-inf`` where a key is
    hidden, or None). Returns ``(..., Tq, Tk)``.
    """

    precision = "float32"
    __slots__ = ("scale",)

    def forward(self, q, k, scale=1.0, mask=None):
        self.scale = scale
        scores = np.matmul(q, np.swapaxes(k, -1, -2))
        scores *= scores.dtype.type(scale)
        if mask is not None:
            scores = scores + mask
        if scores.shape[-1]:  # no keys: nothing to attend to, empty weights (as PyTorch)
            scores -= scores.max(axis=-1, keepdims=True)
            np.exp(scores, out=scores)
            scores /= scores.sum(axis=-1, keepdims=True)
        self.saved = (q, k, scores)
        return scores

    def backward(self, g):
        q, k, p = self.saved
        d_scores = p * (g - (g * p).sum(axis=-1, keepdims=True))
        d_scores *= d_scores.dtype.type(self.scale)
        dq = np.matmul(d_scores, k) if self.needs_input_grad[0] else None
        dk = np.matmul(np.swapaxes(d_scores, -1, -2), q) if self.needs_input_grad[1] else None
        return dq, dk

    def composite(self, q, k):
        """``softmax(q k^T * scale + mask)`` with differentiable ops."""
        scores = dispatch("matmul", q, swap_last(k)) * self.scale
        mask = self.attrs.get("mask")
        if mask is not None:
            scores = scores + mask
        return dispatch("softmax", scores, axis=-1)


def additive_mask(mask, dtype) -> np.ndarray:
    """A PyTorch-style mask as an additive float array: bool True (hidden) -> ``-inf``."""
    data = mask.data if isinstance(mask, Tensor) else np.asarray(mask)
    if data.dtype == bool:
        out = np.zeros(data.shape, dtype)
        out[data] = -np.inf
        return out
    if not is_floating(data.dtype):
        raise EveryOError(f"attention masks are bool (True = hidden) or additive float, "
                          f"got {data.dtype.name}")
    return data.astype(dtype, copy=False)


def causal_mask(size: int) -> np.ndarray:
    """A ``(size, size)`` bool mask hiding future positions (True above the diagonal).

    Example:
        >>> causal_mask(3).astype(int)
        array([[0, 1, 1],
               [0, 0, 1],
               [0, 0, 0]])
    """
    return np.triu(np.ones((size, size), dtype=bool), k=1)


class MultiHeadAttention(Module):
    """Multi-head scaled dot-product attention (``batch_first`` by default, as Keras).

    Args:
        embed_dim: features of the query (and of the output).
        num_heads: parallel heads; must divide ``embed_dim``.
        dropout: dropout probability on the attention weights (training only).
        bias: the four projections learn biases (PyTorch's ``bias``).
        add_bias_kv, add_zero_attn: PyTorch's; only False (their default) is supported.
        kdim, vdim: features of key and value (default ``embed_dim``), as PyTorch's.
        batch_first: ``(batch, seq, features)`` input and output (EveryO's default);
            False is PyTorch's default layout, ``(seq, batch, features)``.
        seed: seed of the initialisation and of the dropout masks.

    Attributes:
        q_proj, k_proj, v_proj, out_proj: ``Linear`` layers (``kdim``/``vdim`` inputs for
            ``k_proj``/``v_proj``). PyTorch's ``in_proj_weight`` is ``concat([q_proj.weight,
            k_proj.weight, v_proj.weight], axis=1).T`` and ``out_proj.weight`` is
            ``out_proj.weight.T``; with other ``kdim``/``vdim`` its ``q_proj_weight``,
            ``k_proj_weight``, ``v_proj_weight`` are each projection's ``weight.T``.

    Example:
        >>> import everyo as eo
        >>> mha = eo.MultiHeadAttention(8, 2, seed=0)
        >>> x = eo.randn(3, 5, 8, seed=1)
        >>> mha(x).shape, mha(x, need_weights=True)[1].shape
        ((3, 5, 8), (3, 5, 5))
    """

    onnx_export = "refused"

    def __init__(self, embed_dim: int, num_heads: int, dropout: float = 0.0, bias: bool = True,
                 add_bias_kv: bool = False, add_zero_attn: bool = False, kdim=None, vdim=None,
                 batch_first: bool = True, seed=None):
        super().__init__()
        name = "MultiHeadAttention"
        embed_dim = argument(name, "embed_dim", embed_dim, "positive int")
        num_heads = argument(name, "num_heads", num_heads, "positive int")
        argument(name, "dropout", dropout, "probability")
        bias = argument(name, "bias", bias, "bool")
        for flag, value in (("add_bias_kv", add_bias_kv), ("add_zero_attn", add_zero_attn)):
            if argument(name, flag, value, "bool"):
                raise LayerArgumentError(f"{name}: {flag}=True is not supported (PyTorch's "
                                         f"extra key/value positions); leave it False")
        self.kdim = embed_dim if kdim is None else argument(name, "kdim", kdim, "positive int")
        self.vdim = embed_dim if vdim is None else argument(name, "vdim", vdim, "positive int")
        self.batch_first = argument(name, "batch_first", batch_first, "bool")
        if embed_dim % num_heads:
            raise EveryOError(f"MultiHeadAttention: embed_dim ({embed_dim}) must be a positive "
                              f"multiple of num_heads ({num_heads})")
        self.embed_dim, self.num_heads = embed_dim, num_heads
        self.head_dim = self.embed_dim // self.num_heads
        seeds = layer_generator(seed).integers(2**32, size=5)
        self.q_proj, self.k_proj, self.v_proj, self.out_proj = (
            Linear(features, embed_dim, bias=bias, seed=s) for features, s in
            zip((embed_dim, self.kdim, self.vdim, embed_dim), seeds[:4]))
        # NOTE: PyTorch's init: Xavier-uniform over the stacked (3E, E) input projection (over
        # each (E, dim) one when kdim or vdim differ) and zero biases (out_proj keeps Linear's
        # init for its weight, zero bias).
        rng = np.random.default_rng(seeds[4])
        for proj in (self.q_proj, self.k_proj, self.v_proj):
            fans = 4 * embed_dim if self.packed else embed_dim + proj.in_features
            bound = math.sqrt(6.0 / fans)
            proj.weight.data[...] = rng.uniform(-bound, bound, proj.weight.shape)
            if proj.bias is not None:
                proj.bias.data[...] = 0
        if self.out_proj.bias is not None:
            self.out_proj.bias.data[...] = 0
        self.dropout = Dropout(dropout, seed=int(seeds[4]))

    @property
    def packed(self) -> bool:
        """PyTorch stores the three input projections as one ``in_proj_weight`` (same dims)."""
        return self.kdim == self.embed_dim and self.vdim == self.embed_dim

    @property
    def label(self) -> str:
        return f"MultiHeadAttention({self.embed_dim}, heads={self.num_heads})"

    def _check(self, name: str, x, batch=None, features=None) -> np.ndarray:
        data = check_float(self.label, x)
        features = self.embed_dim if features is None else features
        if data.ndim != 3 or data.shape[-1] != features or (
                batch is not None and data.shape[0] != batch):
            layout = "batch, seq" if batch is None else f"{batch}, seq"
            if not self.batch_first:
                layout = "seq, batch" if batch is None else f"seq, {batch}"
            raise EveryOError(f"{self.label}: expected {name} of shape ({layout}, "
                              f"{features}), got {np.shape(x)}")
        return data

    def _split_heads(self, x, seq: int):
        batch = x.shape[0]
        return x.reshape(batch, seq, self.num_heads, self.head_dim).transpose(0, 2, 1, 3)

    def _mask(self, attn_mask, key_padding_mask, batch, tq, tk, dtype):
        """Both masks as one additive array broadcastable to (batch, heads, tq, tk)."""
        total = None
        if attn_mask is not None:
            mask = additive_mask(attn_mask, dtype)
            if mask.shape == (tq, tk):
                pass
            elif mask.shape == (batch * self.num_heads, tq, tk):
                mask = mask.reshape(batch, self.num_heads, tq, tk)
            else:
                raise EveryOError(f"{self.label}: attn_mask must have shape ({tq}, {tk}) or "
                                  f"(batch*heads, {tq}, {tk}) = "
                                  f"({batch * self.num_heads}, {tq}, {tk}), got {mask.shape}")
            total = mask
        if key_padding_mask is not None:
            mask = additive_mask(key_padding_mask, dtype)
            if mask.shape != (batch, tk):
                raise EveryOError(f"{self.label}: key_padding_mask must have shape "
                                  f"(batch, key seq) = ({batch}, {tk}), got {mask.shape}")
            mask = mask[:, None, None, :]
            total = mask if total is None else total + mask
        return total

    def forward(self, query, key=None, value=None, attn_mask=None, key_padding_mask=None,
                need_weights: bool = False, average_attn_weights: bool = True,
                is_causal: bool = False):
        """Attend from ``query`` to ``key``/``value`` (both default to ``query``).

        Args:
            query: ``(batch, Tq, embed_dim)``; key: ``(batch, Tk, kdim)``; value:
                ``(batch, Tk, vdim)`` (sequence first with ``batch_first=False``).
            attn_mask: ``(Tq, Tk)`` or ``(batch*heads, Tq, Tk)``; bool True hides a key,
                a float mask is added to the scores (PyTorch's semantics).
            key_padding_mask: ``(batch, Tk)``; True (or ``-inf``) marks padding keys.
            need_weights: also return the attention weights.
            average_attn_weights: the weights averaged over the heads ``(batch, Tq, Tk)``;
                False: per head, ``(batch, heads, Tq, Tk)`` (PyTorch's).
            is_causal: PyTorch's hint that ``attn_mask`` is the causal mask (which is then
                applied as given); without ``attn_mask`` it is refused, as PyTorch does.

        Returns:
            ``(batch, Tq, embed_dim)``, or ``(output, weights)``.
        """
        if argument(self.label, "is_causal", is_causal, "bool") and attn_mask is None:
            raise EveryOError(f"{self.label}: is_causal=True is a hint that attn_mask is the "
                              f"causal mask; pass attn_mask too (e.g. causal_mask(seq))")
        key = query if key is None else key
        value = key if value is None else value
        q_data = self._check("query", query)
        batch_axis = 0 if self.batch_first else 1
        batch = q_data.shape[batch_axis]
        if not self.batch_first:  # (checked before the swap, which needs three axes)
            self._check("key", key, None, self.kdim)
            self._check("value", value, None, self.vdim)
            query, key, value = (batch_major(t, False) for t in (query, key, value))
            q_data = np.swapaxes(q_data, 0, 1)
        tq = q_data.shape[1]
        tk = self._check("key", key, batch, self.kdim).shape[1]
        tv = self._check("value", value, batch, self.vdim).shape[1]
        if tv != tk:
            raise EveryOError(f"{self.label}: key and value must have the same sequence "
                              f"length, got {tk} and {tv}")
        mask = self._mask(attn_mask, key_padding_mask, batch, tq, tk, q_data.dtype)
        q = self._split_heads(self.q_proj(query), tq)
        k = self._split_heads(self.k_proj(key), tk)
        v = self._split_heads(self.v_proj(value), tk)
        weights = dispatch("attention_weights", q, k, scale=1.0 / math.sqrt(self.head_dim),
                           mask=mask)
        weights = self.dropout(weights)
        heads = matmul(weights, v)  # (batch, heads, Tq, head_dim)
        out = self.out_proj(heads.transpose(0, 2, 1, 3).reshape(batch, tq, self.embed_dim))
        out = batch_major(out, self.batch_first)
        if need_weights:
            return out, weights.mean(axis=1) if average_attn_weights else weights
        return out

    def extra_repr(self) -> str:
        options = "".join(f", {name}={getattr(self, name)}" for name, default in (
            ("kdim", self.embed_dim), ("vdim", self.embed_dim), ("batch_first", True))
            if getattr(self, name) != default)
        bias = "" if self.q_proj.bias is not None else ", bias=False"
        return (f"{self.embed_dim}, num_heads={self.num_heads}, dropout={self.dropout.p}"
                f"{bias}{options}")


def batch_major(x, batch_first: bool):
    """``x`` as ``(batch, seq, features)``: itself, or the swap of its first two axes (its own
    inverse, so it also turns a result back into the sequence-first layout)."""
    return x if batch_first else dispatch("transpose", x, axes=(1, 0, 2))


OPS = {"attention_weights": AttentionWeightsOp}
LAYERS = {"MultiHeadAttention": MultiHeadAttention}
