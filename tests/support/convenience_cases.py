"""Cases for the tensor conveniences (split, chunk, gather, einsum, ...), in the same form as
``op_cases.CASES``: (id, EveryO function, PyTorch function, input builders[, options])."""

from __future__ import annotations

import numpy as np

import everyo as eo


def normal(*shape):
    return lambda rng: rng.standard_normal(shape)


def _torch():
    import torch

    return torch


def _weighted_cat(pieces, cat):
    """Join pieces back, each scaled differently, so a mixed-up gradient shows."""
    return cat([p * float(i + 1) for i, p in enumerate(pieces)])


MASK = np.array([[True, False, False, True, False]])
GATHER_INDEX = np.array([[0, 4], [2, 2], [1, 3]])  # smaller than (4, 5) along axis 0; repeats

CONVENIENCE_CASES = [
    ("split_size", lambda a: _weighted_cat(a.split(2, axis=1), lambda p: eo.concatenate(p, 1)),
     lambda a: _weighted_cat(a.split(2, dim=1), lambda p: _torch().cat(p, 1)), [normal(3, 5)]),
    ("split_sections", lambda a: _weighted_cat(eo.split(a, [1, 3], axis=0), eo.concatenate),
     lambda a: _weighted_cat(a.split([1, 3], dim=0), _torch().cat), [normal(4, 2)]),
    ("chunk", lambda a: _weighted_cat(a.chunk(3, axis=-1), lambda p: eo.concatenate(p, -1)),
     lambda a: _weighted_cat(a.chunk(3, dim=-1), lambda p: _torch().cat(p, -1)),
     [normal(2, 7)]),
    ("view", lambda a: a.view(6, 2), lambda a: a.view(6, 2), [normal(3, 4)]),
    ("masked_fill", lambda a: a.masked_fill(MASK, -2.0),
     lambda a: a.masked_fill(_torch().tensor(MASK), -2.0), [normal(3, 5)]),
    ("tril", lambda a: a.tril(-1), lambda a: a.tril(-1), [normal(2, 3, 4)]),
    ("triu", lambda a: eo.triu(a, 1), lambda a: a.triu(1), [normal(4, 3)]),
    ("diag_vector", lambda a: eo.diag(a, 1), lambda a: _torch().diag(a, 1), [normal(3)]),
    ("diag_matrix", lambda a: a.diag(-1), lambda a: a.diag(-1), [normal(4, 3)]),
    ("diag_wide_matrix", lambda a: eo.diag(a, 2), lambda a: _torch().diag(a, 2), [normal(3, 5)]),
    ("pow_method", lambda a: a.pow(3), lambda a: a.pow(3), [normal(3, 2)]),
    ("unsqueeze", lambda a: eo.unsqueeze(a, -1), lambda a: a.unsqueeze(-1), [normal(3, 2)]),
    ("permute", lambda a: a.permute(0, 3, 1, 2), lambda a: a.permute(0, 3, 1, 2),
     [normal(2, 3, 4, 5)]),
    ("swapaxes", lambda a: a.swapaxes(0, -1), lambda a: a.transpose(0, -1), [normal(2, 3, 4)]),
    ("expand", lambda a: a.expand(2, 3, 4), lambda a: a.expand(2, 3, 4), [normal(3, 1)]),
    ("expand_keep", lambda a: eo.expand(a, 5, -1), lambda a: a.expand(5, -1), [normal(1, 3)]),
    ("gather", lambda a: eo.gather(a, 1, GATHER_INDEX),
     lambda a: _torch().gather(a, 1, _torch().tensor(GATHER_INDEX)), [normal(4, 5)]),
    ("gather_axis0", lambda a: a.gather(0, GATHER_INDEX.T % 4),
     lambda a: a.gather(0, _torch().tensor(GATHER_INDEX.T % 4)), [normal(4, 5)]),
    ("scatter_add", lambda a: eo.dispatch("scatter_add", a, axis=1, index=GATHER_INDEX,
                                          shape=(3, 6)),
     lambda a: _torch().zeros(3, 6, dtype=a.dtype).scatter_add(
         1, _torch().tensor(GATHER_INDEX), a), [normal(3, 2)]),
    ("cumsum", lambda a: a.cumsum(1), lambda a: a.cumsum(1), [normal(3, 4)]),
    ("cumsum_last", lambda a: eo.cumsum(a, -1), lambda a: a.cumsum(-1), [normal(2, 3, 4)]),
    ("einsum_bmm", lambda a, b: eo.einsum("bij,bjk->bik", a, b),
     lambda a, b: _torch().einsum("bij,bjk->bik", a, b), [normal(2, 3, 4), normal(2, 4, 5)]),
    ("einsum_outer", lambda a, b: eo.einsum("i,j->ij", a, b),
     lambda a, b: _torch().einsum("i,j->ij", a, b), [normal(3), normal(4)]),
    ("einsum_sum_out", lambda a, b: eo.einsum("ij,jk->i", a, b),
     lambda a, b: _torch().einsum("ij,jk->i", a, b), [normal(3, 4), normal(4, 2)]),
    ("einsum_diagonal", lambda a: eo.einsum("ii->i", a),
     lambda a: _torch().einsum("ii->i", a), [normal(4, 4)]),
    ("einsum_trace_implicit", lambda a: eo.einsum("ii", a),
     lambda a: _torch().einsum("ii", a), [normal(3, 3)]),
    ("einsum_ellipsis", lambda a, b: eo.einsum("...ij,jk->...ik", a, b),
     lambda a, b: _torch().einsum("...ij,jk->...ik", a, b), [normal(2, 3, 4), normal(4, 2)]),
    ("einsum_three", lambda a, b, c: eo.einsum("ij,jk,kl->il", a, b, c),
     lambda a, b, c: _torch().einsum("ij,jk,kl->il", a, b, c),
     [normal(2, 3), normal(3, 4), normal(4, 2)]),
    ("einsum_sum_only_in_operands", lambda a, b: eo.einsum("bij,jk->i", a, b),
     lambda a, b: _torch().einsum("bij,jk->i", a, b), [normal(2, 3, 4), normal(4, 5)]),
    ("einsum_broadcast_ellipsis", lambda a, b: eo.einsum("...ij,...jk->...ik", a, b),
     lambda a, b: _torch().einsum("...ij,...jk->...ik", a, b),
     [normal(2, 1, 3, 4), normal(5, 4, 2)]),
    ("einsum_implicit", lambda a, b: eo.einsum("ij,jk", a, b),
     lambda a, b: _torch().einsum("ij,jk", a, b), [normal(2, 3), normal(3, 4)]),
]
