"""What the exporter refuses, and that a refusal writes nothing: layers refused by name (each
named with its module path), batch norm without running statistics, bad arguments; and what it
no longer refuses: subclasses, which are traced like any module."""

from __future__ import annotations

import os
import re

import numpy as np
import pytest

import everyo as eo

UNSUPPORTED = {
    "RNN": lambda: eo.RNN(4, 4),
    "LSTM": lambda: eo.LSTM(4, 4),
    "GRU": lambda: eo.GRU(4, 4),
    "RNNCell": lambda: eo.RNNCell(4, 4),
    "LSTMCell": lambda: eo.LSTMCell(4, 4),
    "GRUCell": lambda: eo.GRUCell(4, 4),
    "Embedding": lambda: eo.Embedding(10, 4),
    "MultiHeadAttention": lambda: eo.MultiHeadAttention(4, 2),
    "PositionalEncoding": lambda: eo.PositionalEncoding(4),
    "TransformerEncoderLayer": lambda: eo.TransformerEncoderLayer(4, 2, dim_feedforward=8),
    "TransformerDecoderLayer": lambda: eo.TransformerDecoderLayer(4, 2, dim_feedforward=8),
    "TransformerEncoder": lambda: eo.TransformerEncoder(
        eo.TransformerEncoderLayer(4, 2, dim_feedforward=8), num_layers=2),
    "TransformerDecoder": lambda: eo.TransformerDecoder(
        eo.TransformerDecoderLayer(4, 2, dim_feedforward=8), num_layers=2),
    "Transformer": lambda: eo.Transformer(4, 2, 1, 1, dim_feedforward=8),
}


def leftovers(directory) -> list[str]:
    return sorted(os.listdir(directory))


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_layer_is_refused_by_name(name, tmp_path):
    model = eo.Sequential(eo.Linear(4, 4, seed=0), eo.ReLU(), UNSUPPORTED[name]())
    with pytest.raises(eo.EveryOSerializationError, match=rf"\b2 \({name}\)"):
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(1, 3, 4))
    assert leftovers(tmp_path) == []


@pytest.mark.parametrize("name", sorted(UNSUPPORTED))
def test_unsupported_layer_as_the_whole_model(name, tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match=rf"the model \({name}\)"):
        eo.export_onnx(UNSUPPORTED[name](), tmp_path / "m.onnx", input_shape=(1, 3, 4))
    assert leftovers(tmp_path) == []


def test_every_unsupported_layer_is_named_at_once(tmp_path):
    model = eo.Sequential(
        eo.Embedding(10, 4), eo.LSTM(4, 4), eo.Linear(4, 4, seed=0),
        eo.Sequential(eo.ReLU(), eo.GRU(4, 4), eo.Sequential(eo.MultiHeadAttention(4, 2))),
    )
    with pytest.raises(eo.EveryOSerializationError) as info:
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(1, 3, 4))
    message = str(info.value)
    for label in ("0 (Embedding)", "1 (LSTM)", "3.1 (GRU)", "3.2.0 (MultiHeadAttention)"):
        assert label in message
    assert "4 refusals" in message and "Linear" not in message
    assert leftovers(tmp_path) == []


def test_existing_file_survives_a_refused_export(tmp_path):
    path = tmp_path / "model.onnx"
    path.write_bytes(b"the previous export")
    with pytest.raises(eo.EveryOSerializationError, match="LSTM"):
        eo.export_onnx(eo.Sequential(eo.LSTM(4, 4)), path, input_shape=(1, 3, 4))
    assert path.read_bytes() == b"the previous export"
    assert leftovers(tmp_path) == ["model.onnx"]


@pytest.mark.parametrize("cls", ["BatchNorm1D", "BatchNorm2D"])
def test_batchnorm_without_running_stats_is_refused(cls, tmp_path):
    bn = getattr(eo, cls)(3, track_running_stats=False)
    shape = (2, 3) if cls == "BatchNorm1D" else (2, 4, 4, 3)
    model = eo.Sequential(eo.ReLU(), bn)
    path = tmp_path / "bn.onnx"
    path.write_bytes(b"old")
    with pytest.raises(eo.EveryOSerializationError, match=rf"\b1 \({cls}\): .*track_running_stats"):
        eo.export_onnx(model, path, input_shape=shape)
    assert path.read_bytes() == b"old" and leftovers(tmp_path) == ["bn.onnx"]


def test_a_refused_layer_that_cannot_run_on_the_sample_is_still_reported_as_refused(tmp_path):
    # Regression: with input_shape=(1, C) the refused BatchNorm1D also failed to run on the
    # one-row sample (batch statistics of one value), and that error hid the refusal.
    model = eo.Sequential(eo.Linear(3, 3), eo.BatchNorm1D(3, track_running_stats=False),
                          eo.Linear(3, 2))
    with pytest.raises(eo.EveryOSerializationError,
                       match=r"cannot export to ONNX \(refusal\): 1 \(BatchNorm1D\).*track_running_stats"):
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(1, 3))
    assert leftovers(tmp_path) == []


