"""The tracer's rules: every refusal named at once with its module path, forwards whose graph
depends on the input refused, third-party ops exported through their own converter or their
composite, and ``ctx.convert`` on a value a converter just made."""

from __future__ import annotations

import os

import numpy as np
import pytest

import everyo as eo
from everyo.autograd import Op
from support.onnx_models import assert_parity

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


class Block(eo.Module):
    def __init__(self, with_attention: bool):
        super().__init__()
        self.fc = eo.Linear(4, 4, seed=0)
        self.attn = eo.MultiHeadAttention(4, 2) if with_attention else eo.Tanh()

    def forward(self, x):
        return self.attn(self.fc(x))


class MyLSTM(eo.LSTM):
    """Not refused by name (another class), so it is traced and meets the 'lstm' op."""


class Seq2Seq(eo.Module):
    def __init__(self):
        super().__init__()
        self.blocks = eo.Sequential(Block(False), Block(True))
        self.position = eo.PositionalEncoding(4)
        self.head = MyLSTM(4, 4)

    def forward(self, x):
        return self.head(self.blocks(x) + 1.0)


def test_every_refusal_is_named_at_once_with_its_module_path(tmp_path):
    path = tmp_path / "m.onnx"
    path.write_bytes(b"old")
    with pytest.raises(eo.EveryOSerializationError) as info:
        eo.export_onnx(Seq2Seq(), path, input_shape=(1, 3, 4))
    message = str(info.value)
    assert "blocks.1.attn (MultiHeadAttention)" in message
    assert "position (PositionalEncoding)" in message  # declared, even if forward skips it
    assert "head: op 'lstm': a recurrent time loop is refused by design" in message
    assert "3 refusals" in message and "Nothing was written" in message
    assert path.read_bytes() == b"old" and sorted(os.listdir(tmp_path)) == ["m.onnx"]


class ValueBranch(eo.Module):
    def forward(self, x):
        if float(x.mean().item()) > 0:  # depends on the values: not traceable
            return eo.relu(x)
        return eo.tanh(x)


class LengthLoop(eo.Module):
    def forward(self, x):
        total = x[0]
        for row in range(1, len(x)):  # one op per sample: the graph follows the batch size
            total = total + x[row]
        return x + total


class NumpyMask(eo.Module):
    def forward(self, x):
        t = x.shape[1]
        mask = np.tril(np.ones((t, t), np.float32))  # a constant of the traced length
        return eo.matmul(eo.tensor(mask), x)


@pytest.mark.parametrize("model, dynamic", [
    (ValueBranch(), None),
    (LengthLoop(), None),
    (NumpyMask(), {"input": {1: "time"}}),
], ids=["value-branch", "loop-over-batch", "numpy-mask"])
def test_a_graph_that_depends_on_the_input_is_refused(model, dynamic, tmp_path):
    with pytest.raises(eo.EveryOSerializationError, match=r"control flow|depends on the input"):
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(2, 5, 3), dynamic_axes=dynamic)
    assert os.listdir(tmp_path) == []


def test_a_fixed_length_numpy_mask_is_fine_without_a_symbolic_axis(tmp_path):
    path = tmp_path / "m.onnx"
    eo.export_onnx(NumpyMask(), path, input_shape=(2, 5, 3), verify=True)
    assert_parity(NumpyMask(), path, lambda n: [(n, 5, 3)])


class Cube(Op):
    """A third party's op with a converter of its own."""

    __slots__ = ()

    def forward(self, x):
        self.saved = x
        return x * x * x

    def backward(self, g):
        return (3 * self.saved * self.saved * g,)


class SoftSign(Op):
    """A third party's op without converter, but with a composite the tracer can follow."""

    __slots__ = ()

    def forward(self, x):
        return x / (1 + np.abs(x))

    def backward(self, g):
        return None

    def composite(self, x):
        return x / (eo.abs(x) + 1.0)


def convert_cube(ctx, x):
    return ctx.node("Mul", [ctx.node("Mul", [x, x]), x])


class Opaque(Op):
    """A third party's op with neither converter nor composite."""

    __slots__ = ()

    def forward(self, x):
        return np.sort(x, axis=-1)

    def backward(self, g):
        return None


class ThirdPartyOps:
    @eo.hookimpl
    def everyo_register_ops(self, register):
        register("onnx_cube_test", Cube)
        register("onnx_softsign_test", SoftSign)
        register("onnx_opaque_test", Opaque)

    @eo.hookimpl
    def everyo_register_onnx_converters(self, register):
        register(Cube, convert_cube)


@pytest.fixture(scope="module")
def third_party_ops():
    if "onnx_cube_test" not in eo.registry("ops"):
        eo.register_plugin(ThirdPartyOps(), name="third-party-ops-onnx-test")


def test_a_third_party_op_exports_through_its_converter_or_its_composite(third_party_ops,
                                                                         tmp_path):
    class Model(eo.Module):
        def __init__(self):
            super().__init__()
            self.fc = eo.Linear(3, 3, seed=0)

        def forward(self, x):
            return eo.dispatch("onnx_softsign_test", eo.dispatch("onnx_cube_test", self.fc(x)))

    path = tmp_path / "m.onnx"
    eo.export_onnx(Model(), path, input_shape=(1, 3), verify=True)
    assert_parity(Model(), path, lambda n: [(n, 3)])


