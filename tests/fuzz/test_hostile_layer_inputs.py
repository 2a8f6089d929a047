"""Every public layer, called with what a careless user passes (None, a string, a ragged list,
a 0-d array, bool/int/complex/object arrays, an empty batch, the wrong rank): an
``EveryOError`` (with the layer's path), never a raw NumPy/Python exception, and never a
result computed from booleans, complex numbers or objects as if they were floats."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.errors import EveryOError

BAD = {
    "None": None, "str": "abc", "ragged": [[1.0, 2.0], [3.0]], "0-d": np.array(1.0),
    "bool": np.ones((2, 4, 4, 3), bool), "complex": np.ones((2, 4, 4, 3), complex),
    "object": np.array([object()] * 3), "1-d": np.ones(3, np.float32),
    "nested None": [[None, None, None]],
}
NOT_FLOATS = ("bool", "complex", "object", "nested None")
LAYERS = {
    "Linear": lambda: eo.Linear(3, 4), "Conv2D": lambda: eo.Conv2D(3, 4, 3),
    "Conv1D": lambda: eo.Conv1D(3, 4, 3), "Conv2DTranspose": lambda: eo.Conv2DTranspose(3, 4, 3),
    "MaxPool2D": lambda: eo.MaxPool2D(2), "AvgPool2D": lambda: eo.AvgPool2D(2),
    "BatchNorm2D": lambda: eo.BatchNorm2D(3), "BatchNorm1D": lambda: eo.BatchNorm1D(3),
    "LayerNorm": lambda: eo.LayerNorm(3), "GroupNorm": lambda: eo.GroupNorm(1, 3),
    "InstanceNorm2D": lambda: eo.InstanceNorm2D(3), "RMSNorm": lambda: eo.RMSNorm(3),
    "Dropout": lambda: eo.Dropout(0.5), "ReLU": lambda: eo.ReLU(), "GELU": lambda: eo.GELU(),
    "Softmax": lambda: eo.Softmax(), "LSTM": lambda: eo.LSTM(3, 4), "GRU": lambda: eo.GRU(3, 4),
    "RNN": lambda: eo.RNN(3, 4), "LSTMCell": lambda: eo.LSTMCell(3, 4),
    "MultiHeadAttention": lambda: eo.MultiHeadAttention(3, 1),
    "Upsample": lambda: eo.Upsample(scale_factor=2), "PixelShuffle": lambda: eo.PixelShuffle(2),
    "ReflectionPad2D": lambda: eo.ReflectionPad2D(1),
    "TransformerEncoderLayer": lambda: eo.TransformerEncoderLayer(3, 1, batch_first=True),
}


@pytest.mark.parametrize("value", list(BAD))
@pytest.mark.parametrize("layer", list(LAYERS))
def test_layers_refuse_hostile_inputs_by_name(layer, value):
    module = LAYERS[layer]()
    try:
        out = module(BAD[value])
    except EveryOError:
        return
    # accepted: then only as numbers of a floating dtype, never bools/objects as floats
    assert value not in NOT_FLOATS, f"{layer} computed with {value} input"
    out = out[0] if isinstance(out, tuple) else out
    assert out.data.dtype.kind == "f"
