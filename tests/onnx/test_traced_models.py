"""Models with custom forwards, exported by tracing: parity with ONNX Runtime and onnx.reference
at batch 1, 3 and 17, symbolic sequence length, several inputs and outputs, folded batch norm
inside a custom module."""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import numpy as np
import pytest

import everyo as eo
from support.onnx_models import (
    CausalSelfAttention,
    ConvStack,
    DeepResidual,
    ResidualCNN,
    SkipConcatMLP,
    TwoInputs,
    assert_any_length,
    assert_parity,
    op_types,
    with_trained_statistics,
)

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


def test_residual_cnn(tmp_path):
    model = with_trained_statistics(ResidualCNN())
    path = tmp_path / "resnet.onnx"
    eo.export_onnx(model, path, input_shape=(1, 8, 8, 3), verify=True)
    assert_parity(model, path, lambda n: [(n, 8, 8, 3)])
    types = op_types(path)
    assert types.count("Conv") == 5 and "BatchNormalization" not in types
    assert "ReduceMean" in types  # the global average pool written with eo.mean


def test_mlp_with_skip_and_concatenation(tmp_path):
    model = SkipConcatMLP()
    path = tmp_path / "mlp.onnx"
    eo.export_onnx(model, path, input_shape=(2, 6), verify=True)
    assert_parity(model, path, lambda n: [(n, 6)])
    assert {"Concat", "LogSoftmax", "Add"} <= set(op_types(path))


def test_causal_self_attention_runs_at_any_sequence_length(tmp_path, onnx):
    model = CausalSelfAttention()
    path = tmp_path / "attention.onnx"
    eo.export_onnx(model, path, input_shape=(1, 5, 8), input_name="tokens",
                   dynamic_axes={"tokens": {1: "sequence"}}, verify=True)
    for length in (1, 5, 12, 32):
        assert_parity(model, path, lambda n, t=length: [(n, t, 8)])
    graph = onnx.load(str(path)).graph
    for value in (graph.input[0], graph.output[0]):
        dims = value.type.tensor_type.shape.dim
        assert [d.dim_param or d.dim_value for d in dims] == ["batch", "sequence", 8]


def test_a_model_with_two_inputs_and_two_outputs(tmp_path, onnx):
    model = TwoInputs()
    path = tmp_path / "two.onnx"
    eo.export_onnx(model, path, input_shape=[(1, 6, 6, 2), (1, 5)],
                   input_names=["image", "vector"], output_names=["logits", "features"],
                   verify=True)
    assert_parity(model, path, lambda n: [(n, 6, 6, 2), (n, 5)])
    graph = onnx.load(str(path)).graph
    assert [i.name for i in graph.input] == ["image", "vector"]
    assert [o.name for o in graph.output] == ["logits", "features"]
    logits, features = eo.run_onnx(path, {"image": np.ones((4, 6, 6, 2)),
                                          "vector": np.ones((4, 5))})
    assert logits.shape == (4, 2) and features.shape == (4, 40)


def test_conv_bn_relu_inside_a_custom_module_keeps_batch_norm_folded(tmp_path):
    model = with_trained_statistics(ConvStack(), seed=3)
    path = tmp_path / "stack.onnx"
    eo.export_onnx(model, path, input_shape=(1, 6, 6, 3), verify=True)
    assert_parity(model, path, lambda n: [(n, 6, 6, 3)])
    types = op_types(path)
    # Per block: Transpose Conv Transpose, then the folded Mul + Add, then Relu.
    assert types == ["Transpose", "Conv", "Transpose", "Mul", "Add", "Relu"] * 2


def test_training_mode_and_parameters_are_left_alone(tmp_path):
    model = with_trained_statistics(ResidualCNN()).train()
    state = model.state_dict()
    eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(2, 8, 8, 3))
    assert all(module.training for module in model.modules())
    for key, value in model.state_dict().items():
        np.testing.assert_array_equal(value, state[key], err_msg=key)
    assert "forward" not in model.blocks.__dict__  # the tracer's wrappers are gone