def test_an_op_without_converter_or_composite_is_named(third_party_ops, tmp_path):
    class Head(eo.Module):
        def forward(self, x):
            return eo.dispatch("onnx_opaque_test", x)

    class Model(eo.Module):
        def __init__(self):
            super().__init__()
            self.head = Head()

        def forward(self, x):
            return self.head(x)

    with pytest.raises(eo.EveryOSerializationError, match=r"head: op 'onnx_opaque_test' has no ONNX conv"):
        eo.export_onnx(Model(), tmp_path / "m.onnx", input_shape=(1, 3))


class ReluThenChild(eo.Module):
    """A third party's container whose converter feeds ctx.convert a value it made itself."""

    def __init__(self, child):
        super().__init__()
        self.child = child

    def forward(self, x):
        return self.child(eo.relu(x))


def convert_relu_then_child(layer, ctx, x):
    return ctx.convert(layer.child, ctx.node("Relu", [x]))


class ContainerConverter:
    @eo.hookimpl
    def everyo_register_onnx_converters(self, register):
        register(ReluThenChild, convert_relu_then_child)


def test_ctx_convert_accepts_a_value_made_with_ctx_node(tmp_path):
    if ReluThenChild not in eo.registry("onnx_converters"):
        eo.register_plugin(ContainerConverter(), name="container-converter-onnx-test")
    model = eo.Sequential(eo.Linear(4, 4, seed=0),
                          ReluThenChild(eo.Sequential(eo.Linear(4, 2, seed=1), eo.Tanh())))
    path = tmp_path / "m.onnx"
    eo.export_onnx(model, path, input_shape=(1, 4), verify=True)
    assert_parity(model, path, lambda n: [(n, 4)])


def test_a_boolean_mask_index_is_refused_naming_the_module(tmp_path):
    class Picker(eo.Module):
        def forward(self, x):
            return x[:, np.array([True, False, True])]

    model = eo.Sequential(eo.Linear(3, 3, seed=0), Picker())
    with pytest.raises(eo.EveryOSerializationError,
                       match=r"1: op 'getitem': index a bool array of shape \(3,\)"):
        eo.export_onnx(model, tmp_path / "m.onnx", input_shape=(1, 3))
    assert os.listdir(tmp_path) == []


def test_tensor_methods_are_restored_after_an_export_even_a_failed_one(tmp_path):
    shape, greater = eo.Tensor.shape, eo.Tensor.__gt__
    eo.export_onnx(eo.Sequential(eo.Linear(2, 2, seed=0)), tmp_path / "m.onnx", (1, 2))
    with pytest.raises(eo.EveryOSerializationError):
        eo.export_onnx(Seq2Seq(), tmp_path / "r.onnx", input_shape=(1, 3, 4))
    assert eo.Tensor.shape is shape and eo.Tensor.__gt__ is greater
    assert type(eo.ones(2, 3).shape[0]) is int


class _SlowForward(eo.Module):
    def __init__(self):
        super().__init__()
        self.lin = eo.Linear(4, 3, seed=0)

    def forward(self, x):
        import time

        time.sleep(0.002)  # lets another thread's trace begin and end meanwhile
        return eo.relu(self.lin(x))


def test_threads_exporting_one_model_at_once_all_succeed_and_leave_no_wrapper(tmp_path):
    import threading

    model = _SlowForward()
    failures = []

    def export(worker):
        for _attempt in range(4):
            try:
                eo.export_onnx(model, tmp_path / f"{worker}.onnx", input_shape=(2, 4))
            except Exception as exc:  # collected for the assertion
                failures.append(exc)

    threads = [threading.Thread(target=export, args=(worker,)) for worker in range(3)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(60)
    assert failures == []
    assert [m for m in model.modules() if "forward" in m.__dict__] == []
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    np.testing.assert_allclose(eo.run_onnx(tmp_path / "0.onnx", x), model(eo.tensor(x)).data,
                               rtol=1e-5, atol=1e-6)


class _LastHalf(eo.Module):
    def forward(self, x):
        length = x.shape[1]
        return x[:, -length // 2:] * 2.0  # Python floors: the last ceil(length / 2) steps


@pytest.mark.parametrize("length", [3, 4, 7])
def test_a_negative_symbolic_size_is_floor_divided_like_python(length, tmp_path):
    path = tmp_path / "m.onnx"
    eo.export_onnx(_LastHalf(), path, input_shape=(2, 6, 3),
                   dynamic_axes={"input": {1: "sequence"}})
    x = np.random.default_rng(length).standard_normal((2, length, 3)).astype(np.float32)
    expected = _LastHalf()(eo.tensor(x)).data
    actual = eo.run_onnx(path, x)
    assert actual.shape == expected.shape
    np.testing.assert_allclose(actual, expected, rtol=1e-6)


class _FlattenBySize(eo.Module):
    def forward(self, x):
        return x.view(x.size(0), -1).reshape((x.size()[0], x.size(1) * x.size(-1))) * 2.0


def test_pytorchs_size_calls_stay_symbolic_in_an_export(tmp_path):
    path = tmp_path / "m.onnx"
    eo.export_onnx(_FlattenBySize(), path, input_shape=(2, 6, 3),
                   dynamic_axes={"input": {0: "batch", 1: "sequence"}})
    x = np.random.default_rng(0).standard_normal((5, 4, 3)).astype(np.float32)
    np.testing.assert_allclose(eo.run_onnx(path, x), _FlattenBySize()(eo.tensor(x)).data,
                               rtol=1e-6)
