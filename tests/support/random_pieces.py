"""Random model pieces shared by the random-composition export tests and the exporter's fuzzer:
each kind is (layers it owns, forward(x, layers)) on (batch, FEATURES) inputs, and the accuracy
rule an export of a composition must meet."""

from __future__ import annotations

import copy

import numpy as np

import everyo as eo
from support.onnx_models import consumers, model_outputs

FEATURES = 8
MASK = np.arange(FEATURES) % 3 == 0


def _reshape_round_trip(x):
    b = x.shape[0]
    return x.reshape(b, 2, FEATURES // 2).transpose(0, 2, 1).reshape(b, FEATURES)


# kind -> (layers it owns, forward(x, layers))
PIECES = {
    "linear": (lambda s: [eo.Linear(FEATURES, FEATURES, seed=s)], lambda x, ls: ls[0](x)),
    "relu_layer": (lambda s: [eo.ReLU()], lambda x, ls: ls[0](x)),
    "gelu_layer": (lambda s: [eo.GELU()], lambda x, ls: ls[0](x)),
    "layer_norm": (lambda s: [eo.LayerNorm(FEATURES)], lambda x, ls: ls[0](x)),
    "skip": (lambda s: [eo.Linear(FEATURES, FEATURES, seed=s)],
             lambda x, ls: x + eo.tanh(ls[0](x))),
    "concat": (lambda s: [eo.Linear(2 * FEATURES, FEATURES, seed=s)],
               lambda x, ls: ls[0](eo.concatenate([x, -x * 0.5], axis=-1))),
    "affine": (lambda s: [], lambda x, ls: x * 1.5 - 0.25),
    "softmax": (lambda s: [], lambda x, ls: eo.softmax(x, axis=-1) * float(FEATURES)),
    "log_softmax": (lambda s: [], lambda x, ls: eo.log_softmax(x, axis=-1)),
    "center": (lambda s: [], lambda x, ls: x - eo.mean(x, axis=-1, keepdims=True)),
    "scale_by_max": (lambda s: [],
                     lambda x, ls: x / (eo.max(eo.abs(x), axis=-1, keepdims=True) + 1.0)),
    "sum_feature": (lambda s: [], lambda x, ls: x + eo.sum(x, axis=1, keepdims=True) * 0.1),
    "reshape": (lambda s: [], lambda x, ls: _reshape_round_trip(x)),
    "slice_pad": (lambda s: [], lambda x, ls: eo.pad(x[:, 2:], ((0, 0), (0, 2)))),
    "index": (lambda s: [], lambda x, ls: x + x[:, -1:] - x[:, 0].reshape(x.shape[0], 1)),
    "stack": (lambda s: [], lambda x, ls: eo.sum(eo.stack([x, x * 0.5], axis=1), axis=1)),
    "clip": (lambda s: [], lambda x, ls: eo.clip(x, -1.0, 1.0)),
    "leaky": (lambda s: [], lambda x, ls: eo.maximum(x, 0.1 * x)),
    "bounded": (lambda s: [], lambda x, ls: eo.minimum(eo.exp(-eo.abs(x)), 0.9)),
    "log_sqrt": (lambda s: [], lambda x, ls: eo.log(eo.sqrt(x * x + 1.0))),
    "swish": (lambda s: [], lambda x, ls: x * eo.sigmoid(x)),
    "where": (lambda s: [], lambda x, ls: eo.where(eo.tensor(MASK), x, -x)),
    "power": (lambda s: [], lambda x, ls: (x * x + 1.0) ** 0.5),
    "variance": (lambda s: [], lambda x, ls: x / eo.sqrt(eo.var(x, axis=-1, keepdims=True) + 1)),
    "transpose_matmul": (lambda s: [], lambda x, ls: eo.matmul(x, x.T) @ x * 0.01),
}



class Piece(eo.Module):
    """One ``kind`` of ``table`` (kind -> (layers it owns, forward(x, layers)))."""

    def __init__(self, kind: str, seed: int, table=None):
        super().__init__()
        build, self.run = (PIECES if table is None else table)[kind]
        self.layers = eo.Sequential(*build(seed))

    def forward(self, x):
        return self.run(x, list(self.layers))


class Composition(eo.Module):
    """The pieces ``kinds`` of ``table`` (default: PIECES) applied in order."""

    def __init__(self, kinds, table=None):
        super().__init__()
        self.pieces = eo.Sequential(*[Piece(kind, seed, table)
                                      for seed, kind in enumerate(kinds)])

    def forward(self, x):
        return self.pieces(x)


def assert_as_accurate_as_the_model(model, path, sizes=(1, 3, 17)):
    """Both consumers are as close to the exact result (the model in float64) as the float32
    model itself is, up to 1e-5: a random composition can be ill-conditioned (a layer norm
    after a log-softmax amplifies float32 rounding), which no converter can undo, while a
    wrong conversion misses by far more."""
    exact = copy.deepcopy(model).to("float64")
    rng = np.random.default_rng(0)
    for size in sizes:
        batch = rng.standard_normal((size, FEATURES)).astype(np.float32)
        truth = model_outputs(exact, [batch.astype(np.float64)])[0]
        own_error = float(np.abs(model_outputs(model, [batch])[0] - truth).max())
        for consumer, run in consumers(path):
            error = float(np.abs(run({"input": batch})[0] - truth).max())
            assert error <= 1e-5 + 4 * own_error, (consumer, size, error, own_error)