def test_output_axes_follow_the_input_axis_they_share(tmp_path, onnx):
    class Pool(eo.Module):
        def forward(self, x):
            return x * 2.0, eo.mean(x, axis=1)

    path = tmp_path / "pool.onnx"
    eo.export_onnx(Pool(), path, input_shape=(2, 4, 3), dynamic_axes={
        "input": {1: "time"}, "output_0": {1: "steps"}})
    dims = [[d.dim_param or d.dim_value for d in o.type.tensor_type.shape.dim]
            for o in onnx.load(str(path)).graph.output]
    assert dims == [["batch", "steps", 3], ["batch", 3]]



def test_a_50_layer_model_exports_one_block_of_nodes_per_block(tmp_path, onnx):
    # Its export time is measured in benchmarks/bench_onnx_export.py (timings stay out of
    # tests); here: the graph grows by the same nodes per block, and runs right.
    model = DeepResidual()
    assert sum(1 for m in model.modules() if isinstance(m, (eo.Linear, eo.LayerNorm))) == 50
    eo.export_onnx(model, tmp_path / "deep.onnx", input_shape=(1, 64))
    eo.export_onnx(DeepResidual(blocks=5), tmp_path / "five.onnx", input_shape=(1, 64))
    deep, five = (len(onnx.load(str(tmp_path / name)).graph.node)
                  for name in ("deep.onnx", "five.onnx"))
    assert deep == 5 * five
    assert_parity(model, tmp_path / "deep.onnx", lambda n: [(n, 64)], sizes=(3,))


class ComparisonMasks(eo.Module):
    """``mask == 0`` (nanoGPT's masked_fill idiom) and ``x > 0`` go into the graph as nodes."""

    def __init__(self, max_len: int = 16):
        super().__init__()
        self.mask = eo.tensor(np.tril(np.ones((max_len, max_len), np.float32)))

    def forward(self, x):
        t = x.shape[1]
        scores = eo.where(self.mask[:t, :t] == 0, -1e9, x @ x.transpose(0, 2, 1))
        gate = eo.where(x > 0, x, 0.0) + eo.where(x != x, 1.0, 0.0) + (x <= 0.5) * 1.0
        return eo.softmax(scores, axis=-1) @ x + gate


def test_comparisons_become_graph_nodes(tmp_path):
    path = tmp_path / "masks.onnx"
    assert_any_length(ComparisonMasks(), path, (1, 5, 3), (2, 9))
    assert {"Equal", "Greater", "Not", "LessOrEqual"} <= set(op_types(path))


class ShapeGymnastics(eo.Module):
    """Reshape through -1, unsqueeze/squeeze/flatten (which read concrete sizes), int and
    negative-step indexing, None/..., pad then slice, stack, a slice ending at ``t``."""

    def __init__(self):
        super().__init__()
        self.fc = eo.Linear(4, 4, seed=0)
        self.position = eo.tensor(np.random.default_rng(0).standard_normal((32, 4)).astype(
            np.float32))

    def forward(self, x):
        b, t, c = x.shape
        h = self.fc(x.reshape(-1, c)).reshape(b, t, c) + self.position[:t]
        g = h.unsqueeze(1).squeeze(1).flatten(1).reshape(b, t, c)
        padded = eo.pad(g, ((0, 0), (1, 0), (0, 0)))[:, :t]
        both = eo.stack([g, g[:, ::-1]], axis=1).sum(axis=1)
        return (both + g[:, -1].reshape(b, 1, c) + g[:, 0:1, :] + padded
                + g[..., None][..., 0] + x[:, t - 1:t])


def test_shape_methods_stay_symbolic(tmp_path):
    assert_any_length(ShapeGymnastics(), tmp_path / "shapes.onnx", (2, 5, 4), (1, 2, 13))


