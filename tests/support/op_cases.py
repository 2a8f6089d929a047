"""One table of every core op, shared by the gradcheck and the PyTorch-oracle tests.

Each case: (id, EveryO function, PyTorch function, input builders[, gradcheck options]). Inputs are chosen
away from non-differentiable points (no ties for max/min, positive values for log/sqrt/pow).
"""

from __future__ import annotations

import numpy as np

import everyo as eo
from support.convenience_cases import CONVENIENCE_CASES


def normal(*shape):
    return lambda rng: rng.standard_normal(shape)


def positive(*shape):
    return lambda rng: rng.uniform(0.5, 2.0, shape)


def away_from(*shape, points=(0.0,), gap=0.1):
    """Normal samples kept at least ``gap`` away from each kink in ``points``."""
    def build(rng):
        x = rng.standard_normal(shape)
        for p in points:
            x = np.where(np.abs(x - p) < gap, p + np.sign(x - p + 1e-12) * gap * 2, x)
        return x
    return build


def distinct(*shape):
    """Values with no ties, so max/min have a unique argmax."""
    return lambda rng: rng.permutation(int(np.prod(shape))).reshape(shape) / 3.0 + rng.uniform(0, .1, shape)


def _torch():
    import torch

    return torch


INT_INDEX = np.array([2, 0, 2, 1])

