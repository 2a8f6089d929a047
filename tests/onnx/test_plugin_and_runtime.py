"""The plugin side: converters registered by layer class (a third party's too) and written by
registered name, everyo-onnx without everyo-layers, lazy imports of onnx/onnxruntime with
install hints, ``run_onnx``'s checks, and ``verify=True``."""

from __future__ import annotations

import os
import subprocess
import sys

import numpy as np
import pytest

import everyo as eo
from everyo_onnx.converters.by_name import by_layer_name, by_op_name
from everyo_onnx.runtime import MissingOnnxPackageError


class Affine(eo.Module):
    """A third party's layer: ``x * scale + shift`` per feature."""

    def __init__(self, scale, shift):
        super().__init__()
        self.scale = eo.Parameter(np.asarray(scale, np.float32))
        self.shift = eo.Parameter(np.asarray(shift, np.float32))

    def forward(self, x):
        return x * self.scale + self.shift


class Residual(eo.Module):
    """A third party's container: ``x + inner(x)``."""

    def __init__(self, inner):
        super().__init__()
        self.inner = inner

    def forward(self, x):
        return x + self.inner(x)


class Doubler(eo.Module):
    def forward(self, x):
        return x * 2.0


def convert_affine(layer, ctx, x):
    scaled = ctx.node("Mul", [x, ctx.constant(layer.scale.data, "scale")])
    return ctx.node("Add", [scaled, ctx.constant(layer.shift.data, "shift")])


def convert_residual(layer, ctx, x):
    return ctx.node("Add", [x, ctx.convert(layer.inner, x)])


def convert_doubler_wrongly(layer, ctx, x):  # a buggy converter: verify=True must catch it
    return ctx.node("Mul", [x, ctx.constant(3.0, "three")])


class Invalid(eo.Module):
    def forward(self, x):
        return x


class Crashing(eo.Module):
    def forward(self, x):
        return x


def convert_invalid(layer, ctx, x):  # an op ONNX does not have: onnx.checker must refuse it
    return ctx.node("NoSuchOperator", [x])


def convert_crashing(layer, ctx, x):
    raise KeyError("some converter bug")


class ThirdParty:
    @eo.hookimpl
    def everyo_register_onnx_converters(self, register):
        register(Affine, convert_affine)
        register(Residual, convert_residual)
        register(Doubler, convert_doubler_wrongly)
        register(Invalid, convert_invalid)
        register(Crashing, convert_crashing)


@pytest.fixture(scope="module", autouse=True)
def third_party():
    eo.register_plugin(ThirdParty(), name="onnx-tests-third-party")
    yield
    eo.unregister_plugin("onnx-tests-third-party")


def test_builtin_converters_are_registered_by_class():
    converters = eo.registry("onnx_converters")
    for name in ("Linear", "Conv2D", "MaxPool2D", "AvgPool2D", "Flatten", "Dropout",
                 "BatchNorm1D", "BatchNorm2D", "LayerNorm", "ReLU", "Sigmoid", "Tanh", "Softmax",
                 "LogSoftmax", "GELU", "LeakyReLU"):
        assert getattr(eo, name) in converters
        assert converters.owners[getattr(eo, name)] == "everyo_onnx"
    assert eo.Sequential not in converters  # containers are traced
    for name in ("RNN", "LSTM", "GRU", "Embedding", "MultiHeadAttention"):
        assert getattr(eo, name) not in converters


def test_every_core_op_has_an_onnx_converter():
    """A new core op needs its twin in ``everyo_onnx/converters/ops_*.py`` (docs/architecture.md,
    "Where does a new X go"): a model of core ops always exports."""
    ops, converters = eo.registry("ops"), eo.registry("onnx_converters")
    assert sorted(name for name in ops.owned_by("everyo") if ops[name] not in converters) == []


def test_a_converter_table_resolves_whole_or_not_at_all():
    convert = object()
    assert by_op_name({"add": convert, "matmul": convert}) == {
        eo.registry("ops")["add"]: convert, eo.registry("ops")["matmul"]: convert}
    assert by_layer_name({"NoSuchLayer": convert, "NorThisOne": convert}) == {}  # not loaded
    with pytest.raises(eo.PluginError, match=r"layers \['Conv2d'\], which no loaded plugin"):
        by_layer_name({"Conv2D": convert, "Conv2d": convert})  # a misspelt name