@pytest.mark.parametrize("opset", [18, 20])
def test_newer_opsets_take_reduction_axes_as_inputs(opset, tmp_path, onnx):
    # From opset 18 ReduceMean/Max/Min read their axes from an input, not an attribute.
    model = with_trained_statistics(ResidualCNN())
    path = tmp_path / "resnet.onnx"
    eo.export_onnx(model, path, input_shape=(1, 8, 8, 3), opset=opset, verify=True)
    assert_parity(model, path, lambda n: [(n, 8, 8, 3)], sizes=(3,))
    reduce_mean = next(n for n in onnx.load(str(path)).graph.node if n.op_type == "ReduceMean")
    assert len(reduce_mean.input) == 2 and not any(a.name == "axes" for a in reduce_mean.attribute)


class Conv(eo.Conv2D):
    """Subclasses are traced through their own forward: each reaches its layer's op."""


class MaxPool(eo.MaxPool2D):
    pass


class AvgPool(eo.AvgPool2D):
    pass


class Norm(eo.LayerNorm):
    pass


class Gelu(eo.GELU):
    pass


class Leaky(eo.LeakyReLU):
    pass


@pytest.mark.parametrize("approximate", ["none", "tanh"])
def test_subclasses_of_layers_export_through_their_ops(approximate, tmp_path):
    model = eo.Sequential(
        Conv(3, 4, 3, stride=2, padding="same", seed=0), Gelu(approximate),
        MaxPool(3, stride=2, padding="same"), Leaky(0.2),
        AvgPool(2, stride=1, padding="same"), Norm(4), eo.Flatten(),
        eo.Linear(36, 3, seed=1))
    path = tmp_path / "subclasses.onnx"
    eo.export_onnx(model, path, input_shape=(1, 11, 11, 3), verify=True)
    assert_parity(model, path, lambda n: [(n, 11, 11, 3)])
    assert {"Conv", "MaxPool", "AveragePool", "LeakyRelu", "ReduceMean", "Sqrt"} <= set(
        op_types(path))


def _char_transformer():
    path = Path(__file__).resolve().parents[2] / "examples" / "char_transformer.py"
    spec = importlib.util.spec_from_file_location("char_transformer_for_onnx", path)
    if spec.name not in sys.modules:  # dataclasses look their module up while being built
        sys.modules[spec.name] = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(sys.modules[spec.name])
    return sys.modules[spec.name]


def test_the_char_gpt_block_exports_at_any_context_length(tmp_path):
    # Ported-style attention: split, view, swapaxes, masked_fill with a NumPy mask attribute
    # sliced by the traced length (the tracer turns that slice into a Slice of the whole mask).
    example = _char_transformer()
    config = example.Config(d_model=16, heads=4, block_size=24)
    block = example.Block(config)
    path = tmp_path / "block.onnx"
    eo.export_onnx(block, path, input_shape=(1, 9, 16), dynamic_axes={"input": {1: "context"}},
                   verify=True)
    for length in (1, 9, 24):
        assert_parity(block, path, lambda n, t=length: [(n, t, 16)])


def test_the_whole_char_gpt_is_refused_for_its_embeddings(tmp_path):
    example = _char_transformer()
    model = example.GPT(example.Config(d_model=16, heads=4, block_size=24, layers=2), vocab=11)
    with pytest.raises(eo.EveryOSerializationError) as info:
        eo.export_onnx(model, tmp_path / "gpt.onnx", input_shape=(1, 9))
    assert "tokens (Embedding)" in str(info.value) and "positions (Embedding)" in str(info.value)


class PortedOps(eo.Module):
    """The conveniences ported PyTorch code reaches for, at a symbolic length."""

    def __init__(self):
        super().__init__()
        self.fc = eo.Linear(4, 4, seed=0)

    def forward(self, x):
        b, t, c = x.shape
        square = eo.einsum("btc,bsc->bts", x, self.fc(x))
        causal = eo.tril(square) + eo.triu(square, k=1) * 0.5
        running = eo.cumsum(x, axis=1)
        first = eo.expand(x[:, :1, :], b, t, c)
        masked = eo.masked_fill(causal, square > 0.3, -1.0)
        return (masked @ running + first).permute(0, 2, 1).swapaxes(1, 2)


