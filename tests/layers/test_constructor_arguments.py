"""Every layer constructor refuses arguments of the wrong type (a string, a float where an int
belongs, a bool) with an EveryOError naming the layer class and the argument, never a raw
Python error and never a silent truncation (``Conv2D(3.5, ...)`` used to build 3 channels)."""

from __future__ import annotations

import inspect

import numpy as np
import pytest

import everyo as eo
from everyo_layers import plugin
from everyo_layers.checks import LayerArgumentError

# class name -> (valid positional arguments, {argument name: its position or keyword})
VALID = {
    "Conv2D": (3, 4, 3), "Conv1D": (3, 4, 3), "Conv2DTranspose": (3, 4, 3),
    "MaxPool2D": (), "AvgPool2D": (), "UpSampling2D": (), "AdaptiveAvgPool2D": (2,),
    "Linear": (3, 4), "Softmax": (), "LogSoftmax": (), "LeakyReLU": (), "Softplus": (),
    "ELU": (), "Dropout": (), "LayerNorm": (4,), "BatchNorm1D": (4,), "BatchNorm2D": (4,),
    "GroupNorm": (2, 4), "RMSNorm": (4,), "CrossEntropyLoss": (), "NLLLoss": (),
    "SmoothL1Loss": (), "HuberLoss": (), "RNN": (3, 2), "LSTM": (3, 2), "GRU": (3, 2),
    "RNNCell": (3, 2), "LSTMCell": (3, 2), "GRUCell": (3, 2),
    "InstanceNorm1D": (4,), "InstanceNorm2D": (4,), "PixelShuffle": (2,), "PixelUnshuffle": (2,),
    "ReflectionPad2D": (1,), "ReplicationPad2D": (1,), "Upsample": (4,),
    "Embedding": (10, 4), "MultiHeadAttention": (8, 2), "PositionalEncoding": (8,),
    "TransformerEncoderLayer": (8, 2, 16), "TransformerDecoderLayer": (8, 2, 16),
    "Transformer": (8, 2),
}
# (class name, argument name, position in VALID's tuple or None for a keyword)
NUMERIC_ARGUMENTS = [
    ("Conv2D", "in_channels", 0), ("Conv2D", "out_channels", 1), ("Conv2D", "kernel_size", 2),
    ("Conv2D", "stride", None), ("Conv2D", "dilation", None), ("Conv2D", "groups", None),
    ("Conv1D", "in_channels", 0), ("Conv1D", "out_channels", 1), ("Conv1D", "kernel_size", 2),
    ("Conv1D", "stride", None), ("Conv1D", "dilation", None), ("Conv1D", "groups", None),
    ("Conv2DTranspose", "in_channels", 0), ("Conv2DTranspose", "out_channels", 1),
    ("Conv2DTranspose", "kernel_size", 2), ("Conv2DTranspose", "stride", None),
    ("Conv2DTranspose", "padding", None), ("Conv2DTranspose", "output_padding", None),
    ("MaxPool2D", "pool_size", None), ("MaxPool2D", "stride", None),
    ("AvgPool2D", "pool_size", None), ("AvgPool2D", "stride", None),
    ("UpSampling2D", "size", None), ("AdaptiveAvgPool2D", "output_size", 0),
    ("Linear", "in_features", 0), ("Linear", "out_features", 1),
    ("Softmax", "axis", None), ("LogSoftmax", "axis", None),
    ("LeakyReLU", "negative_slope", None), ("Softplus", "beta", None),
    ("Softplus", "threshold", None), ("ELU", "alpha", None), ("Dropout", "p", None),
    ("LayerNorm", "normalized_shape", 0), ("LayerNorm", "eps", None),
    ("BatchNorm1D", "num_features", 0), ("BatchNorm1D", "eps", None),
    ("BatchNorm1D", "momentum", None), ("BatchNorm2D", "num_features", 0),
    ("BatchNorm2D", "eps", None), ("BatchNorm2D", "momentum", None),
    ("GroupNorm", "num_groups", 0), ("GroupNorm", "num_channels", 1), ("GroupNorm", "eps", None),
    ("RMSNorm", "normalized_shape", 0), ("RMSNorm", "eps", None),
    ("CrossEntropyLoss", "label_smoothing", None), ("CrossEntropyLoss", "ignore_index", None),
    ("NLLLoss", "ignore_index", None), ("SmoothL1Loss", "beta", None),
    ("HuberLoss", "delta", None),
    *[(rnn, arg, at) for rnn in ("RNN", "LSTM", "GRU")
      for arg, at in (("input_size", 0), ("hidden_size", 1), ("num_layers", None),
                      ("dropout", None))],
    *[(norm, arg, at) for norm in ("InstanceNorm1D", "InstanceNorm2D")
      for arg, at in (("num_features", 0), ("eps", None), ("momentum", None))],
    ("PixelShuffle", "upscale_factor", 0), ("PixelUnshuffle", "downscale_factor", 0),
    ("ReflectionPad2D", "padding", 0), ("ReplicationPad2D", "padding", 0),
    ("Upsample", "size", 0),
    *[(cell, arg, at) for cell in ("RNNCell", "LSTMCell", "GRUCell")
      for arg, at in (("input_size", 0), ("hidden_size", 1))],
    ("Embedding", "num_embeddings", 0), ("Embedding", "embedding_dim", 1),
    ("Embedding", "padding_idx", None),
    ("MultiHeadAttention", "embed_dim", 0), ("MultiHeadAttention", "num_heads", 1),
    ("MultiHeadAttention", "dropout", None),
    ("PositionalEncoding", "d_model", 0), ("PositionalEncoding", "max_len", None),
    *[(layer, arg, at) for layer in ("TransformerEncoderLayer", "TransformerDecoderLayer")
      for arg, at in (("d_model", 0), ("nhead", 1), ("dim_feedforward", 2),
                      ("dropout", None), ("layer_norm_eps", None))],
    *[("Transformer", arg, at) for arg, at in (
        ("d_model", 0), ("nhead", 1), ("num_encoder_layers", None), ("num_decoder_layers", None),
        ("dim_feedforward", None), ("dropout", None), ("layer_norm_eps", None))],
]
# Layers whose constructors take no numeric argument (only strings/bools checked elsewhere,
# or array weights), and the one that takes a layer.
NO_NUMERIC_ARGUMENT = {"ReLU", "Sigmoid", "Tanh", "GELU", "SiLU", "Hardswish", "Mish",
                       "Flatten", "GlobalAvgPool2D", "GlobalMaxPool2D", "MSELoss", "L1Loss",
                       "BCEWithLogitsLoss", "KLDivLoss", "BCELoss"}
