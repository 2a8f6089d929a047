"""Tensor creation, dtypes and the autograd engine's contract."""

from __future__ import annotations

import threading

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from hypothesis.extra import numpy as hnp

import everyo as eo


def test_python_floats_default_to_float32_and_float64_arrays_stay():
    assert eo.tensor([1.0, 2.0]).dtype == "float32"
    assert eo.tensor(np.zeros(2)).dtype == "float64"
    assert eo.tensor([1, 2]).dtype == "int64"
    assert eo.tensor([1.0], dtype="float16").dtype == "float16"
    assert eo.zeros(2, 3).shape == (2, 3) and eo.zeros(2, 3).dtype == "float32"
    assert eo.ones((2, 3), dtype="float64").dtype == "float64"
    assert eo.full(2, fill_value=0.5).data.tolist() == [0.5, 0.5]
    assert eo.arange(3).dtype == "int64" and eo.arange(0.0, 1.0, 0.5).dtype == "float32"
    np.testing.assert_array_equal(eo.randn(3, seed=1).data, eo.randn(3, seed=1).data)
    assert eo.rand(2, 2, seed=0).data.min() >= 0
    assert eo.zeros_like(eo.ones(2, dtype="float64")).dtype == "float64"
    assert eo.ones_like(np.zeros((2, 1))).shape == (2, 1)


def test_tensor_copies_its_input_and_data_is_writable():
    source = np.zeros(3)
    t = eo.tensor(source)
    t.data[...] = 5
    assert source.sum() == 0 and t.data.sum() == 15


def test_integer_tensors_cannot_require_grad():
    with pytest.raises(eo.EveryOError, match="int64"):
        eo.tensor([1, 2], requires_grad=True)


def test_properties():
    t = eo.tensor(np.arange(6.0).reshape(2, 3))
    assert (t.shape, t.ndim, t.size, t.T.shape, len(t)) == ((2, 3), 2, 6, (3, 2), 2)
    assert eo.tensor([3.5]).item() == 3.5
    with pytest.raises(eo.EveryOError, match=r"one element, got shape \(2, 3\)"):
        t.item()
    assert t.numpy() is t.data
    assert np.asarray(t) is t.data


def test_gradients_accumulate_across_uses_and_broadcasting():
    x = eo.tensor([1.0, 2.0, 3.0], requires_grad=True)
    b = eo.tensor([[1.0], [2.0]], requires_grad=True)
    y = x * x + x * b  # x used three times, broadcast to (2, 3)
    y.sum().backward()
    np.testing.assert_allclose(x.grad, 2 * 2 * x.data + 3)
    np.testing.assert_allclose(b.grad, [[6.0], [6.0]])


def test_grad_accumulates_over_backward_calls_until_cleared():
    w = eo.tensor([1.0, 2.0], requires_grad=True)
    (w * 3).sum().backward()
    (w * 3).sum().backward()
    np.testing.assert_allclose(w.grad, [6.0, 6.0])


def test_backward_twice_through_the_same_graph_raises_unless_retained():
    x = eo.tensor([1.0, 2.0], requires_grad=True)
    y = (x * x).sum()
    y.backward()
    with pytest.raises(eo.EveryOError, match="retain_graph"):
        y.backward()
    x.grad = None
    z = (x * x).sum()
    z.backward(retain_graph=True)
    z.backward()
    np.testing.assert_allclose(x.grad, 4 * x.data)


def test_shared_pass_through_gradients_are_not_aliased():
    a = eo.tensor([1.0, 2.0], requires_grad=True)
    b = eo.tensor([3.0, 4.0], requires_grad=True)
    (a + b).sum().backward()
    a.grad *= 10  # an in-place edit, as clip_grad_norm_ does
    np.testing.assert_allclose(b.grad, [1.0, 1.0])


def test_backward_needs_a_scalar_or_an_explicit_gradient():
    x = eo.tensor([1.0, 2.0], requires_grad=True)
    with pytest.raises(eo.EveryOError, match=r"one-element tensor, got shape \(2,\)"):
        (x * 2).backward()
    (x * 2).backward(np.array([1.0, 0.5]))
    np.testing.assert_allclose(x.grad, [2.0, 1.0])
    with pytest.raises(eo.EveryOError, match="does not require grad"):
        eo.tensor([1.0]).backward()


