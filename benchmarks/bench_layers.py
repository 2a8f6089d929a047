"""Layer-breadth training steps: EveryO against PyTorch CPU, same models, same thread count.

- ``mobilenet_block``: depthwise 3x3 (groups=32, "same") + ReLU + pointwise 1x1 (32 -> 64) on
  (32, 32, 32, 32) NHWC.
- ``conv_transpose``: Conv2DTranspose 4x4 stride 2 "same", (16, 16, 16, 64) -> (16, 32, 32,
  32).
- ``conv1d``: Conv1D(64 -> 64, k=5, dilation 2, "same") over (32, 256, 64).
- ``bilstm``: bidirectional LSTM(32 -> 128) over 32 steps, batch 32, Linear(256 -> 10) on the
  last step, cross-entropy.

Targets (#25): every case <= 1x PyTorch.

The convolution cases use the mean square of the output as the loss (no target, so no layout
question); one step is forward, loss, backward and an SGD update, timed as in
bench_training.py (alternating blocks, median, ratio in the same run).

    python benchmarks/bench_layers.py --threads 1 [--quick] [--only conv1d]
"""

from __future__ import annotations

import os
import sys

import numpy as np

sys.path.insert(0, os.path.dirname(__file__))

from bench_training import Case, main


def _nchw(x):
    return np.ascontiguousarray(x.transpose(0, 3, 1, 2))


def _ncw(x):
    return np.ascontiguousarray(x.transpose(0, 2, 1))


def _mean_square(out, _target):
    return (out * out).mean()


def _batch(shape):
    def make(rng):
        return rng.standard_normal(shape).astype(np.float32), np.zeros(shape[0], np.int64)
    return make


def _mobilenet_everyo():
    import everyo as eo
    return eo.Sequential(eo.Conv2D(32, 32, 3, padding="same", groups=32, seed=0), eo.ReLU(),
                         eo.Conv2D(32, 64, 1, seed=1))


def _mobilenet_torch(torch):
    nn = torch.nn
    return nn.Sequential(nn.Conv2d(32, 32, 3, padding=1, groups=32), nn.ReLU(),
                         nn.Conv2d(32, 64, 1))


def _transpose_everyo():
    import everyo as eo
    return eo.Conv2DTranspose(64, 32, 4, stride=2, padding="same", seed=0)


def _transpose_torch(torch):
    return torch.nn.ConvTranspose2d(64, 32, 4, stride=2, padding=1)


def _conv1d_everyo():
    import everyo as eo
    return eo.Conv1D(64, 64, 5, dilation=2, padding="same", seed=0)


def _conv1d_torch(torch):
    return torch.nn.Conv1d(64, 64, 5, dilation=2, padding="same")


def _bilstm_everyo():
    import everyo as eo

    class LastStep(eo.Module):
        def forward(self, x):
            return x[:, -1]

    return eo.Sequential(eo.LSTM(32, 128, bidirectional=True, seed=0), LastStep(),
                         eo.Linear(256, 10, seed=1))


def _bilstm_torch(torch):
    class BiLSTMClassifier(torch.nn.Module):
        def __init__(self):
            super().__init__()
            self.lstm = torch.nn.LSTM(32, 128, batch_first=True, bidirectional=True)
            self.head = torch.nn.Linear(256, 10)

        def forward(self, x):
            return self.head(self.lstm(x)[0][:, -1])

    return BiLSTMClassifier()


def _sequence_batch(rng):
    return (rng.standard_normal((32, 32, 32)).astype(np.float32), rng.integers(0, 10, 32))


CASES = [
    Case("mobilenet_block", 1.0, _mobilenet_everyo, _mobilenet_torch, _batch((32, 32, 32, 32)),
         to_torch_layout=_nchw, everyo_loss=_mean_square, torch_loss=_mean_square,
         peer="PyTorch"),
    Case("conv_transpose", 1.0, _transpose_everyo, _transpose_torch, _batch((16, 16, 16, 64)),
         to_torch_layout=_nchw, everyo_loss=_mean_square, torch_loss=_mean_square,
         peer="PyTorch"),
    Case("conv1d", 1.0, _conv1d_everyo, _conv1d_torch, _batch((32, 256, 64)),
         to_torch_layout=_ncw, everyo_loss=_mean_square, torch_loss=_mean_square,
         peer="PyTorch"),
    Case("bilstm", 1.0, _bilstm_everyo, _bilstm_torch, _sequence_batch, peer="PyTorch"),
]


if __name__ == "__main__":
    main(CASES)
