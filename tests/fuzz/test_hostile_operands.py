"""Hostile operands and arguments a careless user passes: each is an ``EveryOError`` naming what
was wrong, never NumPy's raw ``ValueError``/``TypeError`` and never a silent NaN (``x + None``
gave NaNs: NumPy casts the ``None`` object to float)."""

from __future__ import annotations

import operator

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

import everyo as eo
from everyo.errors import EveryOError
from support.fuzz_settings import FUZZ

NOT_NUMBERS = {
    "None": None, "str": "a", "bytes": b"a", "object array": np.array([object()] * 3),
    "str array": np.array(["a", "b", "c"]), "None list": [None, None, None],
    "dict": {"a": 1}, "datetime array": np.array(["2026-12-07"] * 3, dtype="datetime64[D]"),
}
OPERATORS = {
    "add": operator.add, "sub": operator.sub, "mul": operator.mul, "truediv": operator.truediv,
    "pow": operator.pow, "matmul": operator.matmul, "maximum": eo.maximum,
    "minimum": eo.minimum, "where": lambda a, b: eo.where(eo.ones(3) > 0, a, b),
}


def _x(dtype="float32", requires_grad=True):
    return eo.tensor(np.arange(1, 4).astype(dtype), requires_grad=requires_grad)


@pytest.mark.parametrize("other", list(NOT_NUMBERS), ids=str)
@pytest.mark.parametrize("op", list(OPERATORS))
@pytest.mark.parametrize("side", ["left", "right"])
def test_an_operand_that_is_not_a_number_is_refused(op, other, side):
    fn, x, value = OPERATORS[op], _x(), NOT_NUMBERS[other]
    with pytest.raises(EveryOError, match="numeric|number"):
        fn(x, value) if side == "left" else fn(value, x)


@pytest.mark.parametrize("method", ["add_", "sub_", "mul_", "div_", "masked_fill"])
@pytest.mark.parametrize("other", ["None", "str", "object array"])
def test_in_place_methods_refuse_what_is_not_a_number(method, other):
    x = _x(requires_grad=False)
    before = x.data.copy()
    args = (np.ones(3, bool), NOT_NUMBERS[other]) if method == "masked_fill" else \
        (NOT_NUMBERS[other],)
    with pytest.raises(EveryOError):
        getattr(x, method)(*args)
    np.testing.assert_array_equal(x.data, before)


@pytest.mark.parametrize("dtype", [object, str, "U3", "S2", "datetime64[s]", "timedelta64"])
@pytest.mark.parametrize("how", ["astype", "to", "tensor", "zeros", "module"])
def test_a_dtype_that_is_not_numeric_is_refused(dtype, how):
    x = _x()
    calls = {"astype": lambda: x.astype(dtype), "to": lambda: x.to(dtype),
             "tensor": lambda: eo.tensor([1.0], dtype=dtype),
             "zeros": lambda: eo.zeros(2, dtype=dtype),
             "module": lambda: eo.Linear(2, 2).to(dtype)}
    with pytest.raises(EveryOError, match="dtype"):
        calls[how]()


@pytest.mark.parametrize("grad", ["a", None, [None, None, None], np.array([object()] * 3)])
def test_backward_with_a_gradient_that_is_not_numbers(grad):
    x = _x()
    y = x * 2.0
    if grad is None:  # None is "the default gradient", which a non-scalar has not
        with pytest.raises(EveryOError):
            y.backward(grad)
        return
    with pytest.raises(EveryOError):
        y.backward(grad)
    assert x.grad is None


@pytest.mark.parametrize("call", [
    lambda x: x.tril("a"), lambda x: x.triu(1.5), lambda x: x.tril(None),
    lambda x: eo.grad(None, x), lambda x: eo.grad(x.sum(), None),
    lambda x: eo.grad(x.sum(), "x"),
], ids=["tril str", "triu float", "tril None", "grad None outputs", "grad None inputs",
        "grad str inputs"])
def test_misc_bad_arguments(call):
    x = eo.tensor(np.ones((3, 3), np.float32), requires_grad=True)
    with pytest.raises(EveryOError):
        call(x)


@pytest.mark.parametrize("max_norm", [float("nan"), "1.0", None, -1.0, True])
@pytest.mark.parametrize("with_grads", [True, False])
def test_clip_grad_norm_checks_max_norm(max_norm, with_grads):
    w = eo.Parameter(np.ones(3, np.float32))
    if with_grads:
        (w * 2.0).sum().backward()
    before = None if w.grad is None else w.grad.copy()
    with pytest.raises(EveryOError, match="max_norm"):
        eo.clip_grad_norm_([w], max_norm)
    if before is not None:
        np.testing.assert_array_equal(w.grad, before)


def test_clip_grad_norm_with_an_infinite_max_norm_only_measures(torch):
    w = eo.Parameter(np.array([3.0, 4.0]))
    (w * w).sum().backward()
    tw = torch.tensor([3.0, 4.0], requires_grad=True)
    (tw * tw).sum().backward()
    expected = float(torch.nn.utils.clip_grad_norm_([tw], float("inf")))
    assert eo.clip_grad_norm_([w], float("inf")) == pytest.approx(expected, rel=1e-12)
    np.testing.assert_array_equal(w.grad, tw.grad.numpy())


@FUZZ
@given(value=st.one_of(st.none(), st.text(max_size=3), st.binary(max_size=2),
                       st.lists(st.none(), min_size=3, max_size=3),
                       st.dictionaries(st.text(max_size=1), st.integers(), max_size=1)),
       op=st.sampled_from(sorted(OPERATORS)),
       dtype=st.sampled_from(["float16", "float32", "float64", "int64", "bool"]),
       swap=st.booleans())
def test_fuzz_operands_that_are_not_numbers(value, op, dtype, swap):
    x = eo.tensor(np.arange(1, 4).astype(dtype))
    fn = OPERATORS[op]
    with pytest.raises(EveryOError):
        fn(value, x) if swap else fn(x, value)