# A model of core ops only, exported and verified where everyo-layers is not installed:
# ``sys.modules["everyo_layers"] = None`` is what an uninstalled package looks like to import
# and find_spec, and EVERYO_DISABLE_PLUGINS keeps its entry point (still on disk) unloaded.
WITHOUT_LAYERS = """
import sys
sys.modules["everyo_layers"] = None
import numpy as np
import everyo as eo

class Mlp(eo.Module):
    def __init__(self):
        super().__init__()
        self.w = eo.Parameter(np.linspace(-1, 1, 12, dtype=np.float32).reshape(4, 3))
        self.b = eo.Parameter(np.float32([0.1, -0.2, 0.3]))

    def forward(self, x):
        return eo.log_softmax(eo.relu(x @ self.w + self.b), axis=-1)

eo.export_onnx(Mlp(), sys.argv[1], input_shape=(2, 4), verify=True)
x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
with eo.no_grad():
    expected = Mlp()(eo.tensor(x)).data
assert np.allclose(eo.run_onnx(sys.argv[1], x), expected, atol=1e-5)
assert not hasattr(eo, "Linear") and sys.modules["everyo_layers"] is None
assert all(cls.__module__.startswith("everyo.ops.") for cls in eo.registry("onnx_converters").items)
"""


def test_everyo_onnx_exports_models_of_core_ops_without_everyo_layers(tmp_path, ort):
    env = {**os.environ, "EVERYO_DISABLE_PLUGINS": "everyo_layers"}
    result = subprocess.run([sys.executable, "-c", WITHOUT_LAYERS, str(tmp_path / "m.onnx")],
                            capture_output=True, text=True, timeout=300, env=env)
    assert result.returncode == 0, result.stderr
    assert "Warning" not in result.stderr, result.stderr  # no plugin failed to load
    assert os.path.getsize(tmp_path / "m.onnx") > 0


def test_third_party_converters_export_and_match(parity, onnx):
    rng = np.random.default_rng(0)
    model = eo.Sequential(
        eo.Linear(4, 6, seed=0),
        Affine(rng.normal(size=6), rng.normal(size=6)),
        Residual(eo.Sequential(eo.Tanh(), Affine(rng.normal(size=6), np.zeros(6)))),
        eo.Softmax(),
    )
    path = parity(model, (2, 4))
    assert [n.op_type for n in onnx.load(str(path)).graph.node].count("Mul") == 2


def test_unsupported_layer_inside_a_third_party_container_is_named(tmp_path):
    model = eo.Sequential(eo.ReLU(), Residual(eo.Sequential(eo.Tanh(), eo.GRU(4, 4))))
    with pytest.raises(eo.EveryOSerializationError, match=r"1\.inner\.1 \(GRU\)"):
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(2, 3, 4))
    assert os.listdir(tmp_path) == []


def test_verify_catches_a_wrong_converter_and_writes_nothing(tmp_path, ort):
    model = eo.Sequential(eo.Linear(3, 3, seed=0), Doubler())
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    with pytest.raises(eo.EveryOSerializationError, match="disagrees"):
        eo.export_onnx(model, path, input_shape=(1, 3), verify=True)
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["m.onnx"]
    eo.export_onnx(model, path, input_shape=(1, 3))  # without verify the wrong graph is written
    x = np.ones((2, 3), np.float32)
    with eo.no_grad():
        assert not np.allclose(eo.run_onnx(path, x), model(eo.tensor(x)).data)


def test_graph_failing_the_checker_writes_nothing(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    with pytest.raises(eo.EveryOSerializationError, match="onnx.checker.*NoSuchOperator"):
        eo.export_onnx(eo.Sequential(eo.ReLU(), Invalid()), path, input_shape=(1, 3))
    assert path.read_bytes() == b"old" and os.listdir(tmp_path) == ["m.onnx"]


def test_a_crashing_converter_is_reported_with_its_layer(tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match=r"\b1 \(Crashing\).*some converter bug"):
        eo.export_onnx(eo.Sequential(eo.ReLU(), Crashing()), tmp_path / "m.onnx", (1, 3))
    assert os.listdir(tmp_path) == []


def test_verify_passes_for_a_correct_model(tmp_path, ort):
    model = eo.Sequential(eo.Conv2D(2, 3, 3, padding="same", seed=0), eo.ReLU(), eo.Flatten())
    eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(4, 5, 5, 2), verify=True)
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_importing_everyo_does_not_import_onnx():
    code = ("import sys, everyo as eo; import everyo_onnx.plugin; "
            "assert callable(eo.export_onnx) and callable(eo.run_onnx); "
            "print('onnx' in sys.modules, 'onnxruntime' in sys.modules, eo.onnx_available())")
    result = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True,
                            timeout=120)
    assert result.returncode == 0, result.stderr
    assert result.stdout.split() == ["False", "False", "True"]