CASES = [
    ("add", lambda a, b: a + b, lambda a, b: a + b, [normal(3, 4), normal(3, 4)]),
    ("add_broadcast", lambda a, b: a + b, lambda a, b: a + b, [normal(2, 3, 4), normal(3, 1)]),
    ("radd_scalar", lambda a: 2.5 + a, lambda a: 2.5 + a, [normal(3)]),
    ("sub_broadcast", lambda a, b: a - b, lambda a, b: a - b, [normal(4, 1), normal(1, 5)]),
    ("rsub_scalar", lambda a: 1.0 - a, lambda a: 1.0 - a, [normal(3)]),
    ("mul_broadcast", lambda a, b: a * b, lambda a, b: a * b, [normal(2, 3), normal(3)]),
    ("mul_same_operand", lambda a: a * a, lambda a: a * a, [normal(5)]),
    ("div", lambda a, b: a / b, lambda a, b: a / b, [normal(3, 2), positive(3, 2)]),
    ("rdiv_scalar", lambda a: 2.0 / a, lambda a: 2.0 / a, [positive(4)]),
    ("pow_scalar", lambda a: a ** 3, lambda a: a ** 3, [normal(3, 2)]),
    ("pow_tensor", lambda a, b: a ** b, lambda a, b: a ** b, [positive(3, 2), normal(3, 2)]),
    ("rpow", lambda a: 2.0 ** a, lambda a: 2.0 ** a, [normal(3)]),
    ("neg", lambda a: -a, lambda a: -a, [normal(3, 2)]),
    ("abs", lambda a: abs(a), lambda a: abs(a), [away_from(3, 4)]),
    ("exp", eo.exp, lambda a: a.exp(), [normal(3, 4)]),
    ("log", eo.log, lambda a: a.log(), [positive(3, 4)]),
    ("sqrt", eo.sqrt, lambda a: a.sqrt(), [positive(3, 4)]),
    ("tanh", eo.tanh, lambda a: a.tanh(), [normal(3, 4)]),
    ("sigmoid", eo.sigmoid, lambda a: a.sigmoid(), [normal(3, 4)]),
    ("relu", eo.relu, lambda a: a.relu(), [away_from(3, 4)]),
    ("maximum", eo.maximum, lambda a, b: a.maximum(b), [distinct(3, 4), normal(4)]),
    ("minimum", eo.minimum, lambda a, b: a.minimum(b), [distinct(3, 4), normal(3, 1)]),
    ("clip", lambda a: eo.clip(a, -0.5, 0.7), lambda a: a.clip(-0.5, 0.7),
     [away_from(4, 3, points=(-0.5, 0.7), gap=0.05)]),
    ("where", lambda a, b: eo.where(a.data > 0, a, b),
     lambda a, b: _torch().where(a > 0, a, b),
     [normal(3, 4), normal(4)]),
    ("sum_all", lambda a: a.sum(), lambda a: a.sum(), [normal(3, 4)]),
    ("sum_axis", lambda a: a.sum(axis=1), lambda a: a.sum(dim=1), [normal(3, 4, 2)]),
    ("sum_axes_keepdims", lambda a: a.sum(axis=(0, 2), keepdims=True),
     lambda a: a.sum(dim=(0, 2), keepdim=True), [normal(3, 4, 2)]),
    ("mean_axis", lambda a: a.mean(axis=-1), lambda a: a.mean(dim=-1), [normal(3, 4)]),
    ("mean_all", lambda a: a.mean(), lambda a: a.mean(), [normal(2, 3)]),
    ("max_axis", lambda a: a.max(axis=0), lambda a: a.amax(dim=0), [distinct(3, 4)]),
    ("max_all", lambda a: a.max(), lambda a: a.amax(), [distinct(3, 4)]),
    ("min_axis_keepdims", lambda a: a.min(axis=1, keepdims=True),
     lambda a: a.amin(dim=1, keepdim=True), [distinct(3, 4)]),
    ("var_axis", lambda a: a.var(axis=1), lambda a: a.var(dim=1, unbiased=False), [normal(3, 5)]),
    ("var_ddof1", lambda a: eo.var(a, axis=0, ddof=1), lambda a: a.var(dim=0, unbiased=True),
     [normal(4, 3)]),
    ("reshape", lambda a: a.reshape(6, 2), lambda a: a.reshape(6, 2), [normal(3, 4)]),
    ("transpose", lambda a: a.transpose(2, 0, 1), lambda a: a.permute(2, 0, 1), [normal(2, 3, 4)]),
    ("T", lambda a: a.T, lambda a: a.T, [normal(3, 4)]),
    ("getitem_slice", lambda a: a[1:, ::2], lambda a: a[1:, ::2], [normal(4, 5)]),
    ("getitem_int_array", lambda a: a[INT_INDEX], lambda a: a[INT_INDEX.tolist()],
     [normal(3, 2)]),
    ("getitem_mixed", lambda a: a[INT_INDEX, 1], lambda a: a[INT_INDEX.tolist(), 1],
     [normal(3, 2)]),
    ("concatenate", lambda a, b: eo.concatenate([a, b, a], axis=1),
     lambda a, b: _torch().cat([a, b, a], dim=1), [normal(2, 3), normal(2, 1)]),
    ("stack", lambda a, b: eo.stack([a, b], axis=1),
     lambda a, b: _torch().stack([a, b], dim=1), [normal(2, 3), normal(2, 3)]),
    ("pad", lambda a: eo.pad(a, ((1, 0), (2, 1)), value=0.5),
     lambda a: _torch().nn.functional.pad(a, (2, 1, 1, 0), value=0.5), [normal(2, 3)]),
    ("pad_reflect_crop", lambda a: eo.pad(a, ((0, 0), (1, -1), (2, 1)), mode="reflect"),
     lambda a: _torch().nn.functional.pad(a, (2, 1, 1, -1), mode="reflect"), [normal(1, 3, 4)]),
    ("softmax", lambda a: eo.softmax(a, axis=-1), lambda a: a.softmax(dim=-1), [normal(3, 5)]),
    ("softmax_axis0", lambda a: eo.softmax(a, axis=0), lambda a: a.softmax(dim=0), [normal(3, 5)]),
    ("log_softmax", lambda a: eo.log_softmax(a), lambda a: a.log_softmax(dim=-1), [normal(3, 5)]),
    ("matmul", lambda a, b: a @ b, lambda a, b: a @ b, [normal(3, 4), normal(4, 2)]),
    ("matmul_batched", lambda a, b: a @ b, lambda a, b: a @ b, [normal(2, 3, 4), normal(2, 4, 5)]),
    ("matmul_broadcast_batch", lambda a, b: a @ b, lambda a, b: a @ b,
     [normal(2, 3, 4), normal(4, 5)]),
    ("matmul_broadcast_left", lambda a, b: a @ b, lambda a, b: a @ b,
     [normal(3, 4), normal(2, 4, 5)]),
    ("matmul_vec_mat", lambda a, b: a @ b, lambda a, b: a @ b, [normal(4), normal(4, 3)]),
    ("matmul_mat_vec", lambda a, b: a @ b, lambda a, b: a @ b, [normal(3, 4), normal(4)]),
    ("matmul_vec_vec", lambda a, b: a @ b, lambda a, b: a @ b, [normal(4), normal(4)]),
    ("matmul_bias", lambda a, b, c: eo.matmul(a, b, bias=c),
     lambda a, b, c: a @ b + c, [normal(2, 3, 4), normal(4, 5), normal(5)]),
    # NOTE: through float32 a 1e-6 step drowns in rounding; the map is linear, so a coarse
    # step is exact up to float32 rounding of the inputs.
    ("cast_roundtrip", lambda a: a.astype("float32").astype("float64") * 2,
     lambda a: a.float().double() * 2, [normal(3)], {"eps": 1e-2, "atol": 1e-5}),
]

CASES += CONVENIENCE_CASES
