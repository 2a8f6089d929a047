"""Every computation on a Tensor goes through dispatch: in-place writes, item assignment and
comparisons are ops an interceptor sees (autocast, the ONNX tracer), and they live in the
Tensor class itself (nothing is attached to it from elsewhere)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo.dispatch import answering_shape, intercepting
from everyo.ops import core_ops

IN_PLACE_CALLS = {
    "add_": lambda t: t.add_(1.0),
    "sub_": lambda t: t.sub_(eo.ones(3)),
    "mul_": lambda t: t.mul_(2.0),
    "div_": lambda t: t.div_(2.0),
    "copy_": lambda t: t.copy_(np.arange(3.0)),
    "fill_": lambda t: t.fill_(5.0),
    "zero_": lambda t: t.zero_(),
    "clamp_": lambda t: t.clamp_(min=0.5),
    "__setitem__": lambda t: t.__setitem__(0, 7.0),
}
DISPATCHED_AS = {"fill_": "copy_", "zero_": "copy_", "__setitem__": "setitem"}


def _seen(fn):
    seen = []

    def record(name, operands, attrs, proceed):
        seen.append(name)
        return proceed(operands, attrs)

    with intercepting(record):
        result = fn()
    return seen, result


@pytest.mark.parametrize("method", IN_PLACE_CALLS)
def test_in_place_writes_are_dispatched_and_versioned(method):
    t = eo.ones(3)
    seen, result = _seen(lambda: IN_PLACE_CALLS[method](t))
    assert seen == [DISPATCHED_AS.get(method, method)]
    assert result is (None if method == "__setitem__" else t)
    assert t._version == 1


def test_an_in_place_write_computes_what_numpy_computes():
    t = eo.tensor([1.0, -2.0, 3.0])
    t.add_(1.0).mul_(eo.tensor([2.0, 2.0, 0.5])).clamp_(-1.0, 3.0)
    t[1] = 9.0
    np.testing.assert_array_equal(t.data, np.array([3.0, 9.0, 2.0], np.float32))
    assert t.dtype == "float32"


ZERO_D_WRITES = {  # a one-element write, as NumPy computes it on an array
    "add_": (lambda t: t.add_(1.0), lambda a: a + 1.0),
    "sub_": (lambda t: t.sub_(eo.tensor(0.5)), lambda a: a - 0.5),
    "mul_": (lambda t: t.mul_(2.0), lambda a: a * 2.0),
    "div_": (lambda t: t.div_(4.0), lambda a: a / 4.0),
    "copy_": (lambda t: t.copy_(np.array(7.0)), lambda a: 7.0),
    "fill_": (lambda t: t.fill_(5.0), lambda a: 5.0),
    "zero_": (lambda t: t.zero_(), lambda a: 0.0),
    "clamp_": (lambda t: t.clamp_(max=0.5), lambda a: min(a, 0.5)),
    "setitem": (lambda t: t.__setitem__((), 9.0), lambda a: 9.0),
}


@pytest.mark.parametrize("method", ZERO_D_WRITES)
def test_an_element_of_a_tensor_is_a_view_an_in_place_write_reaches(method):
    # (NumPy's a[1] is a scalar, not a view: t[1].fill_(5.0) raised a raw TypeError, and
    # t[1].add_(1.0) a misleading "cannot write"; PyTorch writes t's element)
    write, numpy = ZERO_D_WRITES[method]
    t = eo.tensor([1.0, 2.0, 3.0])
    element = t[1]
    write(element)
    expected = np.array([1.0, numpy(2.0), 3.0], np.float32)
    np.testing.assert_array_equal(t.data, expected)
    assert float(element.data) == expected[1] and t._version == 1


@pytest.mark.parametrize("method", ZERO_D_WRITES)
def test_a_0d_result_can_be_written_in_place(method):
    write, numpy = ZERO_D_WRITES[method]
    total = eo.tensor([1.0, 1.0]).sum()  # (NumPy's sum is a scalar)
    assert write(total) is (None if method == "setitem" else total)
    assert total.shape == () and float(total.data) == numpy(2.0) and total._version == 1


def test_an_in_place_write_still_refuses_a_tensor_that_records_gradients():
    w = eo.ones(2, requires_grad=True)
    with pytest.raises(eo.EveryOError, match="add_ on a tensor of shape"):
        w.add_(1.0)
    with pytest.raises(eo.EveryOError, match=r"t\[index\] = value on a tensor"):
        eo.zeros(2)[0] = w[0]
    with eo.no_grad():
        w.add_(1.0)
    assert w.data.tolist() == [2.0, 2.0]


@pytest.mark.parametrize("name, compare", [
    ("lt", lambda a, b: a < b), ("le", lambda a, b: a <= b), ("gt", lambda a, b: a > b),
    ("ge", lambda a, b: a >= b), ("eq", lambda a, b: a == b), ("ne", lambda a, b: a != b)])
def test_comparisons_are_dispatched_ops_with_unrecorded_boolean_results(name, compare):
    x = eo.tensor([1.0, 2.0, 3.0], requires_grad=True)
    seen, result = _seen(lambda: compare(x, 2.0))
    assert seen == [name]
    assert result.dtype == "bool" and not result.requires_grad and result.is_leaf
    np.testing.assert_array_equal(result.data, compare(x.data, 2.0))


def test_a_comparison_of_integers_with_a_float_is_exact():
    big = eo.tensor(np.array([16777217], np.int64))  # not representable in float32
    assert bool(big > 16777216.5) and not bool(big == 16777216)


def test_a_tensor_compared_with_something_that_is_not_a_number_is_unequal():
    t = eo.ones(1)
    assert (t == None) is False  # noqa: E711 (the operator itself is what is tested)
    assert (t != "a") is True


def test_the_in_place_methods_and_comparisons_live_in_the_tensor_class():
    for name in ("add_", "sub_", "mul_", "div_", "copy_", "fill_", "zero_", "clamp_",
                 "__setitem__", "__lt__", "__le__", "__gt__", "__ge__", "__eq__", "__ne__"):
        assert vars(eo.Tensor)[name].__module__ == "everyo.tensor", name


def test_shape_is_answered_by_a_context_local_hook_not_by_patching_the_class():
    shape = vars(eo.Tensor)["shape"]
    with answering_shape(lambda t: ("rows",) + t.data.shape[1:]):
        assert eo.ones(2, 3).shape == ("rows", 3)
        assert vars(eo.Tensor)["shape"] is shape
    assert eo.ones(2, 3).shape == (2, 3)
    with pytest.raises(eo.EveryOError, match="must be callable"), answering_shape(3):
        pass


def test_every_op_without_a_gradient_is_covered_here():
    from_tests = {DISPATCHED_AS.get(m, m) for m in IN_PLACE_CALLS} | {
        "lt", "le", "gt", "ge", "eq", "ne"}
    assert {name for name, cls in core_ops().items() if not cls.differentiable} == from_tests
