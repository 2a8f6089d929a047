"""The fused recurrent ops re-expressed step by step with differentiable core ops.

The engine differentiates these to give ``rnn``, ``lstm`` and ``gru`` second derivatives
(``create_graph=True``); they compute PyTorch's equations plainly (the fused LSTM's gate
reordering and pre-scaling are an implementation detail of its fast path, not of the maths).
They are also the reference the fused loops are tested against.
"""

from __future__ import annotations

from everyo import dispatch, stack


def _steps(x, batch_first: bool) -> list:
    """The input's time steps, each ``(batch, features)``."""
    count = x.shape[1] if batch_first else x.shape[0]
    return [x[:, t] if batch_first else x[t] for t in range(count)]


def _sequence(steps: list, batch_first: bool):
    return stack(steps, axis=1 if batch_first else 0)


def rnn_composite(x, h0, w_ih, w_hh, b_ih, b_hh, batch_first: bool, relu: bool):
    """``h_t = act(x_t W_ih + b_ih + h_{t-1} W_hh + b_hh)`` for every step."""
    h, outputs = h0, []
    for x_t in _steps(x, batch_first):
        pre = x_t @ w_ih + b_ih + h @ w_hh + b_hh
        h = dispatch("relu", pre) if relu else dispatch("tanh", pre)
        outputs.append(h)
    return _sequence(outputs, batch_first)


def lstm_composite(x, h0, c0, w_ih, w_hh, b_ih, b_hh, batch_first: bool):
    """PyTorch's LSTM (gates ``i, f, g, o``); the hidden states, then the final cell state."""
    H = h0.shape[-1]
    h, c, outputs = h0, c0, []
    for x_t in _steps(x, batch_first):
        pre = x_t @ w_ih + b_ih + h @ w_hh + b_hh
        i, f = dispatch("sigmoid", pre[:, :H]), dispatch("sigmoid", pre[:, H:2 * H])
        g, o = dispatch("tanh", pre[:, 2 * H:3 * H]), dispatch("sigmoid", pre[:, 3 * H:])
        c = f * c + i * g
        h = o * dispatch("tanh", c)
        outputs.append(h)
    return _sequence(outputs + [c], batch_first)


def gru_composite(x, h0, w_ih, w_hh, b_ih, b_hh, batch_first: bool):
    """PyTorch's GRU (gates ``r, z, n``, the reset gate on the hidden projection with its
    bias)."""
    H = h0.shape[-1]
    h, outputs = h0, []
    for x_t in _steps(x, batch_first):
        a = x_t @ w_ih + b_ih
        hp = h @ w_hh + b_hh
        r = dispatch("sigmoid", a[:, :H] + hp[:, :H])
        z = dispatch("sigmoid", a[:, H:2 * H] + hp[:, H:2 * H])
        n = dispatch("tanh", a[:, 2 * H:] + r * hp[:, 2 * H:])
        h = (1.0 - z) * n + z * h
        outputs.append(h)
    return _sequence(outputs, batch_first)
