"""Creation functions and shape arguments: PyTorch's forms, and bad input named (never a raw
NumPy or Python exception)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


@pytest.mark.parametrize("call, message", [
    (lambda: eo.ones(-1), r"ones: size -1 .*negative"),
    (lambda: eo.zeros(2, -3), r"zeros: size -3 .*negative"),
    (lambda: eo.zeros(2.5), r"zeros: sizes must be ints, got 2.5 \(float\)"),
    (lambda: eo.ones((2, True)), r"ones: sizes must be ints, got True \(bool\)"),
    (lambda: eo.randn(-2, seed=0), r"randn: size -2"),
    (lambda: eo.full((-1,), 0.5), r"full: size -1"),
    (lambda: eo.arange(0, 5, 0), r"arange: step must be non-zero"),
    (lambda: eo.arange(5, step=0), r"arange: step must be non-zero"),
    (lambda: eo.arange(0, float("nan")), r"arange: .*finite"),
    (lambda: eo.arange(0, float("inf")), r"arange: .*finite"),
    (lambda: eo.tensor([[1, 2], [3]]), r"tensor: .*ragged"),
    (lambda: eo.tensor(["a"]), r"tensor: .*not numeric.*str"),
    (lambda: eo.tensor([None]), r"tensor: .*not numeric"),
    (lambda: eo.Tensor(np.array(["a"])), r"Tensor: .*not numeric"),
    (lambda: eo.full((2,), "a"), r"full: .*not numeric"),
    (lambda: eo.zeros(2).reshape(2, -3), r"reshape: size -3"),
    (lambda: eo.zeros(2).reshape(-1, -1), r"reshape: only one size may be -1"),
    (lambda: eo.zeros(2).reshape(2.0), r"reshape: sizes must be ints"),
    (lambda: eo.zeros(2, 3).permute(0, 0.5), r"permute: axis must be an int"),
    (lambda: eo.zeros(2, 3).view((2,), 3), r"view: sizes must be ints, got \(2,\)"),
    # the porting functions' axes follow check_axis' rule: True is not axis 1
    (lambda: eo.zeros(2, 3).unsqueeze(True), r"unsqueeze: axis must be an int, got True"),
    (lambda: eo.split(eo.zeros(2, 3), 1, axis=True), r"split: axis must be an int, got True"),
    (lambda: eo.zeros(2, 3).swapaxes(0, 1.0), r"swapaxes: axis must be an int, got 1.0"),
    (lambda: eo.zeros(()).swapaxes(0, 0), r"swapaxes: axis 0 is out of range .* 0 axes"),
    # more than memory holds (NumPy's MemoryError or "array is too big" ValueError)
    (lambda: eo.ones(10**8, 10**8), r"ones: a float32 tensor of shape \(100000000, 100000000\) "
                                    r"needs 4e\+16 bytes"),
    (lambda: eo.zeros(10**10, 10**10), r"zeros: a float32 tensor of shape .* needs 4e\+20 bytes"),
    (lambda: eo.randn(10**8, 10**8), r"randn: a float32 tensor of shape .* needs"),
    (lambda: eo.rand(10**8, 10**8, seed=0), r"rand: a float32 tensor of shape .* needs"),
    (lambda: eo.arange(1e17), r"arange: .* needs"),
])
def test_bad_input_to_constructors_and_shape_arguments_is_named(call, message):
    with pytest.raises(eo.EveryOError, match=message):
        call()


@pytest.mark.parametrize("args", [(2, 3), ((2, 3),), ([2, 3],), (np.int64(2), 3)])
def test_sizes_as_varargs_or_one_sequence(args):
    for fn in (eo.zeros, eo.ones, eo.rand, eo.randn):
        assert fn(*args).shape == (2, 3)
    assert eo.zeros(6).reshape(*args).shape == (2, 3)
    assert eo.zeros(6).view(*args).shape == (2, 3)
    assert eo.zeros(1, 3).expand(*args).shape == (2, 3)


def test_empty_sizes_make_empty_or_0d_tensors():
    assert eo.zeros().shape == () and eo.zeros(()).shape == () and eo.zeros(0, 3).shape == (0, 3)


def test_arange_keeps_its_numpy_forms():
    np.testing.assert_array_equal(eo.arange(4).data, [0, 1, 2, 3])
    np.testing.assert_array_equal(eo.arange(1, 2, 0.5).data, np.array([1.0, 1.5], np.float32))
    np.testing.assert_array_equal(eo.arange(3, 0, -1).data, [3, 2, 1])


@pytest.mark.parametrize("dtype", ["float16", "bfloat16", "complex64", "bool", "int8"])
def test_numeric_dtypes_are_still_accepted(dtype):
    assert eo.tensor([1, 0], dtype=dtype).dtype == dtype


@pytest.mark.torch
def test_full_takes_pytorchs_positional_form(torch):
    for size in ((2, 3), [2, 3], (4,)):
        np.testing.assert_array_equal(eo.full(size, 0.5).data, torch.full(size, 0.5).numpy())
    assert eo.full(2, 3, fill_value=0.5).shape == (2, 3)  # EveryO's own form stays
    assert eo.full(4, 1.5).shape == (4,)
    assert eo.full((2,), 7, dtype="int32").dtype == "int32"
    for value in (True, 7, 2 ** 31 + 1, np.int32(3), 0.5, 1 + 2j):  # the fill's kind, as PyTorch
        expected = torch.full((2,), value)
        for ours in (eo.full((2,), value), eo.full(2, fill_value=value)):
            assert ours.dtype == str(expected.dtype).removeprefix("torch."), value
            np.testing.assert_array_equal(ours.data, expected.numpy())
    with pytest.raises(eo.EveryOError, match="full: .*fill value"):
        eo.full((2, 3))


@pytest.mark.torch
@pytest.mark.parametrize("shape, axis", [((0,), None), ((0, 3), 0), ((2, 0), 1), ((2, 0), None)])
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_the_argmax_of_nothing_is_named_as_pytorch_refuses_it(name, shape, axis, torch):
    with pytest.raises(IndexError):
        getattr(torch.zeros(shape), name)(**({} if axis is None else {"dim": axis}))
    with pytest.raises(eo.EveryOError, match=f"{name}: .*empty"):
        getattr(eo, name)(eo.zeros(*shape), axis=axis)


@pytest.mark.torch
@pytest.mark.parametrize("name", ["argmax", "argmin"])
def test_the_argmax_over_a_non_empty_axis_of_an_empty_tensor_is_empty(name, torch):
    assert getattr(eo.zeros(0, 3), name)(axis=1).shape == tuple(
        getattr(torch.zeros(0, 3), name)(dim=1).shape)


@pytest.mark.parametrize("draw", [lambda: eo.randn(3, 2), lambda: eo.rand(4),
                                  lambda: eo.randn_like(eo.zeros(2)),
                                  lambda: eo.rand_like(np.zeros(3))])
def test_unseeded_random_tensors_come_from_the_generator_manual_seed_seeds(draw):
    eo.manual_seed(5)
    first = draw().data
    eo.manual_seed(5)
    np.testing.assert_array_equal(draw().data, first)
    np.testing.assert_array_equal(eo.randn(3, seed=1).data, eo.randn(3, seed=1).data)