def test_no_grad_records_nothing_and_is_context_local():
    w = eo.ones(2, requires_grad=True)
    with eo.no_grad():
        assert not (w * 2).requires_grad
        seen = []
        thread = threading.Thread(target=lambda: seen.append((w * 2).requires_grad))
        thread.start()
        thread.join()
        with eo.enable_grad():
            assert (w * 2).requires_grad
    assert seen == [True]
    assert (w * 2).requires_grad

    @eo.no_grad()
    def inference():
        return w * 2

    assert not inference().requires_grad


def test_detach_cuts_the_graph():
    x = eo.tensor([2.0], requires_grad=True)
    y = x.detach() * x
    y.backward()
    np.testing.assert_allclose(x.grad, [2.0])


def test_python_scalars_never_widen_a_tensor():
    half = eo.tensor([1.0, 2.0], dtype="float16")
    assert (half * 2.5).dtype == "float16"
    assert (2.5 + half).dtype == "float16"
    assert (eo.tensor([1, 2]) * 2.5).dtype == "float32"
    assert (eo.tensor([1, 2]) * 2).dtype == "int64"
    assert (half + eo.tensor([1.0])).dtype == "float32"  # tensors promote as NumPy does


def test_astype_is_differentiable_and_returns_gradients_in_the_source_dtype():
    x = eo.tensor([1.0, 2.0], requires_grad=True)
    y = x.astype("float16")
    assert y.dtype == "float16"
    (y * y).sum().backward()
    assert x.grad.dtype == np.float32
    np.testing.assert_allclose(x.grad, [2.0, 4.0])


def test_gradients_arrive_in_the_tensors_own_dtype():
    w = eo.tensor([1.0, 2.0], requires_grad=True)  # float32
    x = eo.tensor(np.array([3.0, 4.0]), requires_grad=True)  # float64
    (w * x).sum().backward()
    assert w.grad.dtype == np.float32 and x.grad.dtype == np.float64


def test_shape_errors_name_both_shapes():
    with pytest.raises(eo.EveryOError, match=r"matmul: \(3, 4\) @ \(5, 2\): inner dimensions 4 and 5 differ"):
        eo.ones(3, 4) @ eo.ones(5, 2)
    with pytest.raises(eo.EveryOError, match=r"cannot reshape \(2, 3\)"):
        eo.ones(2, 3).reshape(4, 2)
    with pytest.raises(eo.EveryOError, match="same shape"):
        eo.stack([eo.ones(2), eo.ones(3)])
    with pytest.raises(eo.EveryOError, match="unknown op 'nope'"):
        eo.dispatch("nope", eo.ones(1))


def test_float16_matmul_rounds_like_a_tensor_core():
    rng = np.random.default_rng(0)
    a, b = rng.standard_normal((8, 16)).astype(np.float16), rng.standard_normal((16, 4)).astype(np.float16)
    out = eo.tensor(a) @ eo.tensor(b)
    assert out.dtype == "float16"
    expected = (a.astype(np.float64) @ b.astype(np.float64)).astype(np.float16)
    np.testing.assert_array_equal(out.data, expected)


def test_comparisons_return_boolean_tensors_without_grad():
    x = eo.tensor([1.0, 2.0, 3.0], requires_grad=True)
    mask = x > 1.5
    assert mask.dtype == "bool" and not mask.requires_grad
    assert mask.data.tolist() == [False, True, True]


@settings(max_examples=40, deadline=None)
@given(shapes=hnp.mutually_broadcastable_shapes(num_shapes=2, min_dims=0, max_dims=3, max_side=3),
       op=st.sampled_from(["add", "sub", "mul", "div"]))
def test_broadcast_gradients_have_operand_shapes(shapes, op):
    rng = np.random.default_rng(0)
    a, b = (rng.uniform(0.5, 1.5, s) for s in shapes.input_shapes)
    assert eo.gradcheck(lambda x, y: eo.dispatch(op, x, y), a, b)