def test_run_onnx_without_onnxruntime_gives_an_install_hint(monkeypatch, tmp_path):
    path = tmp_path / "relu.onnx"
    eo.export_onnx(eo.ReLU(), path, input_shape=(1, 2))
    monkeypatch.setitem(sys.modules, "onnxruntime", None)  # what an uninstalled package does
    with pytest.raises(MissingOnnxPackageError, match=r"pip install .*onnxruntime") as info:
        eo.run_onnx(path, np.ones((1, 2)))
    assert isinstance(info.value, ImportError) and isinstance(info.value, eo.EveryOError)
    with pytest.raises(MissingOnnxPackageError, match="onnxruntime"):
        eo.export_onnx(eo.ReLU(), tmp_path / "v.onnx", input_shape=(1, 2), verify=True)
    assert sorted(os.listdir(tmp_path)) == ["relu.onnx"]


def test_export_without_onnx_gives_an_install_hint(monkeypatch, tmp_path):
    monkeypatch.setitem(sys.modules, "onnx", None)
    assert eo.onnx_available() is False
    with pytest.raises(MissingOnnxPackageError, match=r"pip install everyo-onnx"):
        eo.export_onnx(eo.ReLU(), tmp_path / "m.onnx", input_shape=(1, 2))
    assert os.listdir(tmp_path) == []


def test_onnx_available_when_installed(onnx):
    assert eo.onnx_available() is True


def test_run_onnx_checks_the_batch_and_the_path(tmp_path, ort):
    path = tmp_path / "m.onnx"
    eo.export_onnx(eo.Sequential(eo.Flatten(), eo.Linear(12, 2, seed=0)), path, (1, 3, 4))
    with pytest.raises(eo.EveryOError, match=r"\('batch', 3, 4\).*\(2, 4, 3\)"):
        eo.run_onnx(path, np.ones((2, 4, 3)))
    with pytest.raises(eo.EveryOError, match="no ONNX file"):
        eo.run_onnx(tmp_path / "missing.onnx", np.ones((2, 3, 4)))
    out = eo.run_onnx(path, eo.ones(5, 3, 4, dtype="float64"))  # Tensor, float64: cast
    assert out.shape == (5, 2) and out.dtype == np.float32


@pytest.mark.parametrize("target", ["directory", "empty", "read_only_directory"])
def test_an_unwritable_path_is_an_everyo_error_and_leaves_nothing(target, tmp_path):
    inner = tmp_path / "inner"
    inner.mkdir()
    path = {"directory": inner, "empty": "", "read_only_directory": inner / "m.onnx"}[target]
    if target == "read_only_directory":
        inner.chmod(0o500)
        if os.access(inner, os.W_OK):  # root ignores the mode
            pytest.skip("running as root: a read-only directory is still writable")
    try:
        with pytest.raises(eo.EveryOSerializationError, match="export_onnx"):
            eo.export_onnx(eo.ReLU(), path, input_shape=(1, 2))
    finally:
        inner.chmod(0o700)
    assert os.listdir(tmp_path) == ["inner"] and os.listdir(inner) == []


class Log(eo.Module):  # nan for the negative inputs verify=True draws
    def forward(self, x):
        return eo.log(x)


class InfThenDoubler(eo.Module):  # one inf in every row, then a wrongly converted layer
    def __init__(self):
        super().__init__()
        self.doubler = Doubler()

    def forward(self, x):
        return eo.concatenate([self.doubler(x), eo.log(x * 0.0)], axis=-1)


class SharpLogSoftmax(eo.Module):  # classes far apart: probabilities below float32's range
    def forward(self, x):
        return eo.log_softmax(x * 100.0, axis=-1)


def test_verify_accepts_a_correct_log_softmax_whose_probabilities_underflow(tmp_path, ort):
    """Regression: onnx.reference's LogSoftmax takes the log of the softmax, -inf where a
    probability underflows (ONNX Runtime agrees with the model to ~1e-13), and verify=True
    refused the correct export. verify now reads LogSoftmax by its definition there."""
    eo.export_onnx(SharpLogSoftmax(), tmp_path / "m.onnx", input_shape=(2, 5), verify=True)
    eo.export_onnx(eo.Sequential(eo.Linear(4, 30, seed=0), eo.LogSoftmax()),
                   tmp_path / "n.onnx", input_shape=(2, 4), verify=True)
    x = np.float32([[0.0, 1.0, 2.0, 3.0, 4.0]])
    with eo.no_grad():
        expected = SharpLogSoftmax()(eo.tensor(x)).data
    np.testing.assert_allclose(eo.run_onnx(tmp_path / "m.onnx", x), expected, rtol=1e-6)


class PositiveOnly(eo.Module):
    """``abs(x)`` to a third party whose converter forgot the sign (an Identity): right on
    positive inputs only."""

    def forward(self, x):
        return abs(x)


def convert_positive_only(layer, ctx, x):
    return ctx.node("Identity", [x])


