"""Whole models: a trained digits CNN with batch norm, an MLP with BatchNorm1D/LayerNorm, odd
inputs under "same" padding; and what the exported graph looks like (layout, pads, batch)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_layers.geometry import resolve_padding


def digits_cnn(seed=0):
    return eo.Sequential(
        eo.Conv2D(1, 8, 3, padding="same", seed=seed), eo.BatchNorm2D(8), eo.ReLU(),
        eo.MaxPool2D(2),
        eo.Conv2D(8, 16, 3, padding="same", seed=seed + 1), eo.BatchNorm2D(16), eo.ReLU(),
        eo.AvgPool2D(2),
        eo.Flatten(), eo.Dropout(0.25, seed=seed), eo.Linear(64, 10, seed=seed + 2),
    )


def train(model, x, y, steps=25, batch=64, lr=0.01, seed=0):
    rng = np.random.default_rng(seed)
    optimizer = eo.Adam(model.parameters(), lr=lr)
    model.train()
    for _ in range(steps):
        index = rng.choice(len(x), size=batch, replace=False)
        loss = eo.cross_entropy(model(eo.tensor(x[index])), y[index])
        optimizer.zero_grad()
        loss.backward()
        optimizer.step()
    return float(loss.data)


@pytest.fixture(scope="module")
def digits():
    datasets = pytest.importorskip("sklearn.datasets")
    data = datasets.load_digits()
    x = (data.images / 16.0).astype(np.float32)[..., None]  # (N, 8, 8, 1), NHWC
    return x, data.target.astype(np.int64)


def test_trained_digits_cnn_with_batchnorm(digits, parity):
    x, y = digits
    model = digits_cnn()
    train(model, x, y)
    for bn in (model[1], model[5]):  # the statistics the fold must carry are non-trivial
        assert np.abs(bn.running_mean).max() > 0.05
        assert np.abs(bn.running_var - 1.0).max() > 0.05
    model.train()
    parity(model, (1, 8, 8, 1), batches=[x[:5], x[100:137]])
    model.eval()
    logits = eo.run_onnx(parity(model, (1, 8, 8, 1), batches=[x[:3]]), x)
    with eo.no_grad():
        expected = model(eo.tensor(x)).data
    assert (logits.argmax(1) == expected.argmax(1)).all()


def test_mlp_with_batchnorm1d_and_layernorm(digits, parity):
    x, y = digits
    model = eo.Sequential(
        eo.Flatten(), eo.Linear(64, 32, seed=0), eo.BatchNorm1D(32), eo.GELU(), eo.Dropout(0.2),
        eo.Linear(32, 16, seed=1), eo.LayerNorm(16), eo.Tanh(), eo.Linear(16, 10, seed=2),
        eo.LogSoftmax(),
    )
    train(model, x, y, steps=20)
    assert np.abs(model[2].running_mean).max() > 0.05
    parity(model, (4, 8, 8, 1), batches=[x[:3], x[200:211]])
    parity(model, (4, 8, 8, 1), batch_sizes=(1, 9))


def test_same_padding_stride_two_on_odd_inputs(parity):
    model = eo.Sequential(
        eo.Conv2D(3, 6, 3, stride=2, padding="same", seed=0), eo.ReLU(),
        eo.Conv2D(6, 4, 4, stride=2, padding="same", seed=1),
        eo.MaxPool2D(3, stride=2, padding="same"), eo.AvgPool2D(2, padding="same"),
        eo.Flatten(), eo.Linear(4, 2, seed=2),
    )
    parity(model, (2, 11, 13, 3), batch_sizes=(1, 6))


def test_graph_layout_pads_and_symbolic_batch(parity, onnx):
    conv = eo.Conv2D(2, 3, 4, stride=2, padding="same", seed=0)
    pool = eo.AvgPool2D(3, stride=2, padding="same")
    model = eo.Sequential(conv, pool, eo.Flatten(), eo.Linear(18, 2, seed=1))
    path = parity(model, (5, 9, 7, 2))
    graph = onnx.load(str(path)).graph
    batch_dim = graph.input[0].type.tensor_type.shape.dim[0]
    assert batch_dim.dim_param and not batch_dim.HasField("dim_value")
    assert graph.output[0].type.tensor_type.shape.dim[0].dim_param == batch_dim.dim_param
    nodes = list(graph.node)
    attrs = {id(n): {a.name: onnx.helper.get_attribute_value(a) for a in n.attribute}
             for n in nodes}
    assert all("auto_pad" not in attrs[id(n)] for n in nodes)
    for index, node in enumerate(nodes):
        if node.op_type in ("Conv", "AveragePool", "MaxPool"):
            before, after = nodes[index - 1], nodes[index + 1]
            assert before.op_type == after.op_type == "Transpose"
            assert attrs[id(before)]["perm"] == [0, 3, 1, 2]
            assert attrs[id(after)]["perm"] == [0, 2, 3, 1]
    conv_node = next(n for n in nodes if n.op_type == "Conv")
    (top, bottom), (left, right) = resolve_padding("same", (9, 7), (4, 4), (2, 2))
    assert (top, bottom, left, right) == (1, 2, 1, 2)  # odd totals: the extra pad goes last
    assert attrs[id(conv_node)]["pads"] == [top, left, bottom, right]
    pool_node = next(n for n in nodes if n.op_type == "AveragePool")
    assert attrs[id(pool_node)]["count_include_pad"] == 0
    weight = next(i for i in graph.initializer if i.name == conv_node.input[1])
    np.testing.assert_array_equal(onnx.numpy_helper.to_array(weight),
                                  conv.weight.data.transpose(3, 2, 0, 1))
    # Flatten never bakes in the batch size: no Reshape with a shape constant at all.
    assert not any(n.op_type == "Reshape" for n in nodes)


def test_batchnorm_is_folded_into_one_mul_and_add(parity, onnx):
    bn = eo.BatchNorm2D(3)
    bn.running_mean = np.array([0.5, -1.0, 2.0], np.float32)
    bn.running_var = np.array([0.25, 4.0, 1.5], np.float32)
    bn.weight.data[...] = [2.0, -1.0, 0.5]
    bn.bias.data[...] = [0.1, 0.2, -0.3]
    graph = onnx.load(str(parity(bn, (1, 4, 4, 3)))).graph
    assert [n.op_type for n in graph.node] == ["Mul", "Add"]
    constants = {i.name: onnx.numpy_helper.to_array(i) for i in graph.initializer}
    scale = constants[graph.node[0].input[1]]
    shift = constants[graph.node[1].input[1]]
    assert scale.dtype == shift.dtype == np.float32 and scale.shape == (3,)
    expected_scale = bn.weight.data / np.sqrt(bn.running_var.astype(np.float64) + bn.eps)
    np.testing.assert_allclose(scale, expected_scale, rtol=1e-7)
    np.testing.assert_allclose(shift, bn.bias.data - bn.running_mean * expected_scale, rtol=1e-6)


def test_custom_names_and_opset(parity, onnx):
    model = eo.Sequential(eo.Linear(3, 2, seed=0), eo.Softmax())
    path = parity(model, (1, 3), opset=21)
    loaded = onnx.load(str(path))
    assert loaded.opset_import[0].version == 21
    eo.export_onnx(model, path, (1, 3), input_name="pixels", output_name="probs")
    loaded = onnx.load(str(path))
    assert loaded.graph.input[0].name == "pixels" and loaded.graph.output[0].name == "probs"
    assert loaded.opset_import[0].version == 17  # the documented default
    np.testing.assert_allclose(eo.run_onnx(path, np.ones((4, 3))).sum(axis=1), 1.0, rtol=1e-6)


def test_float64_model_exports_a_float32_graph(parity, onnx):
    model = eo.Sequential(eo.Linear(3, 4, seed=0), eo.BatchNorm1D(4), eo.LayerNorm(4),
                          eo.GELU()).to("float64")
    path = parity(model, (1, 3))
    graph = onnx.load(str(path)).graph
    assert all(i.data_type == onnx.TensorProto.FLOAT for i in graph.initializer)
    assert model[0].weight.dtype == "float64"


def test_empty_sequential_is_the_identity(parity):
    parity(eo.Sequential(), (1, 3))
    parity(eo.Sequential(eo.Sequential()), (1, 2, 2))


def test_the_digits_cnn_exports_and_matches_onnxruntime(tmp_path, monkeypatch, ort, digits):
    monkeypatch.chdir(tmp_path)
    x, y = digits
    model = digits_cnn()
    train(model, x, y, steps=5)
    model.eval()
    eo.export_onnx(model, "model.onnx", input_shape=(1, 8, 8, 1), output_name="logits")
    batch = x[:16]
    expected = np.asarray(model(eo.tensor(batch)).data)
    actual = eo.run_onnx("model.onnx", batch)
    assert np.abs(expected - actual).max() < 1e-4
    assert not model.training
