"""Tensor conveniences beyond the shared gradient/PyTorch table: argmax/argmin, second
derivatives through composites, and bad input."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def test_argmax_argmin_match_pytorch(torch):
    a = np.random.default_rng(0).standard_normal((3, 4, 5))
    t = torch.tensor(a)
    for axis in (None, 0, -1):
        for keepdims in (False, True):
            if axis is None and keepdims:
                continue
            ours = eo.argmax(eo.tensor(a), axis=axis, keepdims=keepdims)
            theirs = t.argmax() if axis is None else t.argmax(dim=axis, keepdim=keepdims)
            np.testing.assert_array_equal(ours.data, theirs.numpy())
            ours = eo.tensor(a).argmin(axis=axis, keepdims=keepdims)
            theirs = t.argmin() if axis is None else t.argmin(dim=axis, keepdim=keepdims)
            np.testing.assert_array_equal(ours.data, theirs.numpy())


def test_split_chunk_shapes_match_pytorch(torch):
    for x in (np.zeros((7, 3)), np.zeros((0, 3))):  # an empty axis: `n` empty chunks
        for n in (1, 2, 3, 7, 9):
            assert [p.shape for p in eo.split(eo.tensor(x), n)] == [
                tuple(p.shape) for p in torch.tensor(x).split(n)]
            assert [p.shape for p in eo.chunk(eo.tensor(x), n)] == [
                tuple(p.shape) for p in torch.tensor(x).chunk(n)]


def test_causal_mask_attention_pattern_matches_pytorch(torch):
    # the pattern ported GPT code uses: masked_fill with a tril mask, softmax, einsum
    rng = np.random.default_rng(2)
    q, k = rng.standard_normal((2, 4, 8)), rng.standard_normal((2, 4, 8))
    mask = np.tril(np.ones((4, 4), bool))
    ours_q, ours_k = eo.tensor(q, requires_grad=True), eo.tensor(k, requires_grad=True)
    scores = eo.einsum("bqd,bkd->bqk", ours_q, ours_k).masked_fill(~mask, -np.inf)
    out = eo.softmax(scores, axis=-1)
    tq, tk = torch.tensor(q, requires_grad=True), torch.tensor(k, requires_grad=True)
    ref = torch.einsum("bqd,bkd->bqk", tq, tk).masked_fill(~torch.tensor(mask), float("-inf"))
    ref = ref.softmax(-1)
    np.testing.assert_allclose(out.data, ref.detach().numpy(), rtol=1e-12, atol=1e-14)
    (out * eo.tensor(np.arange(32.0).reshape(2, 4, 4))).sum().backward()
    (ref * torch.arange(32.0, dtype=torch.float64).reshape(2, 4, 4)).sum().backward()
    np.testing.assert_allclose(ours_q.grad, tq.grad.numpy(), rtol=1e-10, atol=1e-12)
    np.testing.assert_allclose(ours_k.grad, tk.grad.numpy(), rtol=1e-10, atol=1e-12)


def test_bad_input_is_named():
    x = eo.zeros(4, 3)
    with pytest.raises(eo.EveryOError, match="do not add up to 4"):
        eo.split(x, [1, 2])
    with pytest.raises(eo.EveryOError, match="cannot expand shape"):
        eo.expand(x, 5, 3)
    with pytest.raises(eo.EveryOError, match="must be boolean"):
        eo.masked_fill(x, np.zeros((4, 3)), 1.0)
    with pytest.raises(eo.EveryOError, match=r"index values must be in \[0, 3\)"):
        eo.gather(x, 1, np.array([[3], [0], [0], [0]]))
    with pytest.raises(eo.EveryOError, match="at least 2 axes"):
        eo.tril(eo.zeros(3))
    with pytest.raises(eo.EveryOError, match="subscripts 'ij' name 2 axes"):
        eo.einsum("ij->i", eo.zeros(3))
    with pytest.raises(eo.EveryOError, match="axis 2 is out of range"):
        eo.cumsum(x, 2)


def test_masked_fill_with_a_mask_that_does_not_broadcast_is_named():
    # np.broadcast_shapes raised its own ValueError before the named check could run
    with pytest.raises(eo.EveryOError, match=r"mask shape \(2,\) does not broadcast"):
        eo.masked_fill(eo.zeros(3, 4), np.array([True, False]), -1.0)


def test_gather_refuses_negative_indices_as_pytorch_does():
    # NumPy indexing wrapped -1 around to the last element: a silent value PyTorch refuses
    with pytest.raises(eo.EveryOError, match=r"index values must be in \[0, 4\)"):
        eo.gather(eo.zeros(3, 4), 1, np.array([[-1], [0], [0]]))


@pytest.mark.parametrize("call", [
    lambda x: eo.split(x, 1.5),
    lambda x: eo.split(x, 2.0),
    lambda x: eo.split(x, True),
    lambda x: eo.split(x, [1.5, 2.5]),
    lambda x: eo.chunk(x, 1.5),
])
def test_split_and_chunk_refuse_a_non_integer_size(call):
    with pytest.raises(eo.EveryOError, match=r"(split|chunk): .* must be an int, got"):
        call(eo.zeros(4, 2))


def test_split_accepts_numpy_integers():
    assert [p.shape for p in eo.split(eo.zeros(5, 2), np.int64(2))] == [(2, 2), (2, 2), (1, 2)]


@pytest.mark.parametrize("dtype, value", [
    ("int32", 1.5), ("int32", -2.7), ("int32", 7), ("int64", 2.5), ("int32", np.float64(2.5)),
    ("int32", True), ("float32", 3), ("float16", 2.0), ("float32", -np.inf), ("bool", 1),
])
@pytest.mark.parametrize("tensor_mask", [False, True])
def test_masked_fill_keeps_the_tensors_dtype_as_pytorch_does(torch, dtype, value, tensor_mask):
    data, mask = np.array([[1, 2, 3], [4, 5, 6]]).astype(dtype), np.array([True, False, True])
    ours = eo.masked_fill(eo.tensor(data), eo.tensor(mask) if tensor_mask else mask, value)
    ref = torch.tensor(data).masked_fill(torch.tensor(mask), value.item()
                                         if isinstance(value, np.generic) else value)
    assert ours.dtype == str(ref.dtype).removeprefix("torch.")
    np.testing.assert_array_equal(ours.data, ref.numpy())


def test_masked_fill_with_a_tensor_mask_keeps_int32():
    x = eo.tensor(np.arange(4, dtype=np.int32))
    out = x.masked_fill(x > 1, 9)
    assert out.dtype == "int32" and out.data.tolist() == [0, 1, 9, 9]


@pytest.mark.parametrize("dtype, value, problem", [
    ("int32", np.inf, "cannot be stored in a int32"),
    ("int8", 200, r"outside the range of int8 \(-128..127\)"),
    ("uint8", -1, r"outside the range of uint8 \(0..255\)"),
    ("float16", 1e6, "overflows float16"),
    ("float32", "a", "value must be a number or a Tensor"),
])
def test_masked_fill_refuses_a_value_the_dtype_cannot_hold(dtype, value, problem):
    with pytest.raises(eo.EveryOError, match=problem):
        eo.masked_fill(eo.tensor(np.zeros(3, dtype)), np.array([True, False, True]), value)


def test_masked_fill_with_a_tensor_value_is_cast_and_stays_differentiable():
    x = eo.tensor(np.zeros(3, np.float32), requires_grad=True)
    value = eo.tensor(np.float64(2.0), requires_grad=True)
    out = x.masked_fill(np.array([True, False, True]), value)
    assert out.dtype == "float32"
    out.sum().backward()
    assert value.grad.dtype == np.float64 and float(value.grad) == 2.0
