"""``eo.convert_state_dict``: the seven upstream examples' PyTorch models, saved by PyTorch
(``torch.save`` of the state dict, read back as NumPy arrays, and
``safetensors.torch.save_file``), loaded into EveryO's models in one call, give PyTorch's
outputs to 1e-6 (float64); mismatched and unknown keys are named; plugins declare converters.
"""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from tests.layers.porting_examples import EXAMPLES

ROWS = {example.name: example for example in EXAMPLES}


def _missing(example) -> list:
    return [name for name in example.needs if not hasattr(eo, name)]


def _torch_state_by(torch, tmp_path, model, how: str):
    """``model``'s state dict as ``how`` saves and reads it back."""
    if how == "torch.save":
        path = tmp_path / "model.pt"
        torch.save(model.state_dict(), path)
        return {k: v.numpy() for k, v in torch.load(path, weights_only=True).items()}
    safetensors_torch = pytest.importorskip("safetensors.torch")
    path = tmp_path / "model.safetensors"
    # (save_file refuses tensors sharing memory, as a tied weight does: save a copy of each)
    safetensors_torch.save_file({k: v.clone() for k, v in model.state_dict().items()}, path)
    return str(path)


@pytest.mark.parametrize("how", ["torch.save", "safetensors"])
@pytest.mark.parametrize("name", sorted(ROWS))
def test_upstream_example_loads_in_one_call(name, how, tmp_path):
    torch = pytest.importorskip("torch")
    example = ROWS[name]
    if _missing(example):
        pytest.skip(f"EveryO has no {', '.join(_missing(example))} yet")
    torch.manual_seed(0)
    torch_model = example.torch_model(torch).double().eval()
    inputs = example.inputs(np.random.default_rng(0))
    with torch.no_grad():
        expected = example.run_torch(torch, torch_model, inputs)
    model = example.everyo_model().double().eval()
    example_input = None if example.example_input is None else example.example_input(inputs)
    state = eo.convert_state_dict(model, _torch_state_by(torch, tmp_path, torch_model, how),
                                  example_input=example_input)
    model.load_state_dict(state)
    with eo.no_grad():
        outputs = example.run_everyo(model, inputs)
    assert len(outputs) == len(expected)
    for ours, theirs in zip(outputs, expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_the_flattened_dense_layer_gets_its_rows_permuted():
    """A Linear after Flatten of (C, H, W) conv features: PyTorch's rows are C·H·W."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    reference = nn.Sequential(nn.Conv2d(3, 4, 3), nn.ReLU(), nn.Flatten(), nn.Dropout(0.2),
                              nn.Linear(4 * 5 * 6, 7)).double().eval()
    model = eo.Sequential(eo.Conv2D(3, 4, 3), eo.ReLU(), eo.Flatten(), eo.Dropout(0.2),
                          eo.Linear(4 * 5 * 6, 7)).double()
    images = np.random.default_rng(1).standard_normal((2, 3, 7, 8))
    model.load_state_dict(eo.convert_state_dict(
        model, reference.state_dict(), example_input=images.transpose(0, 2, 3, 1)))
    assert model.training  # the trace ran in evaluation mode and restored the mode
    model.eval()
    np.testing.assert_allclose(model(images.transpose(0, 2, 3, 1)).data,
                               reference(torch.tensor(images)).detach().numpy(),
                               rtol=1e-10, atol=1e-10)
    with pytest.raises(eo.EveryOError, match="contains Flatten: pass example_input"):
        eo.convert_state_dict(model, reference.state_dict())


def _conv_then_reshape(base, conv, linear, relu, axes=None):
    """A conv whose features the forward flattens by a reshape, in either framework (permuted
    by ``axes`` first, if given)."""
    class Net(base):
        def __init__(self):
            super().__init__()
            self.conv, self.head = conv(2, 3, 3), linear(3 * 2 * 2, 2)

        def forward(self, x):
            features = relu(self.conv(x))
            features = features if axes is None else features.permute(*axes)
            return self.head(features.reshape(x.shape[0], -1))

    return Net()


@pytest.mark.parametrize("axes", [(0, 3, 1, 2), (0, 3, 2, 1)])
def test_conv_features_permuted_before_the_flatten(axes):
    """An EveryO forward that permutes its NHWC features to PyTorch's NCHW before flattening
    needs PyTorch's rows as they are (only transposed); another order is refused by name."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    reference = _conv_then_reshape(nn.Module, nn.Conv2d, nn.Linear, torch.relu).double()
    model = _conv_then_reshape(eo.Module, eo.Conv2D, eo.Linear, eo.relu, axes).double()
    images = np.random.default_rng(6).standard_normal((2, 4, 4, 2))
    if axes != (0, 3, 1, 2):
        with pytest.raises(eo.EveryOError, match=r"layer 'head'.*permuted by \(0, 3, 2, 1\) "
                                                 r"from channels-last.*by hand"):
            eo.convert_state_dict(model, reference.state_dict(), example_input=images)
        return
    model.load_state_dict(eo.convert_state_dict(model, reference.state_dict(),
                                                example_input=images))
    np.testing.assert_allclose(model(images).data, reference(torch.tensor(
        images.transpose(0, 3, 1, 2))).detach().numpy(), rtol=1e-10, atol=1e-10)


def test_a_forward_that_flattens_conv_features_needs_the_example_input():
    """No Flatten layer, a reshape in forward: without example_input the rows' order is unknown,
    so the call is refused instead of loading PyTorch's C·H·W rows as H·W·C."""
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    reference = _conv_then_reshape(nn.Module, nn.Conv2d, nn.Linear, torch.relu).double()
    model = _conv_then_reshape(eo.Module, eo.Conv2D, eo.Linear, eo.relu).double()
    with pytest.raises(eo.EveryOError, match=r"layer 'head'.*convolution kernels \('conv.weight', "
                                             r"rank 4\).*pass example_input"):
        eo.convert_state_dict(model, reference.state_dict())
    images = np.random.default_rng(5).standard_normal((2, 4, 4, 2))
    model.load_state_dict(eo.convert_state_dict(model, reference.state_dict(),
                                                example_input=images))
    np.testing.assert_allclose(model(images).data, reference(torch.tensor(
        images.transpose(0, 3, 1, 2))).detach().numpy(), rtol=1e-10, atol=1e-10)
    recurrent = eo.Sequential(eo.LSTM(3, 4), eo.Linear(4, 2))  # no kernels: nothing to trace
    assert "1.weight" in eo.convert_state_dict(recurrent, {
        k: (v.T if v.ndim == 2 else v) for k, v in recurrent.state_dict().items()})


def test_attention_packed_in_projection_and_recurrent_stacks():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    attention = nn.MultiheadAttention(8, 2, batch_first=True).double()
    gru = nn.GRU(8, 5, num_layers=2, bidirectional=True, batch_first=True).double()
    x = np.random.default_rng(2).standard_normal((3, 4, 8))
    ours_attention, ours_gru = eo.MultiHeadAttention(8, 2).double(), \
        eo.GRU(8, 5, num_layers=2, bidirectional=True).double()
    ours_attention.load_state_dict(eo.convert_state_dict(ours_attention,
                                                         attention.state_dict()))
    ours_gru.load_state_dict(eo.convert_state_dict(ours_gru, gru.state_dict()))
    t = torch.tensor(x)
    np.testing.assert_allclose(ours_attention(x).data,
                               attention(t, t, t)[0].detach().numpy(), rtol=1e-10, atol=1e-10)
    np.testing.assert_allclose(ours_gru(x).data, gru(t)[0].detach().numpy(),
                               rtol=1e-10, atol=1e-10)


def test_a_mismatched_checkpoint_names_the_parameter_and_both_shapes():
    model = eo.Sequential(eo.Conv2D(3, 8, 3), eo.Flatten(), eo.Linear(72, 10))
    state = {"0.weight": np.zeros((8, 3, 5, 5)), "0.bias": np.zeros(8),
             "2.weight": np.zeros((10, 72)), "2.bias": np.zeros(10), "head.scale": np.ones(1)}
    with pytest.raises(eo.EveryOError) as error:
        eo.convert_state_dict(model, state, example_input=np.zeros((1, 5, 5, 3)))
    message = str(error.value)
    assert "'0.weight' has shape (8, 3, 5, 5) in the checkpoint" in message
    assert "expects (8, 3, 3, 3)" in message
    assert "unexpected key 'head.scale'" in message
    del state["2.bias"]
    with pytest.raises(eo.EveryOError, match="missing key '2.bias'"):
        eo.convert_state_dict(model, state, example_input=np.zeros((1, 5, 5, 3)))


def test_bad_sources_are_refused_by_name(tmp_path):
    model = eo.Sequential(eo.Linear(2, 2))
    with pytest.raises(eo.EveryOError, match="source must be one of"):
        eo.convert_state_dict(model, {}, source="jax")
    with pytest.raises(eo.EveryOError, match="never unpickles"):
        eo.convert_state_dict(model, str(tmp_path / "model.pt"))
    with pytest.raises(eo.EveryOError, match="'0.weight' is a str, not an array"):
        eo.convert_state_dict(model, {"0.weight": "w", "0.bias": np.zeros(2)})


class Scale(eo.Module):
    """A third party's layer storing its factor as PyTorch's ``log_scale`` would, negated."""

    def __init__(self):
        super().__init__()
        self.factor = eo.Parameter(np.ones(3))

    def forward(self, x):
        return x * self.factor


class ScalePlugin:
    @eo.hookimpl
    def everyo_register_state_converters(self, register):
        register(Scale, lambda layer, entries, context:
                 {"factor": np.exp(entries.take("log_scale", (3,)))})


def test_a_plugin_declares_its_layers_conversion():
    model = eo.Sequential(Scale(), eo.Linear(3, 1))
    state = {"0.log_scale": np.log([1.0, 2.0, 4.0]), "1.weight": np.ones((1, 3)),
             "1.bias": np.zeros(1)}
    with pytest.raises(eo.EveryOError, match="missing key '0.factor'"):
        eo.convert_state_dict(model, state)  # without the converter: kept as is, not found
    eo.register_plugin(ScalePlugin(), name="scale-converter")
    try:
        converted = eo.convert_state_dict(model, state)
    finally:
        eo.unregister_plugin("scale-converter")
    np.testing.assert_allclose(converted["0.factor"], [1.0, 2.0, 4.0])
    with pytest.raises(eo.PluginError, match="registered as \\(layer_class, function\\)"):
        eo.register_plugin(type("Bad", (), {"everyo_register_state_converters": eo.hookimpl(
            lambda self, register: register("Scale", print))})(), name="bad-converter")


def test_tied_weights_differing_in_the_checkpoint_are_refused():
    from tests.layers.porting_examples import NINP, NTOKEN, RNNModel

    model = RNNModel()
    state = {k: v.copy() for k, v in model.state_dict().items()}
    state = {k: (v.T if k.startswith("rnn.weight") else v) for k, v in state.items()}
    state["decoder.weight"] = np.zeros((NTOKEN, NINP), np.float32)
    with pytest.raises(eo.EveryOError, match="'decoder.weight' is tied to 'encoder.weight'"):
        eo.convert_state_dict(model, state)


def test_a_tied_weight_saved_once_by_safetensors_save_model(tmp_path):
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    example = ROWS["word_language_model"]
    torch_model = example.torch_model(torch).double().eval()
    safetensors_torch.save_model(torch_model, str(tmp_path / "lm.safetensors"))
    inputs = example.inputs(np.random.default_rng(0))
    model = example.everyo_model().double().eval()
    model.load_state_dict(eo.convert_state_dict(model, str(tmp_path / "lm.safetensors")))
    with torch.no_grad():
        expected = example.run_torch(torch, torch_model, inputs)
    for ours, theirs in zip(example.run_everyo(model, inputs), expected):
        np.testing.assert_allclose(ours, theirs, rtol=1e-6, atol=1e-6)


def test_a_bfloat16_torch_state_dict_converts_as_its_safetensors_file(tmp_path):
    """Tensors NumPy has no dtype for: bfloat16 (what model hubs ship) keeps its bits; another
    (float8) is refused by key and dtype, not a raw TypeError."""
    torch = pytest.importorskip("torch")
    safetensors_torch = pytest.importorskip("safetensors.torch")
    torch.manual_seed(0)
    nn = torch.nn
    reference = nn.Sequential(nn.Conv2d(2, 3, 3), nn.Flatten(), nn.Linear(12, 2)).bfloat16()
    model = eo.Sequential(eo.Conv2D(2, 3, 3), eo.Flatten(), eo.Linear(12, 2)).double()
    images = np.random.default_rng(4).standard_normal((2, 4, 4, 2))
    from_tensors = eo.convert_state_dict(model, reference.state_dict(), example_input=images)
    safetensors_torch.save_file(reference.state_dict(), str(tmp_path / "m.safetensors"))
    from_file = eo.convert_state_dict(model, str(tmp_path / "m.safetensors"),
                                      example_input=images)
    assert list(from_tensors) == list(from_file)
    for key, value in from_file.items():
        assert value.dtype == from_tensors[key].dtype == np.dtype("bfloat16"), key
        np.testing.assert_array_equal(from_tensors[key].view(np.uint16), value.view(np.uint16))
    model.load_state_dict(from_tensors)
    expected = reference.double()(torch.tensor(images.transpose(0, 3, 1, 2)))
    np.testing.assert_allclose(model(images).data, expected.detach().numpy(), rtol=1e-12,
                               atol=1e-12)
    state = {"0.weight": torch.zeros(2, 2, dtype=torch.float8_e5m2), "0.bias": torch.zeros(2)}
    with pytest.raises(eo.EveryOError, match="'0.weight' is a torch tensor of dtype "
                                             "torch.float8_e5m2, which NumPy cannot hold"):
        eo.convert_state_dict(eo.Sequential(eo.Linear(2, 2)), state)


def test_an_unreadable_safetensors_file_is_named(tmp_path):
    pytest.importorskip("safetensors")
    path = tmp_path / "broken.safetensors"
    path.write_bytes(b"\x08\x00\x00\x00\x00\x00\x00\x00{not json")
    with pytest.raises(eo.EveryOError, match="cannot read .*broken.safetensors"):
        eo.convert_state_dict(eo.Linear(2, 2), str(path))


def test_an_example_input_in_the_wrong_layout_and_a_broken_converter_are_named():
    model = eo.Sequential(eo.Conv2D(3, 4, 3), eo.Flatten(), eo.Linear(4 * 4 * 4, 2))
    state = {"0.weight": np.zeros((4, 3, 3, 3)), "0.bias": np.zeros(4),
             "2.weight": np.zeros((2, 64)), "2.bias": np.zeros(2)}
    with pytest.raises(eo.EveryOError, match="running example_input through Sequential"):
        eo.convert_state_dict(model, state, example_input=np.zeros((1, 3, 6, 6)))

    class Broken:
        @eo.hookimpl
        def everyo_register_state_converters(self, register):
            register(Scale, lambda layer, entries, context: {"factor": entries.arrays["x"]})

    eo.register_plugin(Broken(), name="broken-converter")
    try:
        with pytest.raises(eo.EveryOError, match="the converter .* of layer '0' Scale failed: "
                                                 "KeyError"):
            eo.convert_state_dict(eo.Sequential(Scale()), {"0.log_scale": np.zeros(3)})
    finally:
        eo.unregister_plugin("broken-converter")


@pytest.mark.parametrize("flatten_conv1d", [True, False])
def test_flattened_conv1d_features_are_permuted_and_sequence_features_are_not(flatten_conv1d):
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    nn = torch.nn
    x = np.random.default_rng(3).standard_normal((2, 9, 4))  # EveryO's (N, L, C)
    if flatten_conv1d:
        reference = nn.Sequential(nn.Conv1d(4, 5, 3), nn.BatchNorm1d(5), nn.ReLU(),
                                  nn.Flatten(), nn.Linear(5 * 7, 3)).double().eval()
        model = eo.Sequential(eo.Conv1D(4, 5, 3), eo.BatchNorm1D(5), eo.ReLU(), eo.Flatten(),
                              eo.Linear(5 * 7, 3)).double().eval()
        expected = reference(torch.tensor(x.transpose(0, 2, 1)))
    else:  # an LSTM's (N, T, H) outputs flatten in the same order in both frameworks
        class Recurrent(nn.Module):
            def __init__(self):
                super().__init__()
                self.lstm, self.head = nn.LSTM(4, 5, batch_first=True), nn.Linear(9 * 5, 3)

            def forward(self, x):
                return self.head(self.lstm(x)[0].reshape(x.shape[0], -1))

        class EveryORecurrent(eo.Module):
            def __init__(self):
                super().__init__()
                self.lstm, self.head = eo.LSTM(4, 5), eo.Linear(9 * 5, 3)

            def forward(self, x):
                return self.head(self.lstm(x).reshape(x.shape[0], -1))

        reference, model = Recurrent().double(), EveryORecurrent().double()
        expected = reference(torch.tensor(x))
    model.load_state_dict(eo.convert_state_dict(model, reference.state_dict(), example_input=x))
    np.testing.assert_allclose(model(x).data, expected.detach().numpy(), rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize("make, words", [
    (lambda torch: torch.empty(2, 3, device="meta"), "'0.weight'.*meta"),
    (lambda torch: torch.zeros(2, 3).to_sparse(), "'0.weight'.*(S|s)parse"),
    (lambda torch: np.full((2, 3), "a"), "'0.weight' has dtype <U1"),
    (lambda torch: np.zeros((2, 3), object), "'0.weight' has dtype object"),
])
def test_a_tensor_without_numeric_values_is_refused_by_name(make, words):
    # a meta tensor raised a raw NotImplementedError; string and object arrays passed through
    torch = pytest.importorskip("torch")
    with pytest.raises(eo.EveryOError, match=words):
        eo.convert_state_dict(eo.Sequential(eo.Linear(3, 2)),
                              {"0.weight": make(torch), "0.bias": np.zeros(2)})
