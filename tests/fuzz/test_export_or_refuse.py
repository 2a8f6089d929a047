"""Differential fuzzer of the exporter's promise: a random model either exports and agrees with
both ONNX consumers, or is refused by name, and a refused export writes no file. The pieces
mix convertible ones (from tests/onnx/test_random_compositions.py) with the layers the
specification refuses by name (recurrent layers, attention, positional encoding), and in-place
writes: exported when the graph can express them, refused naming the method when not."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import everyo as eo
from support.fuzz_settings import FUZZ

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")

from support.random_pieces import FEATURES, PIECES, Composition, assert_as_accurate_as_the_model


def _as_sequence(x, layers):
    """A layer on (batch, 1, features) used on (batch, features)."""
    return layers[0](x.reshape(x.shape[0], 1, FEATURES)).reshape(x.shape[0], FEATURES)


def _written(x, write):
    """A fresh value, written in place (the tracer exports the write as the value's new one)."""
    h = x * 1.0
    write(h)
    return h


# in-place writes the exporter expresses: kind -> (layers it owns, forward(x, layers))
IN_PLACE = {
    "add_": (lambda s: [], lambda x, ls: _written(x, lambda h: h.add_(0.5))),
    "mul_ by a tensor": (lambda s: [], lambda x, ls: _written(
        x, lambda h: h.mul_(eo.tensor(np.linspace(-1.0, 1.0, FEATURES, dtype=np.float32))))),
    "clamp_": (lambda s: [], lambda x, ls: _written(x, lambda h: h.clamp_(-1.0, 1.0))),
    "setitem": (lambda s: [], lambda x, ls: _written(
        x, lambda h: h.__setitem__((slice(None), 0), 0.25))),
    "setitem a mask": (lambda s: [], lambda x, ls: _written(
        x, lambda h: h.__setitem__(h > 0.5, 0.5))),
}

# kind -> (class or method name the refusal must name, layers it owns, forward(x, layers))
REFUSED = {
    # a write through a view of another traced value: the graph cannot express it
    "write through a view": ("copy_", lambda s: [], lambda x, ls: _written(
        x, lambda h: h[:, 1].fill_(0.0))),
    "lstm": ("LSTM", lambda s: [eo.LSTM(FEATURES, FEATURES)], _as_sequence),
    "gru": ("GRU", lambda s: [eo.GRU(FEATURES, FEATURES)], _as_sequence),
    "rnn": ("RNN", lambda s: [eo.RNN(FEATURES, FEATURES)], _as_sequence),
    "attention": ("MultiHeadAttention", lambda s: [eo.MultiHeadAttention(FEATURES, 2)],
                  _as_sequence),
    "positional": ("PositionalEncoding", lambda s: [eo.PositionalEncoding(FEATURES)],
                   _as_sequence),
}


# Every kind, as random_pieces' Composition takes them.
TABLE = {**PIECES, **IN_PLACE,
         **{kind: (build, run) for kind, (_, build, run) in REFUSED.items()}}


@given(kinds=st.lists(st.sampled_from(sorted(TABLE)), min_size=1,
                      max_size=5))
@FUZZ
def test_a_random_model_exports_correctly_or_is_refused_by_name(kinds, tmp_path_factory):
    model = Composition(kinds, TABLE)
    path = tmp_path_factory.mktemp("fuzz") / "m.onnx"
    refused = [REFUSED[kind][0] for kind in kinds if kind in REFUSED]
    if refused:
        with pytest.raises(eo.EveryOError) as caught:
            eo.export_onnx(model, path, input_shape=(2, FEATURES))
        # The first refused layer in forward order is the one the exporter meets.
        assert refused[0] in str(caught.value), str(caught.value)
        assert not path.exists()
        assert list(path.parent.iterdir()) == [], "a refused export left a file behind"
    else:
        eo.export_onnx(model, path, input_shape=(2, FEATURES))
        assert_as_accurate_as_the_model(model, path)