class SignForgetting:
    @eo.hookimpl
    def everyo_register_onnx_converters(self, register):
        register(PositiveOnly, convert_positive_only)


@pytest.fixture
def sign_forgetting():
    eo.register_plugin(SignForgetting(), name="onnx-tests-sign-forgetting")
    yield
    eo.unregister_plugin("onnx-tests-sign-forgetting")


def test_verify_runs_on_the_users_own_inputs(tmp_path, ort, sign_forgetting):
    positive = np.random.default_rng(3).uniform(0.5, 2.0, (6, 4)).astype(np.float32)
    with pytest.raises(eo.EveryOSerializationError, match="disagrees"):  # random inputs
        eo.export_onnx(PositiveOnly(), tmp_path / "m.onnx", input_shape=(2, 4), verify=True)
    eo.export_onnx(PositiveOnly(), tmp_path / "m.onnx", input_shape=(2, 4),
                   verify_inputs=positive)  # the user's inputs: the export is right on them
    with pytest.raises(eo.EveryOSerializationError, match="disagrees.*shape \\(2, 4\\)"):
        eo.export_onnx(PositiveOnly(), tmp_path / "n.onnx", input_shape=(2, 4),
                       verify_inputs=[positive[:1], -positive[:2]])  # several batches
    assert sorted(os.listdir(tmp_path)) == ["m.onnx"]


@pytest.mark.parametrize("inputs, pattern", [
    (np.ones((3, 5), np.float32), r"verify_inputs: input 'input' needs shape \('batch', 4\), "
                                  r"got \(3, 5\)"),
    ([[np.ones((3, 4))]], r"verify_inputs: a batch for 1 input is an array or Tensor, got list"),
    ([np.array([["a", "b", "c", "d"]])], r"verify_inputs: the batch for input 'input' is not "
                                         r"numeric \(dtype <U1\)"),
    ([], r"verify_inputs: no batch to verify on"),
])
def test_verify_inputs_that_do_not_fit_are_named(inputs, pattern, tmp_path, ort):
    with pytest.raises(eo.EveryOSerializationError, match=pattern):
        eo.export_onnx(eo.Linear(4, 2, seed=0), tmp_path / "m.onnx", input_shape=(2, 4),
                       verify_inputs=inputs)
    assert os.listdir(tmp_path) == []


def test_verify_inputs_of_a_model_with_two_inputs(tmp_path, ort):
    x, y = np.ones((3, 4), np.float32), np.full((3, 2), 2.0, np.float32)
    model = Concat()
    eo.export_onnx(model, tmp_path / "m.onnx", input_shape=[(1, 4), (1, 2)],
                   verify_inputs=[(x, y), (x[:1], y[:1])])
    with pytest.raises(eo.EveryOSerializationError,
                       match=r"a batch for 2 inputs is a tuple of 2 arrays or Tensors, one per input, got 1"):
        eo.export_onnx(model, tmp_path / "n.onnx", input_shape=[(1, 4), (1, 2)],
                       verify_inputs=[(x,)])


class Concat(eo.Module):
    def forward(self, a, b):
        return eo.concatenate([a, b], axis=-1)


def test_verify_accepts_nan_where_the_model_has_nan(tmp_path, ort):
    with np.errstate(invalid="ignore", divide="ignore"):
        eo.export_onnx(Log(), tmp_path / "m.onnx", input_shape=(2, 4), verify=True)
    assert os.listdir(tmp_path) == ["m.onnx"]


def test_an_inf_in_the_output_does_not_hide_a_wrong_converter(tmp_path, ort):
    with np.errstate(invalid="ignore", divide="ignore"), \
            pytest.raises(eo.EveryOSerializationError, match="disagrees"):
        eo.export_onnx(InfThenDoubler(), tmp_path / "m.onnx", input_shape=(2, 3), verify=True)
    assert os.listdir(tmp_path) == []


@pytest.mark.parametrize("content", [b"garbage" * 10, "truncated"])
def test_run_onnx_on_a_file_that_is_not_a_model_is_an_everyo_error(content, tmp_path, ort):
    path = tmp_path / "m.onnx"
    eo.export_onnx(eo.ReLU(), path, input_shape=(1, 2))
    path.write_bytes(path.read_bytes()[:40] if content == "truncated" else content)
    with pytest.raises(eo.EveryOError, match="cannot load"):
        eo.run_onnx(path, np.ones((1, 2)))


def test_run_onnx_on_a_batch_that_is_not_numeric_is_an_everyo_error(tmp_path, ort):
    eo.export_onnx(eo.ReLU(), tmp_path / "m.onnx", input_shape=(1, 2))
    with pytest.raises(eo.EveryOError, match="'input' is not numeric"):
        eo.run_onnx(tmp_path / "m.onnx", [["a", "b"]])
