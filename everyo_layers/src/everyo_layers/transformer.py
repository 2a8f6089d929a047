"""Transformer building blocks: ``PositionalEncoding`` (on ``(batch, seq, features)``),
``TransformerEncoderLayer``, ``TransformerDecoderLayer`` and ``TransformerEncoder``, with
PyTorch's arguments (``nhead``) and layouts: ``batch_first=False`` (PyTorch's default) takes
``(seq, batch, features)``, ``batch_first=True`` ``(batch, seq, features)``; the masks have
the same shapes in both.

Sub-module names follow PyTorch's (``self_attn``, ``linear1``, ``norm1``, ``dropout1``...), so
a PyTorch state maps onto these layers name by name (see docs/layers_sequence.md).
"""

from __future__ import annotations

import copy
import math
import warnings

import numpy as np

from everyo import EveryOError, Module, Sequential, dispatch, relu
from everyo_layers.attention import MultiHeadAttention, batch_major
from everyo_layers.checks import LayerArgumentError, argument, check_float
from everyo_layers.dropout import Dropout
from everyo_layers.initializers import layer_generator
from everyo_layers.linear import Linear
from everyo_layers.norm import LayerNorm


def sinusoidal_table(max_len: int, d_model: int) -> np.ndarray:
    """``(max_len, d_model)`` float64 table: sin on even features, cos on odd ones.

    Example:
        >>> sinusoidal_table(2, 4)[1].round(4).tolist()
        [0.8415, 0.5403, 0.01, 1.0]
    """
    position = np.arange(max_len, dtype=np.float64)[:, None]
    frequency = np.exp(np.arange(0, d_model, 2, dtype=np.float64) * (-math.log(10000.0) / d_model))
    table = np.zeros((max_len, d_model))
    table[:, 0::2] = np.sin(position * frequency)
    table[:, 1::2] = np.cos(position * frequency[: d_model // 2])
    return table


def _check_sequence(layer: str, x, d_model: int, name: str = "input",
                    batch_first: bool = True) -> np.ndarray:
    data = check_float(layer, x)
    if data.ndim != 3 or data.shape[-1] != d_model:
        layout = "batch, seq" if batch_first else "seq, batch"
        raise EveryOError(f"{layer}: expected {name} of shape ({layout}, {d_model}), "
                          f"got {data.shape}" + ("" if batch_first else
                                                 " (batch_first=False, PyTorch's default)"))
    return data


def number_of_heads(layer: str, nhead, num_heads, batch_first: bool) -> int:
    """PyTorch's ``nhead``, or EveryO's older spelling ``num_heads`` (one of them)."""
    if (nhead is None) == (num_heads is None):
        raise LayerArgumentError(f"{layer}: nhead (the number of attention heads) must be "
                                 f"given once, as nhead or num_heads; got nhead={nhead!r}, "
                                 f"num_heads={num_heads!r}")
    if num_heads is not None and not batch_first:
        # NOTE: EveryO's layers took (batch, seq, features) before batch_first existed;
        # code written for them would now attend across the batch without an error.
        warnings.warn(f"{layer}: the input layout is PyTorch's default, (seq, batch, "
                      f"features) (batch_first=False); pass batch_first=True for (batch, seq, "
                      f"features), or spell the heads nhead= to silence this", stacklevel=4)
    if num_heads is not None:
        return argument(layer, "num_heads", num_heads, "positive int")
    return argument(layer, "nhead", nhead, "positive int")


class PositionalEncoding(Module):
    """Add the fixed sinusoidal position signal of "Attention Is All You Need" to the input.

    Args:
        d_model: features of the input (its last axis).
        max_len: longest sequence accepted.

    The table is a constant, not a parameter or buffer: it is not saved in ``state_dict``.

    Example:
        >>> import everyo as eo
        >>> pe = eo.PositionalEncoding(4, max_len=10)
        >>> pe(eo.zeros(2, 3, 4, dtype="float64")).data[0, 1].round(4).tolist()
        [0.8415, 0.5403, 0.01, 1.0]
    """

    onnx_export = "refused"

    def __init__(self, d_model: int, max_len: int = 5000):
        super().__init__()
        self.d_model = argument("PositionalEncoding", "d_model", d_model, "positive int")
        self.max_len = argument("PositionalEncoding", "max_len", max_len, "positive int")
        self._table = sinusoidal_table(self.max_len, self.d_model)
        self._cast: dict = {}  # dtype -> table in that dtype, built on first use

    def forward(self, x):
        label = f"PositionalEncoding({self.d_model}, max_len={self.max_len})"
        data = _check_sequence(label, x, self.d_model)
        steps = data.shape[1]
        if steps > self.max_len:
            raise EveryOError(f"{label}: sequence of length {steps} is longer than max_len "
                              f"{self.max_len}; build the layer with a larger max_len")
        table = self._cast.get(data.dtype)
        if table is None:
            table = self._cast[data.dtype] = self._table.astype(data.dtype)
        return x + table[:steps]

    def extra_repr(self) -> str:
        return f"{self.d_model}, max_len={self.max_len}"


def _activation(name):
    if callable(name):
        return name
    if name == "relu":
        return relu
    if name == "gelu":
        return lambda x: dispatch("gelu", x, approximate="none")
    raise EveryOError(f"transformer activation must be 'relu', 'gelu' or a callable, got {name!r}")


class _TransformerLayer(Module):
    """What encoder and decoder layers share: arguments, feed-forward block, seeding."""

    def __init__(self, d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                 batch_first, norm_first, seed, num_heads, attention_blocks: int):
        super().__init__()
        name = type(self).__name__  # the layer the user built, not the sublayer that would fail
        self.d_model = argument(name, "d_model", d_model, "positive int")
        self.batch_first = bool(batch_first)
        self.nhead = self.num_heads = number_of_heads(name, nhead, num_heads, self.batch_first)
        num_heads = self.nhead
        self.dim_feedforward = argument(name, "dim_feedforward", dim_feedforward, "positive int")
        argument(name, "dropout", dropout, "probability")
        argument(name, "layer_norm_eps", layer_norm_eps, "non-negative float")
        self.norm_first = bool(norm_first)
        self.activation_name = activation if isinstance(activation, str) else "custom"
        self.activation = _activation(activation)
        seeds = iter(layer_generator(seed).integers(2**32, size=4 + 2 * attention_blocks))
        attention = [MultiHeadAttention(d_model, num_heads, dropout=dropout, seed=next(seeds))
                     for _ in range(attention_blocks)]
        self.self_attn = attention[0]
        if attention_blocks > 1:
            self.multihead_attn = attention[1]
        self.linear1 = Linear(d_model, dim_feedforward, seed=next(seeds))
        self.dropout = Dropout(dropout, seed=next(seeds))
        self.linear2 = Linear(dim_feedforward, d_model, seed=next(seeds))
        for i in range(1, attention_blocks + 2):
            setattr(self, f"norm{i}", LayerNorm(d_model, eps=layer_norm_eps))
            setattr(self, f"dropout{i}", Dropout(dropout, seed=next(seeds)))

    def _feed_forward(self, x):
        return self.linear2(self.dropout(self.activation(self.linear1(x))))

    def extra_repr(self) -> str:
        return (f"d_model={self.d_model}, nhead={self.nhead}, "
                f"dim_feedforward={self.dim_feedforward}, batch_first={self.batch_first}, "
                f"norm_first={self.norm_first}, activation={self.activation_name}")


class TransformerEncoderLayer(_TransformerLayer):
    """Self-attention then a feed-forward block, each with a residual connection and
    ``LayerNorm`` (after the residual by default, before the block with ``norm_first``).

    Args (PyTorch's, in PyTorch's order):
        d_model: features of the input.
        nhead: attention heads (must divide ``d_model``); ``num_heads=`` is accepted too.
        dim_feedforward: hidden width of the feed-forward block.
        dropout: dropout after attention, inside and after the feed-forward block.
        activation: ``"relu"``, ``"gelu"`` or a callable on tensors.
        layer_norm_eps: eps of the LayerNorms.
        batch_first: input and output ``(batch, seq, d_model)``; False (PyTorch's default)
            is ``(seq, batch, d_model)``.
        norm_first: pre-norm (``x + block(norm(x))``) instead of post-norm.
        seed: seed of the initialisation and of the dropout masks.

    Example:
        >>> import everyo as eo
        >>> layer = eo.TransformerEncoderLayer(8, 2, dim_feedforward=16, seed=0)
        >>> layer(eo.randn(5, 2, 8, seed=1)).shape  # (seq, batch, d_model)
        (5, 2, 8)
        >>> eo.TransformerEncoderLayer(8, 2, 16, batch_first=True)(eo.randn(2, 5, 8)).shape
        (2, 5, 8)
    """

    onnx_export = "refused"

    def __init__(self, d_model: int, nhead: int | None = None, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, seed=None, *,
                 num_heads: int | None = None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                         batch_first, norm_first, seed, num_heads, attention_blocks=1)

    def forward(self, src, src_mask=None, src_key_padding_mask=None):
        """``src`` ``(seq, batch, d_model)`` (``(batch, seq, d_model)`` with
        ``batch_first``); masks as in :class:`MultiHeadAttention` in either layout."""
        _check_sequence(f"TransformerEncoderLayer(d_model={self.d_model})", src, self.d_model,
                        batch_first=self.batch_first)
        return batch_major(self._encode(batch_major(src, self.batch_first), src_mask,
                                        src_key_padding_mask), self.batch_first)

    def _encode(self, src, src_mask, src_key_padding_mask):
        """The block on batch-first ``src``."""

        def attend(x):
            x = self.self_attn(x, x, x, attn_mask=src_mask, key_padding_mask=src_key_padding_mask)
            return self.dropout1(x)

        x = src
        if self.norm_first:
            x = x + attend(self.norm1(x))
            return x + self.dropout2(self._feed_forward(self.norm2(x)))
        x = self.norm1(x + attend(x))
        return self.norm2(x + self.dropout2(self._feed_forward(x)))


class TransformerDecoderLayer(_TransformerLayer):
    """Masked self-attention, attention over the encoder's ``memory``, then a feed-forward
    block; each with a residual connection and ``LayerNorm`` (arguments as the encoder layer).

    Example:
        >>> import everyo as eo
        >>> layer = eo.TransformerDecoderLayer(8, 2, dim_feedforward=16, seed=0)
        >>> layer(eo.randn(4, 2, 8, seed=1), eo.randn(6, 2, 8, seed=2)).shape
        (4, 2, 8)
    """

    onnx_export = "refused"

    def __init__(self, d_model: int, nhead: int | None = None, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, seed=None, *,
                 num_heads: int | None = None):
        super().__init__(d_model, nhead, dim_feedforward, dropout, activation, layer_norm_eps,
                         batch_first, norm_first, seed, num_heads, attention_blocks=2)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None):
        """``tgt`` ``(Tt, batch, d_model)``, ``memory`` ``(Tm, batch, d_model)`` (batch first
        with ``batch_first``)."""
        label = f"TransformerDecoderLayer(d_model={self.d_model})"
        check_same_batch(label, tgt, memory, self.d_model, self.batch_first)
        out = self._decode(batch_major(tgt, self.batch_first),
                           batch_major(memory, self.batch_first), tgt_mask, memory_mask,
                           tgt_key_padding_mask, memory_key_padding_mask)
        return batch_major(out, self.batch_first)

    def _decode(self, tgt, memory, tgt_mask, memory_mask, tgt_key_padding_mask,
                memory_key_padding_mask):
        """The block on batch-first ``tgt`` and ``memory``."""

        def self_block(x):
            x = self.self_attn(x, x, x, attn_mask=tgt_mask, key_padding_mask=tgt_key_padding_mask)
            return self.dropout1(x)

        def memory_block(x):
            x = self.multihead_attn(x, memory, memory, attn_mask=memory_mask,
                                    key_padding_mask=memory_key_padding_mask)
            return self.dropout2(x)

        x = tgt
        if self.norm_first:
            x = x + self_block(self.norm1(x))
            x = x + memory_block(self.norm2(x))
            return x + self.dropout3(self._feed_forward(self.norm3(x)))
        x = self.norm1(x + self_block(x))
        x = self.norm2(x + memory_block(x))
        return self.norm3(x + self.dropout3(self._feed_forward(x)))


def check_same_batch(label: str, tgt, memory, d_model: int, batch_first: bool) -> None:
    """Both sequences ``(.., .., d_model)`` in the layout, with the same batch size."""
    axis = 0 if batch_first else 1
    batch = _check_sequence(label, tgt, d_model, "tgt", batch_first).shape[axis]
    other = _check_sequence(label, memory, d_model, "memory", batch_first).shape[axis]
    if other != batch:
        raise EveryOError(f"{label}: tgt and memory batch sizes differ ({batch} and {other}; "
                          f"batch_first={batch_first})")


class TransformerEncoder(Module):
    """``num_layers`` independent deep copies of ``encoder_layer`` applied in turn.

    Args:
        encoder_layer: a :class:`TransformerEncoderLayer` (copied, not shared, as PyTorch).
        num_layers: number of copies.
        norm: optional module applied to the final output (e.g. a ``LayerNorm``).

    Example:
        >>> import everyo as eo
        >>> layer = eo.TransformerEncoderLayer(8, 2, dim_feedforward=16, seed=0)
        >>> encoder = eo.TransformerEncoder(layer, num_layers=2)
        >>> encoder(eo.randn(5, 2, 8, seed=1)).shape, len(encoder.layers)
        ((5, 2, 8), 2)
    """

    onnx_export = "refused"

    def __init__(self, encoder_layer: Module, num_layers: int, norm: Module | None = None):
        super().__init__()
        stack_copies(self, "encoder_layer", encoder_layer, num_layers, norm)

    def forward(self, src, mask=None, src_key_padding_mask=None):
        """Run every layer on ``src`` (in the layers' layout) with the same masks."""
        x = src
        for layer in self.layers:
            x = layer(x, src_mask=mask, src_key_padding_mask=src_key_padding_mask)
        return x if self.norm is None else self.norm(x)


def stack_copies(stack: Module, argument_name: str, layer, num_layers, norm) -> None:
    """Give ``stack`` (an encoder or decoder stack) ``num_layers`` independent copies of
    ``layer`` in ``.layers`` and the final ``norm``, or an error naming the stack."""
    name = type(stack).__name__
    if not isinstance(layer, Module):
        raise LayerArgumentError(f"{name}: {argument_name} must be a Module, got "
                                 f"{type(layer).__name__}")
    stack.num_layers = argument(name, "num_layers", num_layers, "positive int")
    stack.layers = Sequential(*(_independent_copy(layer, i) for i in range(stack.num_layers)))
    stack.norm = norm


def _independent_copy(layer: Module, index: int) -> Module:
    """A deep copy whose dropout layers draw their own masks (a plain copy would clone the
    generator state, and every copy would drop the same elements)."""
    clone = copy.deepcopy(layer)
    for module in clone.modules():
        # NOTE: dropouts without a generator of their own draw from the global one: already
        # different masks in every copy.
        if isinstance(module, Dropout) and module.rng is not None:
            module.rng = np.random.default_rng([index, int(module.rng.integers(2**63))])
    return clone


OPS: dict = {}
LAYERS = {"PositionalEncoding": PositionalEncoding,
          "TransformerEncoderLayer": TransformerEncoderLayer,
          "TransformerDecoderLayer": TransformerDecoderLayer,
          "TransformerEncoder": TransformerEncoder}
