"""Weight tying between layers of different layouts: ``Linear.tie_weight`` uses an Embedding's
``(num, dim)`` table transposed (PyTorch's ``decoder.weight = encoder.weight``)."""

from __future__ import annotations

import copy
import pickle

import numpy as np
import pytest

import everyo as eo


def test_a_tied_decoder_matches_pytorch_forward_and_gradient():
    torch = pytest.importorskip("torch")
    torch.manual_seed(0)
    t_encoder, t_decoder = torch.nn.Embedding(11, 4).double(), torch.nn.Linear(4, 11).double()
    t_decoder.weight = t_encoder.weight
    encoder, decoder = eo.Embedding(11, 4).double(), eo.Linear(4, 11).double()
    decoder.tie_weight(encoder.weight)
    assert decoder.weight is encoder.weight and decoder.weight_transposed
    encoder.weight.data[...] = t_encoder.weight.detach().numpy()
    decoder.bias.data[...] = t_decoder.bias.detach().numpy()
    tokens = np.array([[1, 2, 3], [4, 4, 10]])
    ours = decoder(encoder(tokens))
    theirs = t_decoder(t_encoder(torch.tensor(tokens)))
    np.testing.assert_allclose(ours.data, theirs.detach().numpy(), rtol=1e-12, atol=1e-12)
    g = np.random.default_rng(0).standard_normal(ours.shape)
    ours.backward(g)
    theirs.backward(torch.tensor(g))
    np.testing.assert_allclose(encoder.weight.grad, t_encoder.weight.grad.numpy(),
                               rtol=1e-12, atol=1e-12)
    model = eo.Sequential(encoder, decoder)
    assert list(model.state_dict()) == ["0.weight", "1.bias"]  # the table once
    assert len(list(model.parameters())) == 2


def test_a_tied_weight_gets_numerical_gradients():
    encoder, decoder = eo.Embedding(5, 3).double(), eo.Linear(3, 5).double()
    decoder.tie_weight(encoder.weight)
    x = np.random.default_rng(1).standard_normal((2, 3))
    assert eo.gradcheck(lambda w: eo.matmul(x, w.swapaxes(0, 1)), encoder.weight.data)
    assert eo.gradcheck(lambda h: decoder(h), x)


def test_shapes_that_cannot_tie_are_refused_saying_how():
    encoder, decoder = eo.Embedding(10, 4), eo.Linear(4, 10)
    with pytest.raises(eo.EveryOError, match=r"shape \(10, 4\).*use layer.tie_weight"):
        decoder.weight = encoder.weight
    with pytest.raises(eo.EveryOError, match=r"cannot tie a Parameter of shape \(10, 5\)"):
        decoder.tie_weight(eo.Embedding(10, 5).weight)
    with pytest.raises(eo.EveryOError, match="square"):
        eo.Linear(4, 4).tie_weight(eo.Embedding(4, 4).weight)
    square = eo.Linear(4, 4).tie_weight(eo.Embedding(4, 4).weight, transposed=True)
    assert square.weight_transposed
    with pytest.raises(eo.EveryOError, match="expected a Parameter"):
        decoder.tie_weight(np.zeros((10, 4)))


def test_a_square_tables_assignment_is_refused_not_used_in_the_wrong_layout():
    """PyTorch's ``decoder.weight = encoder.weight`` with a square table: the shapes match, but
    the table is (out, in); used as EveryO's (in, out) it would be silently transposed."""
    encoder, decoder = eo.Embedding(4, 4), eo.Linear(4, 4)
    encoder.double()  # (a cast keeps the Parameter, so it is still known as a table)
    with pytest.raises(eo.EveryOError, match=r"Linear\(4→4\): the Parameter is an Embedding's "
                                             r"\(num_embeddings, embedding_dim\) table.*"
                                             r"tie_weight\(encoder.weight, transposed=True\)"):
        decoder.weight = encoder.weight
    replaced = eo.Parameter(np.zeros((4, 4)))
    encoder.weight = replaced  # a table set by assignment is one too
    with pytest.raises(eo.EveryOError, match="an Embedding's"):
        decoder.weight = replaced
    for copied in (copy.deepcopy(encoder), pickle.loads(pickle.dumps(encoder))):
        with pytest.raises(eo.EveryOError, match="an Embedding's"):
            decoder.weight = copied.weight
    other = eo.Linear(4, 4)
    other.weight = decoder.weight  # another Linear's square weight is shared as it is
    assert other.weight is decoder.weight and not other.weight_transposed


def test_plain_sharing_between_linears_keeps_the_layout():
    first, second = eo.Linear(3, 2), eo.Linear(3, 2)
    second.tie_weight(eo.Embedding(2, 3).weight)
    second.weight = first.weight
    assert second.weight is first.weight and not second.weight_transposed
    np.testing.assert_allclose(second(eo.ones(1, 3)).data - second.bias.data,
                               first(eo.ones(1, 3)).data - first.bias.data, rtol=1e-6)