WRONG_VALUES = ["3", 2.5, True, None, [1.5]]
REAL_VALUED = {"negative_slope", "beta", "threshold", "alpha", "eps", "delta", "layer_norm_eps",
               "p", "dropout", "label_smoothing", "momentum"}  # 2.5 is a fine type for them


def exported_layer_classes() -> dict:
    return {name: layer for module in plugin._modules()
            for name, layer in getattr(module, "LAYERS", {}).items()
            if inspect.isclass(layer) and issubclass(layer, eo.Module)}


def test_every_exported_layer_class_is_covered():
    covered = {layer for layer, _, _ in NUMERIC_ARGUMENTS} | NO_NUMERIC_ARGUMENT
    stacks = {"TransformerEncoder", "TransformerDecoder"}  # they take a layer: tested below
    assert set(exported_layer_classes()) - covered - stacks == set()
    for layer, argument, _ in NUMERIC_ARGUMENTS:  # the table names real arguments
        assert argument in inspect.signature(exported_layer_classes()[layer]).parameters


def _build(layer: str, argument: str, at, value):
    args, kwargs = list(VALID[layer]), {}
    if at is None:
        kwargs[argument] = value
    else:
        args[at] = value
    return getattr(eo, layer)(*args, **kwargs)


@pytest.mark.parametrize("layer, argument, at", NUMERIC_ARGUMENTS,
                         ids=[f"{layer}-{arg}" for layer, arg, _ in NUMERIC_ARGUMENTS])
