"""Arrays an op keeps that are not operands (an index) are version-checked as operands are:
writing one in place after the forward raises at backward, instead of silently sending the
gradient elsewhere (PyTorch saves them as tensors and checks them the same way)."""

from __future__ import annotations

import numpy as np
import pytest

import everyo as eo


def _written_after_forward(forward, index, write=(0, 0), value=2):
    x = eo.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    y = forward(x, index)
    index[write] = value  # (through EveryO: the index's version moves)
    return x, y


CASES = {
    "gather": lambda x, index: eo.gather(x, 1, index),
    "getitem": lambda x, index: x[index],
    "getitem in a tuple": lambda x, index: x[index, 1:],
    "scatter_add": lambda x, index: eo.dispatch("scatter_add", x, axis=1, index=index,
                                                shape=(3, 4)),
}


@pytest.mark.parametrize("case", CASES)
@pytest.mark.parametrize("create_graph", [False, True])
def test_writing_an_index_after_the_forward_is_refused_at_backward(case, create_graph):
    index = eo.tensor(np.array([[0, 1, 2, 0], [1, 1, 0, 2], [2, 0, 0, 1]]))
    if case.startswith("getitem"):
        index = eo.tensor(np.array([0, 2]))
        write = (0,)
    else:
        write = (0, 0)
    x, y = _written_after_forward(CASES[case], index, write)
    with pytest.raises(eo.EveryOError, match="its index .* modified in place after the forward"):
        if create_graph:
            eo.grad(y.sum(), x, create_graph=True)
        else:
            y.sum().backward()


def test_an_index_written_before_the_forward_is_fine():
    index = eo.tensor(np.array([[0, 1], [1, 0], [3, 3]]))
    index[0, 0] = 2
    x = eo.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    eo.gather(x, 1, index).sum().backward()
    expected = np.zeros((3, 4))
    np.add.at(expected, (np.arange(3)[:, None], index.data), 1.0)
    np.testing.assert_array_equal(x.grad, expected)


def test_the_second_derivative_checks_the_index_too():
    index = eo.tensor(np.array([[0, 1], [1, 0], [3, 3]]))
    x = eo.tensor(np.arange(12.0).reshape(3, 4), requires_grad=True)
    (g,) = eo.grad((eo.gather(x, 1, index) ** 2).sum(), x, create_graph=True)
    index[0, 0] = 2  # after the first backward, before differentiating its graph
    with pytest.raises(eo.EveryOError, match="modified in place after the forward"):
        g.sum().backward()


@pytest.mark.parametrize("padding_idx", [None, 0])
def test_embedding_ids_written_after_the_forward_are_refused(padding_idx):
    embedding = eo.Embedding(5, 3, padding_idx=padding_idx, seed=0)
    ids = eo.tensor(np.array([[1, 2], [3, 1]]))
    out = embedding(ids)
    ids[0, 0] = 4
    with pytest.raises(eo.EveryOError, match="its indices .* modified in place after the forward"):
        out.sum().backward()


@pytest.mark.parametrize("loss, kept", [
    (lambda x, kept: eo.cross_entropy(x, kept), "target"),
    (lambda x, kept: eo.binary_cross_entropy_with_logits(x, eo.tensor(np.full((3, 4), 0.5)),
                                                         pos_weight=kept), "pos_weight"),
])
def test_a_loss_s_kept_float_array_written_after_the_forward_is_refused(loss, kept):
    # (probability targets and pos_weight are kept without a copy when the dtype matches)
    x = eo.tensor(np.linspace(-1.0, 1.0, 12).reshape(3, 4), requires_grad=True)
    array = eo.tensor(np.full((3, 4), 0.25) if kept == "target" else np.ones(4))
    out = loss(x, array)
    array[0] = 1.0
    with pytest.raises(eo.EveryOError, match=f"its {kept} .* modified in place after the forward"):
        out.backward()