def test_ported_conveniences_export_at_any_length(tmp_path):
    path = tmp_path / "ported.onnx"
    assert_any_length(PortedOps(), path, (2, 5, 4), (1, 3, 11))
    assert {"Einsum", "Trilu", "CumSum", "Expand"} <= set(op_types(path))


def test_gather_and_scatter_add_with_constant_indices(tmp_path):
    class Pick(eo.Module):
        def forward(self, x):
            picked = eo.gather(x, 1, np.array([[3, 0, 3]]))  # (1, 3): smaller than x, as torch
            return eo.dispatch("scatter_add", picked * 2.0, axis=1, index=np.array([[1, 0, 1]]),
                               shape=(1, 4))

    path = tmp_path / "pick.onnx"
    eo.export_onnx(Pick(), path, input_shape=(2, 4), verify=True)
    assert_parity(Pick(), path, lambda n: [(n, 4)])
    assert {"GatherElements", "ScatterElements"} <= set(op_types(path))


def test_a_bfloat16_model_exports_as_float32(tmp_path, onnx):
    model = SkipConcatMLP().to("bfloat16")
    path = tmp_path / "bf16.onnx"
    eo.export_onnx(model, path, input_shape=(2, 6))
    graph = onnx.load(str(path)).graph
    assert {t.data_type for t in graph.initializer} == {onnx.TensorProto.FLOAT}
    x = np.random.default_rng(0).standard_normal((5, 6)).astype(np.float32)
    with eo.no_grad():
        expected = model.eval()(eo.tensor(x)).data.astype(np.float32)
    # The graph computes in float32; the model rounds every result to bfloat16 (8 bits).
    np.testing.assert_allclose(eo.run_onnx(path, x), expected, rtol=2e-2, atol=2e-2)


class _Diagonals(eo.Module):
    """eo.diag both ways: of a vector along the (symbolic) batch axis, of a fixed-size vector
    and of fixed-size matrices, with offsets."""

    def forward(self, x):
        batch_square = eo.diag(x[:, 0, 0], -1)  # (b + 1, b + 1)
        fixed = eo.diag(x[0, 0], 2)  # (7, 7)
        wide, tall = eo.diag(x[0], 1), eo.diag(x[0].T, -2)  # (3, 5) -> 3, (5, 3) -> 3
        return batch_square.sum() + fixed.sum(axis=0) + (wide * tall).sum()


def test_diag_exports_both_ways_and_keeps_infinities(tmp_path):
    path = tmp_path / "diag.onnx"
    eo.export_onnx(_Diagonals(), path, input_shape=(2, 3, 5), verify=True)
    assert_parity(_Diagonals(), path, lambda n: [(n, 3, 5)])
    assert {"EyeLike", "Where"} <= set(op_types(path))
    x = np.random.default_rng(0).standard_normal((2, 3, 5)).astype(np.float32)
    x[0, 1, 0], x[0, 2, 1] = np.inf, -np.inf  # off the matrices' diagonals, off the vectors
    finite = eo.run_onnx(path, x)
    assert np.all(np.isfinite(finite))  # (inf * 0 would have made them NaN)
    np.testing.assert_allclose(finite, _Diagonals()(eo.tensor(x)).data, rtol=1e-6)
    x[1, 0, 0] = np.inf  # in the batch vector: the square's other elements stay 0, not NaN
    np.testing.assert_array_equal(eo.run_onnx(path, x), np.full(7, np.inf, np.float32))


def test_diag_of_a_matrix_that_follows_the_input_is_refused_by_name(tmp_path):
    class Time(eo.Module):
        def forward(self, x):
            return eo.diag(x[0])

    with pytest.raises(eo.EveryOSerializationError, match="diag of a matrix whose size "
                                                          "follows the input"):
        eo.export_onnx(Time(), tmp_path / "m.onnx", input_shape=(2, 4, 4),
                       dynamic_axes={"input": {1: "time"}})
