"""Embedding: scatter-add gradient (repeated ids), PyTorch oracle (first and second
derivatives) and index validation."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo
from everyo_layers.embedding import scatter_add_rows
from support.second_order import (
    F,
    T,
    normal,
    second_order_tests,
)


def test_gradcheck_with_repeated_ids(rng):
    emb = eo.Embedding(5, 3, seed=0).to("float64")
    ids = np.array([[0, 2, 2], [4, 0, 2]])  # repeats must add up

    assert eo.gradcheck(lambda: emb(ids), params=[emb.weight])


def test_scatter_add_matches_add_at(rng):
    ids = rng.integers(0, 50, size=400)
    rows = rng.standard_normal((400, 7))
    expected = np.zeros((60, 7))
    np.add.at(expected, ids, rows)
    np.testing.assert_allclose(scatter_add_rows(ids, rows, 60), expected, atol=1e-12)
    assert not scatter_add_rows(ids[:0], rows[:0], 3).any()


@pytest.mark.parametrize("padding_idx", [None, 1])
def test_matches_torch(torch, rng, padding_idx):
    emb = eo.Embedding(7, 4, padding_idx=padding_idx, seed=1).to("float64")
    ref = torch.nn.Embedding(7, 4, padding_idx=padding_idx).double()
    with torch.no_grad():
        ref.weight.copy_(torch.from_numpy(emb.weight.data))
    ids = rng.integers(0, 7, size=(3, 5))
    ids[0, :3] = 1
    out, ref_out = emb(ids), ref(torch.from_numpy(ids))
    np.testing.assert_array_equal(out.data, ref_out.detach().numpy())
    g = rng.standard_normal(out.shape)
    out.backward(g)
    ref_out.backward(torch.from_numpy(g))
    np.testing.assert_allclose(emb.weight.grad, ref.weight.grad.numpy(), atol=1e-12)
    if padding_idx is not None:
        assert not emb.weight.data[padding_idx].any() and not emb.weight.grad[padding_idx].any()


def test_accepts_tensors_and_lists_and_keeps_shape():
    emb = eo.Embedding(10, 6, seed=0)
    assert emb(eo.tensor([[1, 2, 3]])).shape == (1, 3, 6)
    assert emb([4, 5]).shape == (2, 6)
    assert emb(np.array(3, dtype=np.uint8)).shape == (6,)
    assert emb(np.array([1, 2])).dtype == "float32"


def test_bad_indices_are_clear_errors():
    emb = eo.Embedding(10, 6)
    with pytest.raises(eo.EveryOError, match=r"Embedding\(10, 6\): index 10 is out of range.*\[0, 10\)"):
        emb(np.array([[1, 10]]))
    with pytest.raises(eo.EveryOError, match="index -1 is out of range"):
        emb(np.array([-1, 2]))
    with pytest.raises(eo.EveryOError, match=r"integer token ids, got float32"):
        emb(eo.tensor([1.0, 2.0]))
    with pytest.raises(eo.EveryOError, match="padding_idx 12"):
        eo.Embedding(10, 6, padding_idx=12)


def test_trains_only_the_rows_it_saw():
    emb = eo.Embedding(4, 2, seed=0)
    before = emb.weight.data.copy()
    opt = eo.SGD(emb.parameters(), lr=0.5)
    emb(np.array([1, 1, 3])).sum().backward()
    opt.step()
    changed = np.any(emb.weight.data != before, axis=1)
    assert changed.tolist() == [False, True, False, True]
    np.testing.assert_allclose(before[1] - emb.weight.data[1], [1.0, 1.0])  # twice 0.5


def test_an_empty_batch_of_ids_gives_a_zero_gradient():
    # Regression: backward reshaped the gradient with -1, which NumPy refuses for 0 rows.
    emb = eo.Embedding(5, 3, seed=0)
    out = emb(np.zeros((2, 0), np.int64))
    assert out.shape == (2, 0, 3)
    out.sum().backward()
    assert emb.weight.grad.shape == (5, 3) and not emb.weight.grad.any()


TOKENS = np.array([[0, 2, 1], [3, 1, 1]])
SECOND_ORDER = [
    ("embedding",
     lambda w: eo.dispatch("embedding", w, indices=TOKENS) ** 2,
     lambda w: F().embedding(T().tensor(TOKENS), w) ** 2, [normal(4, 3)]),
]

test_second_derivatives_pass_gradgradcheck, test_second_derivatives_match_torch = (
    second_order_tests(SECOND_ORDER))


@pytest.mark.torch
def test_embedding_padding_row_gets_no_second_order_gradient_either(torch):
    w = eo.tensor(np.random.default_rng(0).standard_normal((4, 3)), requires_grad=True)
    out = eo.dispatch("embedding", w, indices=TOKENS, padding_idx=1)
    (g,) = eo.grad((out ** 2).sum(), w, create_graph=True)
    (gg,) = eo.grad((g ** 2).sum(), w)
    wt = torch.tensor(w.data, requires_grad=True)
    out_t = torch.nn.functional.embedding(torch.tensor(TOKENS), wt, padding_idx=1)
    (g_t,) = torch.autograd.grad((out_t ** 2).sum(), wt, create_graph=True)
    (gg_t,) = torch.autograd.grad((g_t ** 2).sum(), wt)
    np.testing.assert_allclose(g.data, g_t.detach().numpy(), rtol=1e-12)
    np.testing.assert_allclose(gg.data, gg_t.numpy(), rtol=1e-12)
    assert not gg.data[1].any()