def test_iteration_and_out_of_range_indexing():
    t = eo.tensor([[1.0, 2.0], [3.0, 4.0]], requires_grad=True)
    rows = list(t)
    assert [r.data.tolist() for r in rows] == [[1.0, 2.0], [3.0, 4.0]]
    sum(r.sum() for r in rows).backward()
    np.testing.assert_array_equal(t.grad, np.ones((2, 2)))
    with pytest.raises(IndexError, match=r"invalid for shape \(2, 2\)"):
        t[5]


@settings(max_examples=40, deadline=None)
@given(shape=hnp.array_shapes(min_dims=1, max_dims=3, max_side=4), data=st.data(),
       op=st.sampled_from(["sum", "mean", "var", "softmax", "log_softmax"]),
       keepdims=st.booleans())
def test_reductions_over_random_axes(shape, data, op, keepdims):
    axis = data.draw(st.integers(-len(shape), len(shape) - 1))
    x = np.random.default_rng(len(shape)).standard_normal(shape)
    if op in ("softmax", "log_softmax"):
        fn = lambda t: eo.dispatch(op, t, axis=axis)  # noqa: E731
    else:
        fn = lambda t: eo.dispatch(op, t, axis=axis, keepdims=keepdims)  # noqa: E731
    assert eo.gradcheck(fn, x)


def test_float16_relu_matches_float32_relu_bit_for_bit():
    values = np.array([-np.inf, -2.5, -0.0, 0.0, 1e-7, 0.5, 65504.0, np.inf, np.nan], np.float16)
    x = eo.tensor(values, requires_grad=True)
    y = eo.relu(x)
    expected = np.maximum(values.astype(np.float32), 0).astype(np.float16)
    np.testing.assert_array_equal(y.data.view(np.int16)[:-1], expected.view(np.int16)[:-1])
    assert np.isnan(y.data[-1]) and y.dtype == "float16"
    y.backward(np.ones(9, np.float16))
    # the gradient passes where not x <= 0: NaN included, as in PyTorch
    np.testing.assert_array_equal(x.grad, (~(values <= 0)).astype(np.float16))


def test_float16_affine_adds_the_bias_before_its_single_rounding():
    rng = np.random.default_rng(3)
    a = rng.standard_normal((4, 8)).astype(np.float16)
    b = rng.standard_normal((8, 3)).astype(np.float16)
    bias = rng.standard_normal(3).astype(np.float16)
    out = eo.matmul(eo.tensor(a), eo.tensor(b), bias=eo.tensor(bias))
    exact = a.astype(np.float64) @ b.astype(np.float64) + bias.astype(np.float64)
    np.testing.assert_array_equal(out.data, exact.astype(np.float32).astype(np.float16))


def test_a_tensor_consumed_directly_and_through_another_op_gets_every_contribution():
    # Regression: the engine once propagated b's gradient before a's contribution arrived.
    x = eo.tensor([1.0], requires_grad=True)
    b = x * 2
    a = b * 3
    (b + a).sum().backward()
    np.testing.assert_allclose(x.grad, [8.0])


def test_residual_chains_match_numerical_gradients():
    def residual_stack(x):
        h = x
        for _ in range(4):
            h = h + eo.tanh(h * 0.7) * h
        return h * x

    assert eo.gradcheck(residual_stack, np.random.default_rng(0).standard_normal((2, 3)))


def test_np_array_of_a_tensor_is_a_copy_while_asarray_shares():
    # Regression: __array__ ignored NumPy 2's copy= request, so np.array(t) aliased t.data.
    t = eo.tensor([1.0, 2.0])
    copied = np.array(t)
    copied[0] = 99.0
    assert t.data.tolist() == [1.0, 2.0]
    assert np.asarray(t) is t.data
    widened = np.array(t, dtype=np.float64)
    widened[1] = 7.0
    assert widened.dtype == np.float64 and t.data.tolist() == [1.0, 2.0]
    with pytest.raises(ValueError, match="copy"):
        np.array(t, dtype=np.float64, copy=False)


def test_a_scalar_takes_the_dtype_of_the_floating_operand_not_of_a_mask():
    # Regression: a bool condition tensor set the scalar's dtype, so the float16 branch was
    # widened to float32 (and a float64 one kept float64 only by NumPy's promotion).
    for dtype in ("float16", "float32", "float64"):
        x = eo.tensor([-1.0, 2.0], dtype=dtype, requires_grad=True)
        y = eo.where(x > 0, x, 0.0)
        assert y.dtype == dtype
        y.sum().backward()
        assert x.grad.tolist() == [0.0, 1.0]
    assert eo.where(eo.tensor([True, False]), 1.5, eo.ones(2, dtype="float16")).dtype == "float16"


