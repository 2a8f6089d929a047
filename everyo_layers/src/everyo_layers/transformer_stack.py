"""``TransformerDecoder`` and ``Transformer``: PyTorch's encoder-decoder model, with its
arguments (``nhead``, ``num_encoder_layers``, ``batch_first=False`` by default, ...), its
sub-module names (``encoder.layers.0.self_attn``, ``encoder.norm``, ``decoder.norm``) and its
initialisation (every weight with more than one axis redrawn from Xavier-uniform after the
layers are copied, as ``nn.Transformer._reset_parameters`` does).
"""

from __future__ import annotations

import math

import numpy as np

from everyo import EveryOError, Module, init
from everyo_layers.attention import MultiHeadAttention
from everyo_layers.checks import argument, array_of
from everyo_layers.initializers import layer_generator
from everyo_layers.norm import LayerNorm
from everyo_layers.transformer import (
    TransformerDecoderLayer,
    TransformerEncoder,
    TransformerEncoderLayer,
    stack_copies,
)


class TransformerDecoder(Module):
    """``num_layers`` independent deep copies of ``decoder_layer`` applied in turn, each
    attending over the same ``memory`` (PyTorch's ``TransformerDecoder``).

    Example:
        >>> import everyo as eo
        >>> layer = eo.TransformerDecoderLayer(8, 2, dim_feedforward=16, seed=0)
        >>> decoder = eo.TransformerDecoder(layer, num_layers=2, norm=eo.LayerNorm(8))
        >>> decoder(eo.randn(4, 2, 8, seed=1), eo.randn(6, 2, 8, seed=2)).shape
        (4, 2, 8)
    """

    onnx_export = "refused"

    def __init__(self, decoder_layer: Module, num_layers: int, norm: Module | None = None):
        super().__init__()
        stack_copies(self, "decoder_layer", decoder_layer, num_layers, norm)

    def forward(self, tgt, memory, tgt_mask=None, memory_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None):
        """Run every layer on ``tgt`` over ``memory`` (in the layers' layout)."""
        x = tgt
        for layer in self.layers:
            x = layer(x, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                      tgt_key_padding_mask=tgt_key_padding_mask,
                      memory_key_padding_mask=memory_key_padding_mask)
        return x if self.norm is None else self.norm(x)


