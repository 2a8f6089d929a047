"""In-place writes and Python decisions on sizes during an export: a write the tracer can
express is exported (its output replaces the tensor's value), any other is refused naming the
method and the module path; a comparison or ``bool()`` of a size that follows the input's size
is refused naming the comparison. Never a file that computes something else."""

from __future__ import annotations

import math
import re

import numpy as np
import pytest

import everyo as eo
from support.onnx_models import assert_parity

pytest.importorskip("onnx")
pytest.importorskip("onnxruntime")


class Writes(eo.Module):
    def __init__(self, write):
        super().__init__()
        self.fc = eo.Linear(4, 3, seed=0)
        self.write = write

    def forward(self, x):
        h = self.fc(x)
        self.write(h)
        return h * 2.0


WRITES = {
    "add_": lambda h: h.add_(1.0),
    "sub_ a traced value": lambda h: h.sub_(h * 0.5),
    "mul_ then div_": lambda h: h.mul_(3.0).div_(eo.tensor([1.0, 2.0, 4.0])),
    "clamp_": lambda h: h.clamp_(-0.2, 0.3),
    "clamp_ max only": lambda h: h.clamp_(max=0.1),
    "copy_": lambda h: h.copy_(eo.tensor([1.0, 2.0, 3.0])),
    "fill_": lambda h: h.fill_(0.25),
    "zero_": lambda h: h.zero_(),
    "t[:, 0] = number": lambda h: h.__setitem__((slice(None), 0), 0.0),
    "t[..., 1:] = a traced one-element value": lambda h: h.__setitem__(
        (Ellipsis, slice(1, None)), h.mean()),
    "t[traced mask] = number": lambda h: h.__setitem__(h > 0.1, -1.0),
}


@pytest.mark.parametrize("write", WRITES)
def test_an_in_place_write_after_a_layer_is_exported(tmp_path, write):
    model = Writes(WRITES[write])
    path = tmp_path / "m.onnx"
    eo.export_onnx(model, path, input_shape=(2, 4), verify=True)
    assert_parity(model, path, lambda n: [(n, 4)])


def test_h_add_1_exports_as_an_add_whose_output_replaces_h(tmp_path):
    import onnx

    model = Writes(lambda h: h.add_(1.0))
    path = tmp_path / "m.onnx"
    eo.export_onnx(model, path, input_shape=(2, 4))
    x = np.random.default_rng(0).standard_normal((5, 4)).astype(np.float32)
    with eo.no_grad():
        expected = (model.fc(eo.tensor(x)).data + 1.0) * 2.0
    np.testing.assert_allclose(eo.run_onnx(path, x), expected, rtol=1e-5, atol=1e-6)
    assert "Add" in [node.op_type for node in onnx.load(str(path)).graph.node]


class Inner(eo.Module):
    def __init__(self, write):
        super().__init__()
        self.write = write

    def forward(self, h):
        self.write(h)
        return h


class Outer(eo.Module):
    def __init__(self, write):
        super().__init__()
        self.fc = eo.Linear(4, 4, seed=0)
        self.inner = Inner(write)

    def forward(self, x):
        return self.inner(self.fc(x)) + 1.0


def _set_row(h):
    h[0] = 0.0


def _set_columns(h):
    h[:, :2] = eo.tensor([1.0, 2.0])


def _set_by_integers(h):
    h[:, eo.tensor(np.array([0, 2]))] = 0.0


def _write_through_a_view(h):
    h.reshape(-1).add_(1.0)


class Buffered(eo.Module):
    def __init__(self):
        super().__init__()
        self.fc = eo.Linear(4, 4, seed=0)
        self.memory = eo.zeros(4)

    def forward(self, x):
        self.memory.copy_(self.fc(x)[0])
        return self.fc(x) + self.memory


@pytest.mark.parametrize("model, message", [
    (Outer(_set_row), r"inner: op 'setitem': t\[index\] = value selects part of axis 0, whose "
                      r"size follows the input's size"),
    (Outer(_set_columns), r"inner: op 'setitem': t\[index\] = value writes a value of shape "
                          r"\(2,\); only one value"),
    (Outer(_set_by_integers), r"inner: op 'setitem': t\[index\] = value with an array index"),
    (Outer(_write_through_a_view), "inner: add_ on a traced tensor is not exported .* shares "
                                   "its storage with another traced tensor"),
    (Outer(lambda h: h.detach().mul_(2.0)), "inner: mul_ writes into a tensor the trace does "
                                            "not follow"),
    (Buffered(), r"Buffered \(the model's own forward\): copy_ writes into a tensor the trace "
                 "does not follow"),
])
def test_an_in_place_write_the_graph_cannot_express_is_refused_by_name(tmp_path, model, message):
    path = tmp_path / "m.onnx"
    with pytest.raises(eo.EveryOSerializationError, match=message):
        eo.export_onnx(model, path, input_shape=(2, 4))
    assert not path.exists()


class ConstantWrittenInForward(eo.Module):
    def forward(self, x):
        scale = eo.ones(4)
        y = x * scale
        scale.mul_(3.0)  # a constant written between two uses: the second sees 3
        return y + x * scale