@pytest.mark.parametrize("op", ["sum", "mean", "max", "min", "var"])
def test_reduction_axis_out_of_range_is_an_error_not_a_wrapped_axis(op):
    # Regression: axes were taken modulo ndim, so x.sum(axis=2) on a 2-D tensor summed axis 0.
    x = eo.ones(2, 3)
    for axis in (2, -3, (0, 2)):
        with pytest.raises(eo.EveryOError, match=rf"{op}: axis .* out of range for shape \(2, 3\)"):
            eo.dispatch(op, x, axis=axis)
    assert eo.dispatch(op, x, axis=-2).shape == (3,)
    assert eo.dispatch(op, eo.tensor(2.0), axis=0).item() == (0.0 if op == "var" else 2.0)


def test_float16_relu_propagates_nans_of_either_sign():
    # Regression: inf - inf gives a NaN with its sign bit set on x86; ReLU through the int16
    # view turned it into 0, where float32 ReLU (and PyTorch) keeps the NaN.
    inf = np.array([np.inf], np.float16)
    with np.errstate(invalid="ignore"):
        negative_nan = inf - inf
    values = np.concatenate([negative_nan, -negative_nan, np.array([-1.0, 2.0], np.float16)])
    assert np.signbit(values[0]) and not np.signbit(values[1])
    out = eo.relu(eo.tensor(values)).data
    assert np.isnan(out[:2]).all() and out[2:].tolist() == [0.0, 2.0]


def test_arange_with_only_an_end_honours_the_step():
    # Regression: eo.arange(10, step=3) ignored the step (np.arange(10)).
    assert eo.arange(10, step=3).data.tolist() == [0, 3, 6, 9]
    assert eo.arange(1.0, step=0.25).data.tolist() == [0.0, 0.25, 0.5, 0.75]
    assert eo.arange(1.0, step=0.25).dtype == "float32"
    assert eo.arange(3).data.tolist() == [0, 1, 2]


@pytest.mark.parametrize("name", ["exp", "log", "sqrt", "tanh", "sigmoid", "softmax",
                                  "log_softmax", "mean", "var"])
def test_floating_ops_on_integer_tensors_give_the_default_float(name):
    # Regression: sigmoid of an int tensor cast its result back to int (all zeros); the other
    # ops returned float64 where an int tensor meeting a float gives float32 elsewhere.
    ints = np.array([[1, 2], [3, 5]])
    out = getattr(eo, name)(eo.tensor(ints))
    expected = getattr(eo, name)(eo.tensor(ints.astype(np.float32)))
    assert out.dtype == "float32"
    np.testing.assert_array_equal(out.data, expected.data)


def test_true_division_of_integer_tensors_gives_the_default_float():
    ints = eo.tensor([1, 2, 3])
    for quotient in (ints / 2, ints / ints, 3 / ints, ints / 2.0):
        assert quotient.dtype == "float32"
    np.testing.assert_array_equal((ints / 2).data, np.array([0.5, 1.0, 1.5], np.float32))
    assert (eo.tensor(np.array([1.0, 2.0])) / 2).dtype == "float64"  # floats keep their dtype


def test_flatten_and_squeeze_axes_follow_pytorch():
    x = eo.zeros(3, 1, 4, 1)
    assert x.flatten(-4).shape == (12,) and x.flatten(2).shape == (3, 1, 4)
    # a start axis past the end used to keep every axis and append one of length 1
    with pytest.raises(eo.EveryOError, match="flatten: axis 4 is out of range"):
        x.flatten(4)
    # PyTorch keeps a named axis whose length is not 1 (NumPy raised ValueError)
    assert x.squeeze(0).shape == (3, 1, 4, 1)
    assert x.squeeze((0, 1)).shape == (3, 4, 1)
    with pytest.raises(eo.EveryOError, match="axis 4 is out of range"):
        x.squeeze(4)
