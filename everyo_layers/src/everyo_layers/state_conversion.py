"""How everyo-layers' layers convert from PyTorch's state dicts (``eo.convert_state_dict``).

Registered through the ``everyo_register_state_converters`` hook, as a third-party plugin
registers its own. Each converter takes PyTorch's arrays with ``entries.take(name, shape)``
(``shape`` is PyTorch's, so a mismatch names both) and returns EveryO's arrays by name.
Layers not listed here (Embedding, LayerNorm, BatchNorm, GroupNorm, ...) store PyTorch's
layout already and keep their arrays as they are.
"""

from __future__ import annotations

import numpy as np

from everyo_layers.attention import MultiHeadAttention
from everyo_layers.conv import Conv2D
from everyo_layers.conv1d import Conv1D
from everyo_layers.conv_transpose import Conv2DTranspose
from everyo_layers.linear import Linear
from everyo_layers.recurrent import GRU, LSTM, RNN


def _bias(layer, entries) -> dict:
    return {} if layer.bias is None else {"bias": entries.take("bias", layer.bias.shape)}


def flattened_rows(weight: np.ndarray, origin: tuple) -> np.ndarray:
    """PyTorch's ``(out, C*H*W)`` weight of a layer after ``Flatten`` as EveryO's
    ``(H*W*C, out)``: ``origin`` is the flattened features' ``(*spatial, C)``.

    Example:
        >>> w = np.arange(12).reshape(1, 12)           # C=3, H=2, W=2, in PyTorch's order
        >>> flattened_rows(w, (2, 2, 3))[:4, 0]        # EveryO's order: h, w, then c
        array([0, 4, 8, 1])
    """
    *spatial, channels = origin
    out = weight.shape[0]
    by_axis = weight.reshape(out, channels, *spatial)
    return np.moveaxis(by_axis, 1, -1).reshape(out, -1).T


def convert_linear(layer: Linear, entries, context) -> dict:
    """``(out, in)`` -> ``(in, out)``; rows permuted after a Flatten of conv features; a weight
    tied in PyTorch's layout (``tie_weight`` of an Embedding's table) is kept as it is."""
    weight = entries.take("weight", (layer.out_features, layer.in_features))
    if layer.weight_transposed:
        return {"weight": weight, **_bias(layer, entries)}
    origin = context.flattened_input(layer)
    converted = weight.T if origin is None else flattened_rows(weight, origin)
    return {"weight": converted, **_bias(layer, entries)}


def convert_conv2d(layer: Conv2D, entries, context) -> dict:
    """``(out, in/groups, kh, kw)`` -> ``(kh, kw, in/groups, out)``."""
    shape = layer.weight.shape
    weight = entries.take("weight", (shape[3], shape[2], shape[0], shape[1]))
    return {"weight": weight.transpose(2, 3, 1, 0), **_bias(layer, entries)}


def convert_conv1d(layer: Conv1D, entries, context) -> dict:
    """``(out, in/groups, k)`` -> ``(k, in/groups, out)``."""
    weight = entries.take("weight", layer.weight.shape[::-1])
    return {"weight": weight.transpose(2, 1, 0), **_bias(layer, entries)}


def convert_conv2d_transpose(layer: Conv2DTranspose, entries, context) -> dict:
    """``ConvTranspose2d``'s ``(in, out, kh, kw)`` -> ``(kh, kw, out, in)``."""
    kh, kw, out, inp = layer.weight.shape
    weight = entries.take("weight", (inp, out, kh, kw))
    return {"weight": weight.transpose(2, 3, 1, 0), **_bias(layer, entries)}


def convert_matrices_transposed(layer, entries, context) -> dict:
    """Every 2-D parameter transposed, the others as they are: the recurrent layers (and
    cells), whose gate order and ``_l{k}``/``_reverse`` names are PyTorch's."""
    converted = {}
    for name in layer._parameter_names:
        value = layer.__dict__[name]
        if value is None:
            continue
        if value.ndim == 2:
            converted[name] = entries.take(name, value.shape[::-1]).T
        else:
            converted[name] = entries.take(name, value.shape)
    return converted


def convert_multihead_attention(layer: MultiHeadAttention, entries, context) -> dict:
    """PyTorch's packed ``in_proj_weight`` ``(3E, E)`` / ``in_proj_bias`` ``(3E,)`` split into
    ``q_proj``, ``k_proj``, ``v_proj`` (each transposed), and ``out_proj``; with other
    ``kdim``/``vdim``, PyTorch's separate ``q_proj_weight`` ``(E, E)``, ``k_proj_weight``
    ``(E, kdim)``, ``v_proj_weight`` ``(E, vdim)``; no biases with ``bias=False``."""
    e = layer.embed_dim
    projections = (layer.q_proj, layer.k_proj, layer.v_proj)
    names = ("q_proj", "k_proj", "v_proj")
    if layer.packed:
        weights = np.split(entries.take("in_proj_weight", (3 * e, e)), 3)
    else:
        weights = [entries.take(f"{name}_weight", (e, proj.in_features))
                   for name, proj in zip(names, projections)]
    converted = {f"{name}.weight": weight.T for name, weight in zip(names, weights)}
    if layer.q_proj.bias is not None:
        biases = np.split(entries.take("in_proj_bias", (3 * e,)), 3)
        converted.update({f"{name}.bias": bias for name, bias in zip(names, biases)})
    converted["out_proj.weight"] = entries.take("out_proj.weight", (e, e)).T
    if layer.out_proj.bias is not None:
        converted["out_proj.bias"] = entries.take("out_proj.bias", (e,))
    return converted


STATE_CONVERTERS = {
    Linear: convert_linear,
    Conv2D: convert_conv2d,
    Conv1D: convert_conv1d,
    Conv2DTranspose: convert_conv2d_transpose,
    RNN: convert_matrices_transposed,
    LSTM: convert_matrices_transposed,
    GRU: convert_matrices_transposed,
    MultiHeadAttention: convert_multihead_attention,
}

#: The recurrent cells keep the full layers' layout and PyTorch's names (``weight_ih``, ...).
STATE_CONVERTERS_BY_NAME = {name: convert_matrices_transposed
                            for name in ("RNNCell", "LSTMCell", "GRUCell")}
