"""Tensor conveniences PyTorch code calls (issue 27, items 7 and 8): ``size()``, ``pow``,
``eo.full(size, value)``, ``.to("cpu")``, ``eo.diag``, ``eo.multinomial`` and the
``transpose(0, 1)`` decision."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import everyo as eo


def test_size_is_numpys_int_and_pytorchs_call(torch):
    x, t = eo.zeros(2, 3, 4), torch.zeros(2, 3, 4)
    assert x.size == 24 and isinstance(x.size, int) and x.size + 1 == 25
    assert x.size() == tuple(t.size()) == (2, 3, 4)
    assert [x.size(d) for d in (0, 1, -1)] == [t.size(d) for d in (0, 1, -1)]
    assert x.numel() == t.numel() and x.dim() == t.dim()
    assert pickle.loads(pickle.dumps(x.size)) == 24 and copy.deepcopy(x.size) == 24


@pytest.mark.parametrize("call, message", [
    (lambda: eo.zeros(2, 3).size(2), "size: axis 2 is out of range"),
    (lambda: eo.zeros(2, 3).size(True), "size: axis must be an int"),
    (lambda: eo.zeros(()).size(0), r"size\(0\): a 0-d tensor has no axes"),
])
def test_a_bad_size_axis_is_named(call, message):
    with pytest.raises(eo.EveryOError, match=message):
        call()


def test_pow_is_a_method():
    x = eo.tensor([1.0, 2.0, 3.0], requires_grad=True)
    x.pow(2).sum().backward()
    np.testing.assert_array_equal(x.grad, [2.0, 4.0, 6.0])


def test_to_accepts_the_cpu_as_a_no_op_and_keeps_its_dtype_forms(torch):
    x = eo.tensor([1.0, 2.0])
    assert x.to("cpu") is x and x.to(device="cpu") is x and x.to("cpu:0") is x
    assert x.to(torch.device("cpu")) is x
    assert x.to("cpu", "float64").dtype == "float64"
    assert x.to("float16").dtype == "float16" and x.to(dtype="bfloat16").dtype == "bfloat16"
    assert x.to(eo.zeros(1, dtype="float64")).dtype == "float64"
    assert x.to("cpu", non_blocking=True) is x
    with pytest.raises(eo.EveryOError, match="CPU only; device 'cuda:0'"):
        x.to("cuda:0")
    with pytest.raises(eo.EveryOError, match="unknown dtype 'gpu'"):
        x.to("gpu")


@pytest.mark.parametrize("shape, diagonal", [((3,), 0), ((3,), 2), ((2,), -1), ((3, 3), 0),
                                             ((3, 5), 1), ((3, 5), -1), ((5, 3), -2),
                                             ((4, 2), 0), ((2, 3), 5)])
def test_diag_matches_pytorch_forward_and_gradient(shape, diagonal, torch):
    a = np.random.default_rng(0).standard_normal(shape)
    x, t = eo.tensor(a, requires_grad=True), torch.tensor(a, requires_grad=True)
    out, expected = eo.diag(x, diagonal), torch.diag(t, diagonal)
    np.testing.assert_array_equal(out.data, expected.detach().numpy())
    weights = np.random.default_rng(1).standard_normal(out.shape)
    (out * weights).sum().backward()
    (expected * torch.tensor(weights)).sum().backward()
    np.testing.assert_array_equal(x.grad, t.grad.numpy())
    np.testing.assert_array_equal(x.diag(diagonal).data, out.data)  # the method


@pytest.mark.parametrize("shape, diagonal", [((3,), 1), ((3, 5), 1), ((5, 3), -2), ((2, 3), 5)])
def test_diag_has_second_derivatives(shape, diagonal):
    a = np.random.default_rng(2).standard_normal(shape)
    assert eo.gradgradcheck(lambda x: eo.diag(x, diagonal) ** 2, a)


@pytest.mark.parametrize("call, message", [
    (lambda: eo.diag(eo.zeros(2, 2, 2)), r"diag: needs a vector or a matrix .*\(2, 2, 2\)"),
    (lambda: eo.diag(eo.zeros(())), r"diag: needs a vector or a matrix"),
    (lambda: eo.diag(eo.zeros(3), 1.5), r"diag: diagonal must be an int, got 1.5"),
    (lambda: eo.diag(eo.zeros(3), True), r"diag: diagonal must be an int, got True"),
])
def test_bad_diag_input_is_named(call, message):
    with pytest.raises(eo.EveryOError, match=message):
        call()


def test_multinomial_is_seeded_by_manual_seed():
    probs = eo.tensor([[0.1, 0.2, 0.7], [0.5, 0.0, 0.5]])
    eo.manual_seed(3)
    first = eo.multinomial(probs, 5, replacement=True)
    eo.manual_seed(3)
    again = probs.multinomial(5, replacement=True)
    assert first.shape == (2, 5) and first.dtype == "int64"
    np.testing.assert_array_equal(first.data, again.data)
    assert not np.any(first.data[1] == 1)  # a zero weight is never drawn
    generator = np.random.default_rng(0)
    assert eo.multinomial(probs, 2, generator=generator).shape == (2, 2)


def test_multinomial_draws_the_weights_frequencies_and_without_replacement_no_repeats():
    eo.manual_seed(0)
    draws = eo.multinomial(eo.tensor([1.0, 3.0]), 20000, replacement=True).data
    assert abs(np.mean(draws == 1) - 0.75) < 0.02  # 6 standard deviations
    rows = eo.multinomial(eo.ones(50, 6), 6).data  # weights need not sum to 1
    assert all(sorted(row) == list(range(6)) for row in rows)


@pytest.mark.parametrize("call, message", [
    (lambda: eo.multinomial(eo.tensor([0.5, 0.5, 0.0]), 3), "cannot draw 3 samples without "
                                                             "replacement .* 2 non-zero"),
    (lambda: eo.multinomial(eo.tensor([-0.5, 1.0]), 1), "finite and non-negative"),
    (lambda: eo.multinomial(eo.tensor([np.nan, 1.0]), 1), "finite and non-negative"),
    (lambda: eo.multinomial(eo.tensor([0.0, 0.0]), 1), "positive sum"),
    (lambda: eo.multinomial(eo.tensor([1.0]), 0), "num_samples must be a positive int"),
    (lambda: eo.multinomial(eo.tensor([1.0]), 1.0), "num_samples must be a positive int"),
    (lambda: eo.multinomial(eo.zeros(2, 2, 2), 1), r"non-empty vector or matrix.*\(2, 2, 2\)"),
    (lambda: eo.multinomial(eo.tensor([1.0]), 1, replacement="yes"), "replacement must be"),
])
def test_bad_multinomial_input_is_named(call, message):
    with pytest.raises(eo.EveryOError, match=message):
        call()


def test_transpose_of_two_axes_is_never_a_silent_no_op(torch):
    x = eo.tensor(np.arange(6.0).reshape(2, 3))
    with pytest.raises(eo.EveryOError, match=r"identity permutation.*x\.swapaxes\(0, 1\)"):
        x.transpose(0, 1)
    with pytest.raises(eo.EveryOError, match=r"x\.swapaxes\(-2, -1\)"):
        x.transpose(-2, -1)
    with pytest.raises(eo.EveryOError, match=r"names 2 of the tensor's 3 axes.*swapaxes\(0, 2\)"):
        eo.zeros(2, 3, 4).transpose(0, 2)
    with pytest.raises(eo.EveryOError, match=r"names 2 of the tensor's 0 axes"):
        eo.tensor(1.0).transpose(0, 0)
    # where NumPy's and PyTorch's meanings agree, the swap works; a tuple is a permutation
    t = torch.tensor(x.data)
    np.testing.assert_array_equal(x.transpose(1, 0).data, t.transpose(1, 0).numpy())
    np.testing.assert_array_equal(x.swapaxes(0, 1).data, t.transpose(0, 1).numpy())
    assert x.transpose((0, 1)).shape == (2, 3) and x.transpose().shape == (3, 2)
    assert eo.transpose(x, (0, 1)).shape == (2, 3)
    assert eo.zeros(2, 3, 4).transpose(2, 0, 1).shape == (4, 2, 3)


def test_add_takes_pytorchs_alpha():
    x = eo.ones(3)
    assert x.add_(eo.tensor([1.0, 2.0, 3.0]), alpha=2) is x
    np.testing.assert_array_equal(x.data, [3.0, 5.0, 7.0])
    x.sub_(1.0, alpha=0.5)
    np.testing.assert_array_equal(x.data, [2.5, 4.5, 6.5])
    with pytest.raises(eo.EveryOError, match="add_: alpha must be a number"):
        x.add_(1.0, alpha="2")