def test_a_wrong_type_is_refused_naming_the_layer_and_the_argument(layer, argument, at):
    _build(layer, argument, at, inspect.signature(getattr(eo, layer)).parameters[argument].default
           if at is None else VALID[layer][at])  # the valid form builds
    for value in WRONG_VALUES:
        if value is None and argument in ("momentum", "eps", "padding_idx", "stride"):
            continue  # None means "not given" for these, as in PyTorch
        if value == 2.5 and argument in REAL_VALUED:
            continue
        with pytest.raises(eo.EveryOError, match=rf"{layer}\b.*\b{argument}\b") as caught:
            _build(layer, argument, at, value)
        assert isinstance(caught.value, TypeError)  # also catchable as PyTorch's TypeError


def test_the_reported_cases_and_transformer_encoder():
    for build, names in [(lambda: eo.Conv2D("3", 4, 3), "Conv2D.*in_channels"),
                         (lambda: eo.Conv2D(3.5, 4, 3), "Conv2D.*in_channels"),
                         (lambda: eo.GroupNorm(2, 4.0), "GroupNorm.*num_channels"),
                         (lambda: eo.ELU("a"), "ELU.*alpha"),
                         (lambda: eo.RNN("3", 2), "RNN.*input_size"),
                         (lambda: eo.TransformerEncoder(eo.Linear(2, 2), 2.0),
                          "TransformerEncoder.*num_layers"),
                         (lambda: eo.TransformerEncoder("layer", 2),
                          "TransformerEncoder.*encoder_layer"),
                         (lambda: eo.TransformerDecoder(eo.Linear(2, 2), 2.0),
                          "TransformerDecoder.*num_layers")]:
        with pytest.raises(LayerArgumentError, match=names):
            build()


def test_numpy_integers_and_floats_are_accepted():
    conv = eo.Conv2D(np.int64(3), np.int32(4), (np.int64(3), 3), groups=np.int64(1))
    assert (conv.in_channels, conv.out_channels, conv.kernel_size) == (3, 4, (3, 3))
    assert type(conv.in_channels) is int
    assert eo.Dropout(np.float32(0.25)).p == 0.25
    assert eo.GroupNorm(2, 4, eps=1e-3).eps == 1e-3


@pytest.mark.parametrize("build, problem", [
    (lambda: eo.Linear(0, 3), "Linear: in_features must be a positive int, got 0"),
    (lambda: eo.LayerNorm(4, eps=-1.0), "LayerNorm: eps must be a non-negative number"),
    (lambda: eo.ELU(float("nan")), "ELU: alpha must be a finite number"),
    (lambda: eo.ELU(10 ** 400), "ELU: alpha must be a finite number"),  # no float holds it
    (lambda: eo.Softplus(threshold=np.float64("inf")), "Softplus: threshold must be a finite"),
    (lambda: eo.CrossEntropyLoss(label_smoothing=1.5),
     r"CrossEntropyLoss: label_smoothing must be a number in \[0, 1\]"),
    (lambda: eo.Dropout(1.5), r"Dropout: p must be a number in \[0, 1\]"),  # 1 is PyTorch's too
])
def test_values_out_of_range_are_refused_too(build, problem):
    with pytest.raises(eo.EveryOError, match=problem):
        build()


def test_a_numpy_pair_is_a_pair():
    # PyTorch takes kernel_size=np.array([3, 3]); a NumPy pair of floats is still refused.
    assert eo.Conv2D(1, 2, np.array([3, 3]), seed=0).kernel_size == (3, 3)
    with pytest.raises(eo.EveryOError, match="kernel_size"):
        eo.Conv2D(1, 2, np.array([3.5, 3.0]))
