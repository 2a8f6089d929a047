"""Sequence-model training steps: EveryO against PyTorch CPU, same models, same thread count.

- ``lstm``: LSTM(32 -> 128) over 32 steps, batch 32, then Linear(128 -> 10) on the last step,
  cross-entropy. Target <= 1x the fastest peer (PyTorch, JAX).
- ``transformer``: one encoder layer (d_model 128, 4 heads, feed-forward 256, dropout 0.1,
  post-norm) on (batch 16, seq 64, 128), MSE against a random target. Target <= 1x the
  fastest peer.

One step is forward, loss, backward and an SGD update; the timing (alternating EveryO and
PyTorch blocks, median, ratio) and the command line are bench_training.py's.

    python benchmarks/bench_sequence.py [--quick] [--threads N] [--only lstm]
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from bench_training import Case, main

SEQ, FEATURES, HIDDEN, BATCH = 32, 32, 128, 32
D_MODEL, HEADS, FF, T_SEQ, T_BATCH = 128, 4, 256, 64, 16


def _lstm_everyo():
    import everyo as eo

    class LastStep(eo.Module):
        def forward(self, x):
            return x[:, -1]

    return eo.Sequential(eo.LSTM(FEATURES, HIDDEN, seed=0), LastStep(), eo.Linear(HIDDEN, 10, seed=1))


def _lstm_torch(torch):
    class LSTMClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(FEATURES, HIDDEN, batch_first=True)
            self.head = torch.nn.Linear(HIDDEN, 10)

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])

    return LSTMClassifier()


def _lstm_batch(rng):
    return (rng.standard_normal((BATCH, SEQ, FEATURES)).astype(np.float32),
            rng.integers(0, 10, BATCH))


def _transformer_everyo():
    import everyo as eo
    return eo.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, batch_first=True, seed=0)


def _transformer_torch(torch):
    return torch.nn.TransformerEncoderLayer(D_MODEL, HEADS, dim_feedforward=FF, batch_first=True)


def _regression_batch(rng):
    shape = (T_BATCH, T_SEQ, D_MODEL)
    return (rng.standard_normal(shape).astype(np.float32),
            rng.standard_normal(shape).astype(np.float32))


def _everyo_mse(out, target):
    err = out - target
    return (err * err).mean()


def _torch_mse(out, target):
    import torch
    return torch.nn.functional.mse_loss(out, target)


CASES = [
    Case("lstm", 1.0, _lstm_everyo, _lstm_torch, _lstm_batch),
    Case("transformer", 1.0, _transformer_everyo, _transformer_torch, _regression_batch,
         everyo_loss=_everyo_mse, torch_loss=_torch_mse),
]


if __name__ == "__main__":
    main(CASES)