def test_a_constant_written_during_the_trace_is_exported_with_its_new_value(tmp_path):
    model = ConstantWrittenInForward()
    path = tmp_path / "m.onnx"
    eo.export_onnx(model, path, input_shape=(2, 4), verify=True)
    assert_parity(model, path, lambda n: [(n, 4)])


class Crop(eo.Module):
    def forward(self, x):
        return x[:, :min(x.shape[1], 3)]


class Branch(eo.Module):
    def forward(self, x):
        if x.shape[0] > 4:
            return x * 2.0
        return x


class Truth(eo.Module):
    def forward(self, x):
        return x * 2.0 if x.shape[0] else x


class SizeArithmetic(eo.Module):
    """``x[:n]`` with ``n`` from arithmetic on the batch size that gives a plain number."""

    def __init__(self, rows):
        super().__init__()
        self.rows = rows

    def forward(self, x):
        return x[:self.rows(x.shape[0])] * 2.0


@pytest.mark.parametrize("model, shape, dynamic, comparison", [
    (Crop(), (2, 5), {"input": {1: "sequence"}}, r"input\.shape\[1\] [<>] 3"),
    (Branch(), (2, 5), None, r"input\.shape\[0\] > 4"),
    (Truth(), (2, 5), None, r"bool\(input\.shape\[0\]\)"),
    # int(n / 2) is 1 at both traced sizes (2 and 3): the file sliced one row at every size
    (SizeArithmetic(lambda n: int(n / 2)), (2, 5), None, r"input\.shape\[0\] / 2"),
    (SizeArithmetic(lambda n: n % 2 + 1), (2, 5), None, r"input\.shape\[0\] % 2"),
    (SizeArithmetic(lambda n: round(n ** 0.5)), (2, 5), None, r"input\.shape\[0\] \*\* 0\.5"),
    (SizeArithmetic(lambda n: int(math.sqrt(n))), (3, 5), None, r"float\(input\.shape\[0\]\)"),
])
def test_a_python_decision_on_a_traced_size_is_refused_naming_the_comparison(
        tmp_path, model, shape, dynamic, comparison):
    path = tmp_path / "m.onnx"
    with pytest.raises(eo.EveryOSerializationError) as info:
        eo.export_onnx(model, path, input_shape=shape, dynamic_axes=dynamic, verify=True)
    message = str(info.value)
    assert "the model's own forward" in message and "follows the input's size" in message
    assert re.search(comparison, message), message
    assert not path.exists()


class Spelled(eo.Module):
    def __init__(self, spell):
        super().__init__()
        self.spell = spell

    def forward(self, x):
        return x * (3.0 if self.spell(x.shape[0]) == "2" else 1.0)


@pytest.mark.parametrize("spell", [str, lambda n: f"{n}", lambda n: "%d" % n])
def test_a_size_spelled_out_as_text_reads_as_its_number(tmp_path, spell):
    # str(size) was "SymInt(2)" at both traced sizes, so `str(x.shape[0]) == "2"` took the
    # same branch twice and the file was wrong at size 2
    path = tmp_path / "m.onnx"
    with pytest.raises(eo.EveryOSerializationError, match="cannot export"):
        eo.export_onnx(Spelled(spell), path, input_shape=(2, 4))
    assert not path.exists()


class SameSize(eo.Module):
    def forward(self, x):
        y = x * 2.0
        assert y.shape[0] == y.shape[0]  # the same size: exportable whatever it is
        return y


def test_comparing_a_size_with_itself_is_not_refused(tmp_path):
    path = tmp_path / "m.onnx"
    eo.export_onnx(SameSize(), path, input_shape=(2, 4), verify=True)


class Expanded(eo.Module):
    def forward(self, x):
        b, t = x.shape
        return eo.expand(x[:, :1], b, t) + x  # (expand compares each size with -1)


def test_a_decision_with_the_same_answer_at_every_size_is_not_refused(tmp_path):
    path = tmp_path / "m.onnx"
    eo.export_onnx(Expanded(), path, input_shape=(2, 4), dynamic_axes={"input": {1: "t"}},
                   verify=True)


class BeforeAndAfter(eo.Module):
    def __init__(self):
        super().__init__()
        self.fc = eo.Linear(4, 4, seed=0)

    def forward(self, x):
        x.mul_(2.0)  # (the model's input itself)
        h = self.fc(x)
        before = h * 3.0
        h.add_(1.0)
        return before + h


def test_earlier_uses_read_the_old_value_and_later_ones_the_new(tmp_path):
    model = BeforeAndAfter()
    path = tmp_path / "m.onnx"
    eo.export_onnx(model, path, input_shape=(2, 4), verify=True)
    x = np.random.default_rng(1).standard_normal((3, 4)).astype(np.float32)
    with eo.no_grad():
        h = model.fc(eo.tensor(2.0 * x)).data
    np.testing.assert_allclose(eo.run_onnx(path, x), h * 3.0 + h + 1.0, rtol=1e-5, atol=1e-5)