def test_refused_configuration_and_missing_converter_reported_together(tmp_path):
    model = eo.Sequential(eo.BatchNorm1D(4, track_running_stats=False), eo.BatchNorm1D(4),
                          eo.BatchNorm1D(4, track_running_stats=False))
    with pytest.raises(eo.EveryOSerializationError) as info:
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(2, 4))
    assert "0 (BatchNorm1D)" in str(info.value) and "2 (BatchNorm1D)" in str(info.value)
    assert "1 (BatchNorm1D)" not in str(info.value)


def test_a_subclass_of_a_converted_layer_is_traced_not_exported_as_its_parent(parity, onnx):
    class ScaledLinear(eo.Linear):  # computes something else than Linear
        def forward(self, x):
            return super().forward(x) * 2.0

    path = parity(eo.Sequential(ScaledLinear(3, 2, seed=0)), (1, 3))
    assert "Mul" in [n.op_type for n in onnx.load(str(path)).graph.node]


def test_a_subclass_of_sequential_is_traced_through_its_own_forward(parity):
    class Reversed(eo.Sequential):  # same children, another computation
        def forward(self, x):
            for layer in reversed(list(self)):
                x = layer(x)
            return x

    parity(eo.Sequential(eo.ReLU(), Reversed(eo.Linear(3, 3, seed=0), eo.Tanh())), (1, 3))


@pytest.mark.parametrize("kwargs, pattern", [
    ({"input_shape": (0, 3)}, "input_shape"),
    ({"input_shape": "13"}, "input_shape"),
    ({"input_shape": (1, 3), "opset": 12}, "opset"),
    ({"input_shape": (1, 3), "opset": 10_000}, "opset"),
    ({"input_shape": (1, 3), "input_name": "x", "output_name": "x"}, "must differ"),
    ({"input_shape": (1, 3), "output_name": ""}, "output_name"),
    ({"input_shape": (1, 5)}, r"Linear.*shape \(1, 5\)"),
])
def test_bad_arguments_are_named(kwargs, pattern, tmp_path):
    model = eo.Sequential(eo.Linear(3, 2, seed=0))
    with pytest.raises(eo.EveryOSerializationError, match=pattern):
        eo.export_onnx(model, tmp_path / "m.onnx", **kwargs)
    assert leftovers(tmp_path) == []


class TwoInputs(eo.Module):
    def forward(self, x, y, scale=2.0):
        return x * y * scale


class AnyInputs(eo.Module):
    def forward(self, *xs):
        return eo.concatenate(list(xs), axis=-1)


@pytest.mark.parametrize("model, shapes, pattern", [
    (eo.Sequential(eo.Linear(3, 2, seed=0)), [(1, 3), (1, 3)],
     r"2 input shapes for 1 input: Sequential.forward\(x\)"),
    (TwoInputs(), [(1, 3), (1, 3), (1, 3), (1, 3)],
     r"4 input shapes for 2 to 3 inputs: TwoInputs.forward\(x, y, scale=2.0\)"),
    (TwoInputs(), (1, 3), r"1 input shape for 2 to 3 inputs"),
])
def test_input_shapes_that_do_not_fit_the_forward_are_named(model, shapes, pattern, tmp_path):
    """Regression: one shape too many reached the forward call as a raw TypeError."""
    with pytest.raises(eo.EveryOSerializationError, match=pattern):
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=shapes)
    assert leftovers(tmp_path) == []


def test_a_forward_taking_any_number_of_inputs_takes_every_shape(tmp_path, ort):
    eo.export_onnx(AnyInputs(), tmp_path / "m.onnx", input_shape=[(1, 2), (1, 3), (1, 1)],
                   verify=True)


class Predict(eo.Module):
    def __init__(self):
        super().__init__()
        self.head = eo.Linear(4, 3, seed=0)

    def forward(self, x):
        return self.head(x).argmax(axis=-1)


class Constant(eo.Module):
    def __init__(self):
        super().__init__()
        self.table = eo.Parameter(np.ones((1, 3), np.float32))

    def forward(self, x):
        return self.table


@pytest.mark.parametrize("model, pattern", [
    (Predict(), r"output 0 of the model is an int64 Tensor computed outside the ops the tracer "
                r"sees.*argmax/argmin.*take the argmax of the exported model's output"),
    (Constant(), r"output 0 of the model is a float32 Tensor that no op computed from the "
                 r"inputs \(the parameter 'table'\)"),
])
def test_an_untraced_output_is_named_for_what_it_is(model, pattern, tmp_path):
    """Regression: an argmax output was reported as "not computed from the inputs", which it
    was; it was computed outside dispatch, where the tracer cannot see it."""
    with pytest.raises(eo.EveryOSerializationError, match=pattern):
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(2, 4))
    assert leftovers(tmp_path) == []


def test_missing_directory_is_named(tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match=re.escape(str(tmp_path / "nope"))):
        eo.export_onnx(eo.ReLU(), tmp_path / "nope" / "m.onnx", input_shape=(1, 2))


def test_not_a_module_is_refused(tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match="Module"):
        eo.export_onnx(lambda x: x, tmp_path / "m.onnx", input_shape=(1, 2))


def test_successful_export_leaves_only_the_file(tmp_path, ort):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    eo.export_onnx(eo.Sequential(eo.Linear(3, 2, seed=0)), path, (1, 3), verify=True)
    assert leftovers(tmp_path) == ["m.onnx"] and path.read_bytes() != b"old"
    assert np.isfinite(eo.run_onnx(path, np.ones((2, 3)))).all()
