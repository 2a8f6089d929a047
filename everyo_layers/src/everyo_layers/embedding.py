"""``Embedding``: a lookup table of learned vectors, indexed by integer token ids."""

from __future__ import annotations

import weakref

import numpy as np

from everyo import EveryOError, Module, Op, Parameter, Tensor, dispatch
from everyo_layers.checks import argument, optional_argument
from everyo_layers.initializers import layer_generator

# The Parameters Embeddings hold as their (num_embeddings, dim) tables, by id (weakly: a dead
# table leaves, so an id is never reused). A Linear refuses one assigned as its weight, square
# too: the table is PyTorch's (out, in) layout, and its shape alone cannot say so.
_TABLES: weakref.WeakValueDictionary = weakref.WeakValueDictionary()


def is_embedding_table(param) -> bool:
    """Whether ``param`` is (or was) an ``Embedding``'s weight."""
    return _TABLES.get(id(param)) is param


def scatter_add_rows(indices: np.ndarray, rows: np.ndarray, num_rows: int) -> np.ndarray:
    """``out[indices[j]] += rows[j]`` for every j, into a zero ``(num_rows, dim)`` array.

    NOTE: sorting the ids and summing each run with ``np.add.reduceat`` is several times
    faster than ``np.add.at`` on 2-D rows, and exact for repeated ids.

    Example:
        >>> scatter_add_rows(np.array([2, 0, 2]), np.ones((3, 2)), 3)[:, 0]
        array([1., 0., 2.])
    """
    out = np.zeros((num_rows, rows.shape[-1]), rows.dtype)
    if indices.size == 0:
        return out
    order = np.argsort(indices, kind="stable")
    sorted_ids = indices[order]
    starts = np.flatnonzero(np.r_[True, sorted_ids[1:] != sorted_ids[:-1]])
    # NOTE: a frequent id sums many rows; float16 would lose them, so those sum in float32.
    ordered = rows[order].astype(np.promote_types(rows.dtype, np.float32), copy=False)
    out[sorted_ids[starts]] = np.add.reduceat(ordered, starts, axis=0)
    return out


class EmbeddingOp(Op):
    """``weight[indices]``; the gradient adds each output row into its table row.

    Operand ``weight`` ``(num, dim)``; attrs ``indices`` (integer array, validated by the
    layer) and ``padding_idx`` (a row that never receives a gradient, or None).
    """

    __slots__ = ("indices", "num_rows", "padding_idx")
    saved_attributes = ("indices",)  # (the layer's ids: writing them after forward is refused)

    def forward(self, weight, indices, padding_idx=None):
        self.indices, self.num_rows, self.padding_idx = indices, weight.shape[0], padding_idx
        return weight[indices]

    def backward(self, g):
        flat = self.indices.reshape(-1)
        grad = scatter_add_rows(flat, g.reshape(flat.size, g.shape[-1]), self.num_rows)
        if self.padding_idx is not None:
            grad[self.padding_idx] = 0
        return (grad,)

    def composite(self, weight):
        """``weight[indices]`` with differentiable ops; the padding row gets no gradient."""
        if self.padding_idx is not None:
            frozen = np.zeros((self.num_rows, 1), bool)
            frozen[self.padding_idx] = True
            weight = dispatch("where", frozen, weight.detach(), weight)
        return dispatch("getitem", weight, index=self.indices)


def _index_array(layer: str, indices, num: int) -> np.ndarray:
    """The integer ids behind ``indices``, or an error naming what is wrong with them."""
    data = indices.data if isinstance(indices, Tensor) else np.asarray(indices)
    if data.dtype.kind not in "iu":
        raise EveryOError(f"{layer}: expected integer token ids, got {data.dtype.name} "
                          f"(shape {data.shape}); convert them with .astype('int64')")
    if data.size and (data.min() < 0 or data.max() >= num):
        bad = data[(data < 0) | (data >= num)].reshape(-1)[0]
        raise EveryOError(f"{layer}: index {int(bad)} is out of range: ids must be in "
                          f"[0, {num})")
    return data


class Embedding(Module):
    """A table of ``num_embeddings`` learned vectors of size ``embedding_dim``.

    Args:
        num_embeddings: number of rows (the vocabulary size); ids must be in [0, num).
        embedding_dim: size of each vector.
        padding_idx: optional id whose row starts at zero and never receives a gradient.
        seed: seed of the initialisation (standard normal, as PyTorch).

    Input: integer ids of any shape; output: that shape plus ``(embedding_dim,)``.

    Example:
        >>> import everyo as eo, numpy as np
        >>> emb = eo.Embedding(10, 4, seed=0)
        >>> emb(np.array([[1, 2, 3], [4, 5, 6]])).shape
        (2, 3, 4)
    """

    onnx_export = "refused"

    def __init__(self, num_embeddings: int, embedding_dim: int, padding_idx=None, seed=None):
        super().__init__()
        num_embeddings = argument("Embedding", "num_embeddings", num_embeddings, "positive int")
        embedding_dim = argument("Embedding", "embedding_dim", embedding_dim, "positive int")
        self.num_embeddings, self.embedding_dim = num_embeddings, embedding_dim
        padding_idx = optional_argument("Embedding", "padding_idx", padding_idx, "int")
        if padding_idx is not None and not 0 <= padding_idx < num_embeddings:
            raise EveryOError(f"Embedding: padding_idx {padding_idx} is not in "
                              f"[0, {num_embeddings})")
        self.padding_idx = padding_idx
        table = layer_generator(seed).standard_normal((num_embeddings, embedding_dim))
        if padding_idx is not None:
            table[padding_idx] = 0
        self.weight = Parameter(table.astype(np.float32))

    def __setattr__(self, name: str, value) -> None:
        super().__setattr__(name, value)
        if name == "weight" and isinstance(value, Parameter):
            _TABLES[id(value)] = value

    def __setstate__(self, state: dict) -> None:  # a copy's or an unpickled table is one too
        self.__dict__.update(state)
        if isinstance(state.get("weight"), Parameter):
            _TABLES[id(state["weight"])] = state["weight"]

    @property
    def label(self) -> str:
        return f"Embedding({self.num_embeddings}, {self.embedding_dim})"

    def forward(self, indices):
        ids = _index_array(self.label, indices, self.num_embeddings)
        return dispatch("embedding", self.weight, indices=ids, padding_idx=self.padding_idx)

    def extra_repr(self) -> str:
        pad = "" if self.padding_idx is None else f", padding_idx={self.padding_idx}"
        return f"{self.num_embeddings}, {self.embedding_dim}{pad}"


OPS = {"embedding": EmbeddingOp}
LAYERS = {"Embedding": Embedding}