class Transformer(Module):
    """PyTorch's ``nn.Transformer``: an encoder stack over ``src`` and a decoder stack over
    ``tgt`` attending to the encoder's output, each ending in a ``LayerNorm``.

    Args (PyTorch's, in its order):
        d_model, nhead, num_encoder_layers, num_decoder_layers, dim_feedforward, dropout,
        activation, custom_encoder, custom_decoder, layer_norm_eps, batch_first (False:
        ``(seq, batch, d_model)``, PyTorch's default), norm_first; and ``seed`` (of the
        initialisation and of the dropout masks).

    Example:
        >>> import everyo as eo
        >>> model = eo.Transformer(d_model=8, nhead=2, num_encoder_layers=1,
        ...                        num_decoder_layers=1, dim_feedforward=16, seed=0)
        >>> mask = eo.Transformer.generate_square_subsequent_mask(4)
        >>> model(eo.randn(6, 2, 8, seed=1), eo.randn(4, 2, 8, seed=2), tgt_mask=mask).shape
        (4, 2, 8)
    """

    onnx_export = "refused"

    def __init__(self, d_model: int = 512, nhead: int = 8, num_encoder_layers: int = 6,
                 num_decoder_layers: int = 6, dim_feedforward: int = 2048,
                 dropout: float = 0.1, activation="relu", custom_encoder: Module | None = None,
                 custom_decoder: Module | None = None, layer_norm_eps: float = 1e-5,
                 batch_first: bool = False, norm_first: bool = False, seed=None):
        super().__init__()
        name = "Transformer"
        self.d_model = argument(name, "d_model", d_model, "positive int")
        self.nhead = argument(name, "nhead", nhead, "positive int")
        self.batch_first = bool(batch_first)
        # the model the user built is named, not the layer inside that would fail
        argument(name, "dim_feedforward", dim_feedforward, "positive int")
        argument(name, "dropout", dropout, "probability")
        argument(name, "layer_norm_eps", layer_norm_eps, "non-negative float")
        rng = layer_generator(seed)
        seeds = iter(rng.integers(2**32, size=2))
        options = dict(dim_feedforward=dim_feedforward, dropout=dropout, activation=activation,
                       layer_norm_eps=layer_norm_eps, batch_first=batch_first,
                       norm_first=norm_first)
        encoder_seed, decoder_seed = next(seeds), next(seeds)
        self.encoder = custom_encoder if custom_encoder is not None else TransformerEncoder(
            TransformerEncoderLayer(d_model, nhead, seed=encoder_seed, **options),
            argument(name, "num_encoder_layers", num_encoder_layers, "positive int"),
            LayerNorm(d_model, eps=layer_norm_eps))
        self.decoder = custom_decoder if custom_decoder is not None else TransformerDecoder(
            TransformerDecoderLayer(d_model, nhead, seed=decoder_seed, **options),
            argument(name, "num_decoder_layers", num_decoder_layers, "positive int"),
            LayerNorm(d_model, eps=layer_norm_eps))
        self._reset_parameters(rng)

    def _reset_parameters(self, rng) -> None:
        """PyTorch's: Xavier-uniform for every weight of more than one axis. Attention's query,
        key and value weights are one stacked ``(3E, E)`` matrix there, so they are drawn with
        the stacked matrix's bound."""
        stacked = {id(proj.weight) for module in self.modules()
                   if isinstance(module, MultiHeadAttention)
                   for proj in (module.q_proj, module.k_proj, module.v_proj)}
        for parameter in self.parameters():
            if parameter.ndim < 2:
                continue
            if id(parameter) in stacked:
                bound = math.sqrt(6.0 / (4 * parameter.shape[0]))
                init.uniform_(parameter, -bound, bound, generator=rng)
            else:
                init.xavier_uniform_(parameter, generator=rng)

    @staticmethod
    def generate_square_subsequent_mask(size: int) -> np.ndarray:
        """``(size, size)`` float32 mask, ``-inf`` above the diagonal (a query sees itself and
        the keys before it) and 0 elsewhere, as PyTorch's."""
        size = argument("Transformer.generate_square_subsequent_mask", "size", size,
                        "non-negative int")
        return np.triu(np.full((size, size), -np.inf, np.float32), k=1)

    def forward(self, src, tgt, src_mask=None, tgt_mask=None, memory_mask=None,
                src_key_padding_mask=None, tgt_key_padding_mask=None,
                memory_key_padding_mask=None):
        """``src`` ``(S, batch, d_model)`` and ``tgt`` ``(T, batch, d_model)`` (batch first with
        ``batch_first``); returns the decoder's output, shaped like ``tgt``."""
        axis = 0 if self.batch_first else 1
        src_shape, tgt_shape = array_of(src).shape, array_of(tgt).shape
        if len(src_shape) == len(tgt_shape) == 3 and src_shape[axis] != tgt_shape[axis]:
            raise EveryOError(f"Transformer: src {src_shape} and tgt {tgt_shape} batch sizes "
                              f"differ (batch_first={self.batch_first})")
        memory = self.encoder(src, mask=src_mask, src_key_padding_mask=src_key_padding_mask)
        return self.decoder(tgt, memory, tgt_mask=tgt_mask, memory_mask=memory_mask,
                            tgt_key_padding_mask=tgt_key_padding_mask,
                            memory_key_padding_mask=memory_key_padding_mask)

    def extra_repr(self) -> str:
        return f"d_model={self.d_model}, nhead={self.nhead}, batch_first={self.batch_first}"


LAYERS = {"TransformerDecoder": TransformerDecoder, "Transformer": Transformer}
